/* Fills the host's page cache of a file with 4 KiB pages (order-0 folios), before QEMU maps it as guest RAM.
 *
 * Usage: small-pages FILE. Exit 0 when done, 1 with a message on stderr otherwise.
 *
 * Why: since Linux 6.16 ext4 (XFS long before) caches a file in large folios, up to 2 MiB, made by readahead. A guest
 * write through QEMU's shared mapping then dirties its whole folio: here ~0.7 MiB of changed pages per wake became
 * ~44 MiB to write back at the next hibernation. Reads through a descriptor with POSIX_FADV_RANDOM skip readahead, so
 * the kernel caches each page on its own; QEMU's faults find those pages and a guest write dirties 4 KiB. The file's
 * cached pages are dropped first (they must be clean: the caller has synced the file), holes read as zero pages
 * without being allocated on disk. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: small-pages FILE\n");
    return 1;
  }
  int fd = open(argv[1], O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    fprintf(stderr, "small-pages: open %s: %s\n", argv[1], strerror(errno));
    return 1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    fprintf(stderr, "small-pages: stat: %s\n", strerror(errno));
    return 1;
  }
  /* Dropped only if clean; a dirty large folio stays (then that part keeps its folios: slower, never wrong). */
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  int err = posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
  if (err != 0) {
    fprintf(stderr, "small-pages: fadvise: %s\n", strerror(err));
    return 1;
  }
  static char buf[1 << 20];
  for (off_t off = 0; off < st.st_size;) {
    ssize_t n = pread(fd, buf, sizeof buf, off);
    if (n < 0) {
      fprintf(stderr, "small-pages: read at %lld: %s\n", (long long)off, strerror(errno));
      return 1;
    }
    if (n == 0) break;
    off += n;
  }
  close(fd);
  return 0;
}
