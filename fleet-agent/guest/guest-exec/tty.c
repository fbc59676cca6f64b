/* A foreground exec on a pseudo-terminal (spec `tty=<rows>x<cols>`): the PTY made inside the root (its /dev/ptmx, so
 * the command's `tty` names a /dev/pts/N it can see; a root without one, as the process driver's unpacked rootfs, gets
 * one of the server's own /dev/pts, which works but has no name there), its window size set, the terminal handed to
 * the command's user,
 * and the input direction: after the spec the request body is frames ([u8 type][u32 BE length][payload]: 1 bytes for
 * the terminal, 5 a window size `rows=<n> cols=<n>`), copied by a helper process into the PTY. The body's end (the
 * client hung up) is a hangup: SIGHUP to the command's group and to the terminal's foreground group. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>
#include "exec.h"

#ifndef TIOCGPTPEER
#define TIOCGPTPEER _IO('T', 0x41)
#endif

enum { IN_DATA = 1, IN_RESIZE = 5 };

int parse_tty_size(const char *s, int *rows, int *cols) {
  char *end;
  long r = strtol(s, &end, 10);
  if (end == s || *end != 'x') return -1;
  const char *c0 = end + 1;
  long c = strtol(c0, &end, 10);
  if (end == c0 || *end) return -1;
  if (r < 1 || r > 65535 || c < 1 || c > 65535) return -1;
  *rows = (int)r;
  *cols = (int)c;
  return 0;
}

static void set_size(int master, int rows, int cols) {
  struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
  ioctl(master, TIOCSWINSZ, &ws);
}

int open_tty(int fd, const struct exec_spec *sp, const struct ids *ids, int *master, int *slave) {
  int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (m < 0 && host_pts_fd >= 0) m = openat(host_pts_fd, "ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (m < 0) {
    respond_error(fd, 409, "conflict", "no pseudo-terminals inside this agent's root (/dev/ptmx: %s)", strerror(errno));
    return -1;
  }
  if (grantpt(m) != 0 || unlockpt(m) != 0) {
    respond_error(fd, 500, "internal", "unlockpt: %s", strerror(errno));
    close(m);
    return -1;
  }
  /* The peer by the master itself (no path: the same devpts instance whatever /dev/pts is); by name on older kernels. */
  int s = ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (s < 0) {
    const char *name = ptsname(m);
    s = name ? open(name, O_RDWR | O_NOCTTY | O_CLOEXEC) : -1;
  }
  if (s < 0) {
    respond_error(fd, 409, "conflict", "cannot open the terminal's other end: %s (is /dev/pts mounted in the root?)", strerror(errno));
    close(m);
    return -1;
  }
  /* The command's own terminal, as a login gives it (programs that reopen it by name, mesg, write). */
  (void)!fchown(s, ids->uid, (gid_t)-1); /* where it cannot, the open descriptor is all the command needs */
  (void)!fchmod(s, 0620);
  set_size(m, sp->tty_rows, sp->tty_cols);
  *master = m;
  *slave = s;
  return 0;
}

/* Hangs the command up: its own group, and the terminal's foreground job (a shell's job has a group of its own). */
static void hang_up(int master, pid_t pid) {
  pid_t fg = -1;
  ioctl(master, TIOCGPGRP, &fg);
  kill(-pid, SIGHUP);
  kill(-pid, SIGCONT);
  if (fg > 0 && fg != pid) {
    kill(-fg, SIGHUP);
    kill(-fg, SIGCONT);
  }
}

static int read_full(struct req *r, unsigned char *out, size_t n) {
  for (size_t got = 0; got < n;) {
    ssize_t k = body_read(r, out + got, n - got);
    if (k <= 0) return -1;
    got += (size_t)k;
  }
  return 0;
}

/* The helper process's life: input frames into the PTY until the body ends, then the hangup. A bad frame ends it too. */
void tty_pump(struct req *r, int master, pid_t pid) {
  static unsigned char buf[IO_CHUNK];
  unsigned char h[5];
  for (;;) {
    if (read_full(r, h, 5) != 0) break;
    size_t len = ((size_t)h[1] << 24) | ((size_t)h[2] << 16) | ((size_t)h[3] << 8) | h[4];
    if (h[0] == IN_DATA) {
      while (len > 0) {
        size_t want = len < sizeof buf ? len : sizeof buf;
        if (read_full(r, buf, want) != 0) goto done;
        if (write_all(master, buf, want) != 0) goto done;
        len -= want;
      }
    } else if (h[0] == IN_RESIZE && len < 64) {
      char text[64];
      if (read_full(r, (unsigned char *)text, len) != 0) break;
      text[len] = '\0';
      int rows = 0, cols = 0;
      if (sscanf(text, "rows=%d cols=%d", &rows, &cols) == 2 && rows >= 1 && rows <= 65535 && cols >= 1 && cols <= 65535) set_size(master, rows, cols);
    } else {
      /* Another version's frame: skipped whole. */
      while (len > 0) {
        size_t want = len < sizeof buf ? len : sizeof buf;
        if (read_full(r, buf, want) != 0) goto done;
        len -= want;
      }
    }
  }
done:
  hang_up(master, pid);
}
