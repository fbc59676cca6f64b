/* Disk space of a file-backed VM's RAM file (ram-space.ts says why): reserved whole while a guest may run on it, and
 * made sparse again while its agent sleeps: every range that reads as zero becomes a hole.
 *
 * Usage: ram-space reserve FILE | ram-space dig FILE. Prints `<allocated bytes before> <after>` and exits 0; 1 with a
 * message on stderr otherwise (`reserve` on a full filesystem says "No space left on device"). SIGTERM ends a dig
 * early (exit 0). Both put the file's atime and mtime back: a snapshot's fingerprint of the file (ram-file.ts)
 * includes its mtime, and its content has not changed.
 *
 * reserve: fallocate mode 0 over the whole file: holes become unwritten extents (read as zeros, no data written). Then
 * the file's data (what its guest held when it went to sleep: SEEK_DATA skips unwritten extents) is asked into the page
 * cache (POSIX_FADV_WILLNEED: reads queued, not waited for): a wake of an agent that slept long enough to leave the page
 * cache would otherwise fault its guest's memory in a page at a time, a disk read each, while its guest runs.
 *
 * dig: why not util-linux's `fallocate --dig-holes`: it skips what SEEK_DATA calls a hole, and on ext4 and XFS that
 * includes unwritten extents, so a reserved file would keep its blocks. Those ranges are punched too; ranges with data
 * are read and their zero pages punched (the guest zeroes what it frees). Only while no guest runs on the file: a page
 * found zero and written before its hole is punched would lose the write. A QEMU that maps the file, stopped, is fine
 * (its mapping of a punched page reads zeros again). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PAGE 4096
#define CHUNK (1 << 20)

static int fd;
static const char *path;
/* SIGTERM: stop after the punch in flight, put the file's times back, exit 0 (a wake is waiting for the file). */
static volatile sig_atomic_t stopping;

static void on_term(int sig) {
  (void)sig;
  stopping = 1;
}

static int punch(off_t off, off_t len) {
  if (len <= 0) return 0;
  if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, len) != 0) {
    fprintf(stderr, "ram-space: punch %s at %lld+%lld: %s\n", path, (long long)off, (long long)len, strerror(errno));
    return -1;
  }
  return 0;
}

static int zero_page(const char *p) {
  static const char zeros[PAGE];
  return memcmp(p, zeros, PAGE) == 0;
}

/* Punches the zero pages of [from, to), a range SEEK_DATA calls data. */
static int dig_data(off_t from, off_t to) {
  static char buf[CHUNK];
  off_t run = -1; /* start of the current run of zero pages */
  for (off_t off = from; off < to && !stopping;) {
    size_t want = (size_t)(to - off < CHUNK ? to - off : CHUNK);
    ssize_t n = pread(fd, buf, want, off);
    if (n < 0) {
      fprintf(stderr, "ram-space: read %s at %lld: %s\n", path, (long long)off, strerror(errno));
      return -1;
    }
    if (n == 0) break;
    for (ssize_t i = 0; i + PAGE <= n; i += PAGE) {
      if (zero_page(buf + i)) {
        if (run < 0) run = off + i;
      } else if (run >= 0) {
        if (punch(run, off + i - run) != 0) return -1;
        run = -1;
      }
    }
    off += n;
  }
  if (run >= 0 && !stopping && punch(run, to - run) != 0) return -1;
  return 0;
}

static int reserve(off_t size) {
  if (fallocate(fd, 0, 0, size) != 0) {
    fprintf(stderr, "ram-space: reserve %s (%lld bytes): %s\n", path, (long long)size, strerror(errno));
    return -1;
  }
  for (off_t off = 0; off < size;) {
    off_t data = lseek(fd, off, SEEK_DATA);
    if (data < 0) break; /* ENXIO: no data after off; anything else: the prefetch is only a hint */
    off_t hole = lseek(fd, data, SEEK_HOLE);
    if (hole < 0 || hole <= data) break;
    posix_fadvise(fd, data, hole - data, POSIX_FADV_WILLNEED);
    off = hole;
  }
  return 0;
}

static int dig(off_t size) {
  for (off_t off = 0; off < size && !stopping;) {
    off_t data = lseek(fd, off, SEEK_DATA);
    if (data < 0) {
      if (errno != ENXIO) {
        fprintf(stderr, "ram-space: seek %s: %s\n", path, strerror(errno));
        return -1;
      }
      data = size; /* no data after off: the rest is a hole (or unwritten) */
    }
    if (punch(off, data - off) != 0) return -1; /* unwritten extents there give their blocks back */
    if (data >= size) break;
    off_t hole = lseek(fd, data, SEEK_HOLE);
    if (hole < 0) hole = size;
    if (dig_data(data, hole) != 0) return -1;
    off = hole;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 3 || (strcmp(argv[1], "reserve") != 0 && strcmp(argv[1], "dig") != 0)) {
    fprintf(stderr, "usage: ram-space reserve|dig FILE\n");
    return 1;
  }
  path = argv[2];
  signal(SIGTERM, on_term);
  fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    fprintf(stderr, "ram-space: open %s: %s\n", path, strerror(errno));
    return 1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    fprintf(stderr, "ram-space: stat %s: %s\n", path, strerror(errno));
    return 1;
  }
  int failed = strcmp(argv[1], "reserve") == 0 ? reserve(st.st_size) : dig(st.st_size);
  struct timespec times[2] = {st.st_atim, st.st_mtim};
  if (futimens(fd, times) != 0) {
    fprintf(stderr, "ram-space: restore times of %s: %s\n", path, strerror(errno));
    failed = 1;
  }
  struct stat after;
  if (fstat(fd, &after) != 0) after = st;
  close(fd);
  if (failed) return 1;
  printf("%lld %lld\n", (long long)st.st_blocks * 512, (long long)after.st_blocks * 512);
  return 0;
}
