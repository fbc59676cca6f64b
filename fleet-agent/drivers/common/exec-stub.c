// A process started ahead of need that becomes a VM's hypervisor when told (exec-stubs.ts): a fork of the big
// fleet-agent costs tens of ms of page-table copying on its event loop, an exec of this small waiting one does not.
//
// Reads its whole standard input (until the other end closes it):
//   cwd NUL relays NUL (socket NUL port NUL)*relays argc NUL argv[0] NUL … argv[argc-1] NUL env[0] NUL … env[n-1] NUL
// (an empty cwd keeps the current one; argv[0] is looked up on PATH when it has no slash), then puts /dev/null on
// standard input and execs it with exactly that environment. Its stdout and stderr (and process group) are what it was
// started with. Nothing read (the fleet-agent went away before using it): exits 0. An exec that fails says why on
// stderr, prefixed "exec-stub:", and exits 127.
//
// relays > 0: the command runs in a network namespace of its own (only its loopback, brought up), so the ports QEMU
// forwards (hostfwd on 127.0.0.1) are reachable from no other process of the host. The host's way in is one unix
// socket per forwarded port (mode 0600, made under umask 0177 by this root process): a relay process, forked here
// inside the namespace before the exec, accepts on each socket and connects to 127.0.0.1:<port> in the namespace for
// every connection, copying bytes both ways (a thread per direction). The sockets are listening before the command
// starts; the relay dies with the command (PR_SET_PDEATHSIG: the command keeps this process's pid), and never unlinks
// its sockets (a newer QEMU of the same VM may have bound the same paths by then).
//
// `exec-stub --netns`: the namespace is made at start, while the stub waits (its request must have relays).
// `exec-stub --probe-netns`: exits 0 when a namespace can be made here (root: CAP_SYS_ADMIN), else says why and exits 1.
//
// What it execs dies with the fleet-agent (PR_SET_PDEATHSIG, kept across the exec): a host killed with SIGKILL leaves
// no hypervisor running its VMs unmetered and reachable until a restart reaps them, and none at all if it never
// comes back. A fleet-agent that already went away before the exec: nothing is started.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define MAX_RELAYS 8
#define COPY_BUF (64 << 10)

static char *read_all(size_t *len) {
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  if (!buf) return NULL;
  for (;;) {
    if (n == cap) {
      cap *= 2;
      char *more = realloc(buf, cap);
      if (!more) return NULL;
      buf = more;
    }
    ssize_t r = read(0, buf + n, cap - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return NULL;
    if (r == 0) break;
    n += (size_t)r;
  }
  *len = n;
  return buf;
}

static void fail(const char *what, const char *detail) {
  dprintf(2, "exec-stub: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  _exit(127);
}

/** A network namespace of this process's own with its loopback up; -1 with errno set when either fails. */
static int private_network(void) {
  if (unshare(CLONE_NEWNET) != 0) return -1;
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  int rc = ioctl(s, SIOCGIFFLAGS, &ifr);
  if (rc == 0) {
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    rc = ioctl(s, SIOCSIFFLAGS, &ifr);
  }
  int saved = errno;
  close(s);
  errno = saved;
  return rc;
}

struct relay {
  const char *path;
  int port;
  int fd;
};

struct conn {
  int client;
  int port;
};

struct pair {
  int from, to;
};

/** Copies `from` to `to` until EOF (then half-closes `to`) or an error (then ends both ways of both sockets). */
static void *copy(void *arg) {
  struct pair *p = arg;
  char *buf = malloc(COPY_BUF);
  for (;;) {
    ssize_t n = buf ? read(p->from, buf, COPY_BUF) : -1;
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {
      shutdown(p->to, SHUT_WR);
      break;
    }
    ssize_t off = 0;
    while (n > 0 && off < n) {
      ssize_t w = send(p->to, buf + off, (size_t)(n - off), MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;
      off += w;
    }
    if (n < 0 || off < n) {
      shutdown(p->from, SHUT_RDWR);
      shutdown(p->to, SHUT_RDWR);
      break;
    }
  }
  free(buf);
  return NULL;
}

/** One accepted connection: a TCP connection to the forwarded port in the namespace, bytes copied both ways. */
static void *serve(void *arg) {
  struct conn c = *(struct conn *)arg;
  free(arg);
  int up = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in to;
  memset(&to, 0, sizeof to);
  to.sin_family = AF_INET;
  to.sin_port = htons((uint16_t)c.port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int rc = -1;
  if (up >= 0) {
    do rc = connect(up, (struct sockaddr *)&to, sizeof to);
    while (rc != 0 && errno == EINTR);
  }
  // Refused (QEMU not listening yet, or gone): the client sees its connection closed, as it would a refused one.
  if (rc != 0) {
    if (up >= 0) close(up);
    close(c.client);
    return NULL;
  }
  int one = 1;
  setsockopt(up, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct pair back = {up, c.client}, forth = {c.client, up};
  pthread_t t;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 64 << 10);
  if (pthread_create(&t, &attr, copy, &back) != 0) {
    close(up);
    close(c.client);
    return NULL;
  }
  copy(&forth);
  pthread_join(t, NULL);
  close(up);
  close(c.client);
  return NULL;
}

/** The relay process: accepts on every (listening) socket for ever, a thread per connection. */
static void relay_main(struct relay *relays, int count) {
  signal(SIGPIPE, SIG_IGN);
  struct pollfd pfd[MAX_RELAYS];
  for (int i = 0; i < count; i++) pfd[i] = (struct pollfd){.fd = relays[i].fd, .events = POLLIN};
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 64 << 10);
  for (;;) {
    if (poll(pfd, (nfds_t)count, -1) < 0) {
      if (errno == EINTR) continue;
      fail("poll", strerror(errno));
    }
    for (int i = 0; i < count; i++) {
      if (!(pfd[i].revents & POLLIN)) continue;
      int client = accept4(relays[i].fd, NULL, NULL, SOCK_CLOEXEC);
      if (client < 0) continue;
      struct conn *c = malloc(sizeof *c);
      pthread_t t;
      if (!c) {
        close(client);
        continue;
      }
      *c = (struct conn){client, relays[i].port};
      if (pthread_create(&t, &attr, serve, c) != 0) {
        free(c);
        close(client);
      }
    }
  }
}

/**
 * Binds and listens on every socket here (so they take connections before the command runs: nothing to wait for),
 * then forks the relay inside this namespace, which inherits them; our copies close at the exec (O_CLOEXEC).
 */
static void start_relay(struct relay *relays, int count) {
  mode_t was = umask(0177); // the sockets are 0600: only root (the fleet-agent) may connect
  for (int i = 0; i < count; i++) {
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    if (strlen(relays[i].path) >= sizeof addr.sun_path) fail("socket path too long", relays[i].path);
    strcpy(addr.sun_path, relays[i].path);
    relays[i].fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (relays[i].fd < 0) fail("socket", strerror(errno));
    unlink(relays[i].path); // a socket an earlier QEMU of this VM left
    if (bind(relays[i].fd, (struct sockaddr *)&addr, sizeof addr) != 0) fail(relays[i].path, strerror(errno));
    if (listen(relays[i].fd, 512) != 0) fail("listen", strerror(errno));
  }
  umask(was);
  pid_t self = getpid();
  pid_t child = fork();
  if (child < 0) fail("fork", strerror(errno));
  if (child == 0) {
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != self) _exit(1);
    relay_main(relays, count);
    _exit(0);
  }
}

int main(int argc0, char **argv0) {
  if (argc0 == 2 && strcmp(argv0[1], "--probe-netns") == 0) {
    if (private_network() != 0) {
      printf("%s\n", strerror(errno));
      return 1;
    }
    return 0;
  }
  // `--netns`: the namespace is made while the stub waits, off the command's path (a request must then have relays).
  int netns = argc0 == 2 && strcmp(argv0[1], "--netns") == 0;
  int netns_error = netns && private_network() != 0 ? errno : 0;
  pid_t parent = getppid();
  size_t len = 0;
  char *buf = read_all(&len);
  if (!buf) fail("cannot read the request", strerror(errno));
  if (len == 0) return 0;
  if (buf[len - 1] != '\0') fail("request does not end in NUL", NULL);
  // Split into fields.
  size_t fields = 0;
  for (size_t i = 0; i < len; i++) fields += buf[i] == '\0';
  char **field = calloc(fields + 1, sizeof(char *));
  if (!field) fail("out of memory", NULL);
  size_t f = 0;
  for (size_t i = 0; i < len; i += strlen(buf + i) + 1) field[f++] = buf + i;
  if (fields < 4) fail("request too short", NULL);
  char *end = NULL;
  long nrelays = strtol(field[1], &end, 10);
  if (*field[1] == '\0' || *end != '\0' || nrelays < 0 || nrelays > MAX_RELAYS || (size_t)(2 * nrelays) > fields - 4)
    fail("bad relay count", field[1]);
  struct relay relays[MAX_RELAYS];
  for (long i = 0; i < nrelays; i++) {
    relays[i].path = field[2 + 2 * i];
    relays[i].port = (int)strtol(field[3 + 2 * i], &end, 10);
    if (*end != '\0' || relays[i].port <= 0 || relays[i].port > 65535) fail("bad relay port", field[3 + 2 * i]);
  }
  size_t first = 2 + 2 * (size_t)nrelays;
  long argc = strtol(field[first], &end, 10);
  if (*field[first] == '\0' || *end != '\0' || argc < 1 || (size_t)argc > fields - first - 1) fail("bad argument count", field[first]);
  char **argv = field + first + 1;
  char **envp = field + first + 1 + argc;
  // argv and envp are NULL-terminated: the env list ends at the calloc'd NULL; argv ends where envp begins.
  char **args = calloc((size_t)argc + 1, sizeof(char *));
  if (!args) fail("out of memory", NULL);
  memcpy(args, argv, (size_t)argc * sizeof(char *));
  if (*field[0] != '\0' && chdir(field[0]) != 0) fail(field[0], strerror(errno));
  int devnull = open("/dev/null", O_RDONLY);
  if (devnull < 0 || dup2(devnull, 0) < 0) fail("/dev/null", strerror(errno));
  if (devnull != 0) close(devnull);
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail("prctl", strerror(errno));
  if (getppid() != parent) fail("the fleet-agent is gone", NULL);
  if (netns_error) fail("cannot make a network namespace", strerror(netns_error));
  if (netns && nrelays == 0) fail("a stub in a network namespace of its own was given no port to relay", NULL);
  if (nrelays > 0) {
    if (!netns && private_network() != 0) fail("cannot make a network namespace", strerror(errno));
    start_relay(relays, (int)nrelays);
  }
  execvpe(args[0], args, envp);
  fail(args[0], strerror(errno));
  return 127;
}
