// Prints a file's size, then one line "<start> <end>" per data extent (SEEK_DATA/SEEK_HOLE), so a reader of a sparse
// file reads only its data and knows the rest is zeros. A filesystem that does not track holes reports the whole file
// as one extent (Linux's generic SEEK_DATA), which is still right, only slower to read.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s FILE\n", argv[0]);
    return 2;
  }
  int fd = open(argv[1], O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) < 0) {
    perror(argv[1]);
    return 1;
  }
  printf("%lld\n", (long long)st.st_size);
  off_t pos = 0;
  while (pos < st.st_size) {
    off_t data = lseek(fd, pos, SEEK_DATA);
    if (data < 0) {
      if (errno == ENXIO) break; /* only a hole from pos to the end */
      if (errno == EINVAL && pos == 0) { /* no SEEK_DATA here: all of it is data */
        printf("0 %lld\n", (long long)st.st_size);
        break;
      }
      perror("lseek SEEK_DATA");
      return 1;
    }
    off_t hole = lseek(fd, data, SEEK_HOLE);
    if (hole < 0) {
      perror("lseek SEEK_HOLE");
      return 1;
    }
    printf("%lld %lld\n", (long long)data, (long long)hole);
    pos = hole;
  }
  return fflush(stdout) == 0 ? 0 : 1;
}
