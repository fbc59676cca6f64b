/* agentvm-egress-relay <unix socket>: the command QEMU's guestfwd runs for each connection a guest opens to the
 * egress proxy's address (`guestfwd=tcp:10.0.2.100:3128-cmd:…`). libslirp starts one per connection with the
 * guest's TCP stream as its stdin and stdout (one socket); this copies bytes between that stream and the host's
 * egress proxy on its per-VM unix socket, both ways, passing each direction's end on (shutdown) until both ended.
 * Exit status: 0 after a clean end, 1 when the proxy cannot be reached or a copy fails. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define GUEST_IN 0
#define GUEST_OUT 1
#define BUF_BYTES 65536

static char buf[BUF_BYTES];

static int write_all(int fd, const char *data, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, data, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    data += n;
    len -= (size_t)n;
  }
  return 0;
}

/* One read from `from` written whole to `to`: 1 copied, 0 end of stream, -1 error. */
static int copy_once(int from, int to) {
  ssize_t n;
  do n = read(from, buf, sizeof buf);
  while (n < 0 && errno == EINTR);
  if (n < 0) return -1;
  if (n == 0) return 0;
  return write_all(to, buf, (size_t)n) == 0 ? 1 : -1;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: agentvm-egress-relay <unix socket>\n");
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (strlen(argv[1]) >= sizeof addr.sun_path) return 1;
  strcpy(addr.sun_path, argv[1]);
  int proxy = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (proxy < 0 || connect(proxy, (struct sockaddr *)&addr, sizeof addr) != 0) return 1; /* the guest sees its connection closed */

  int guest_open = 1, proxy_open = 1;
  while (guest_open || proxy_open) {
    struct pollfd fds[2];
    int n = 0, gi = -1, pi = -1;
    if (guest_open) { gi = n; fds[n++] = (struct pollfd){.fd = GUEST_IN, .events = POLLIN}; }
    if (proxy_open) { pi = n; fds[n++] = (struct pollfd){.fd = proxy, .events = POLLIN}; }
    if (poll(fds, (nfds_t)n, -1) < 0) {
      if (errno == EINTR) continue;
      return 1;
    }
    if (gi >= 0 && fds[gi].revents) {
      int r = copy_once(GUEST_IN, proxy);
      if (r < 0) return 1;
      if (r == 0) {
        guest_open = 0;
        shutdown(proxy, SHUT_WR);
      }
    }
    if (pi >= 0 && fds[pi].revents) {
      int r = copy_once(proxy, GUEST_OUT);
      if (r < 0) return 1;
      if (r == 0) {
        proxy_open = 0;
        shutdown(GUEST_OUT, SHUT_WR);
      }
    }
  }
  return 0;
}
