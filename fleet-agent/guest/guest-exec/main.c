/* guest-exec: the exec server (commands, files, background processes inside an agent's root), an HTTP/1.1 server on
 * TCP (and vsock where the kernel has it), forking a child per connection. The child checks the request's key against
 * the key file, reads the image's defaults (launch spec), chroots into the root before any path work, and answers.
 *
 *   guest-exec --listen <ip>:<port> [--vsock <port>] --root <dir> [--spec <launch spec>] --key-file <file>
 *              [--state-dir <dir>] [--protect <path>]… [--hide <path>]…
 *
 * Without --spec (the demo) commands run as root with the server's own environment. The state directory (default
 * /run/guest-exec) holds background processes' files; it and the key file must be outside the root (or hidden).
 * Each listener's address is printed on stdout once bound ("guest-exec: listening on 127.0.0.1:<port>"). exec.h says
 * which file does what; docs/exec.md has the protocol. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/vm_sockets.h>
#include "exec.h"
#include "../launch-common.h"

extern char **environ;

struct config cfg = {.state_dir = "/run/guest-exec"};
struct defaults defaults;
int state_fd = -1;
int host_pts_fd = -1;

long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

long long mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void usage(void) {
  fprintf(stderr,
          "usage: guest-exec --listen <ip>:<port> [--vsock <port>] --root <dir> [--spec <file>] --key-file <file> [--state-dir <dir>] "
          "[--protect <path>]... [--hide <path>]...\n");
  exit(2);
}

static int listen_tcp(const char *addr) {
  char host[64];
  const char *colon = strrchr(addr, ':');
  if (!colon || (size_t)(colon - addr) >= sizeof host) return -1;
  memcpy(host, addr, (size_t)(colon - addr));
  host[colon - addr] = '\0';
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) return -1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 64) != 0) {
    close(fd);
    return -1;
  }
  socklen_t len = sizeof sa;
  getsockname(fd, (struct sockaddr *)&sa, &len);
  char ip[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
  printf("guest-exec: listening on %s:%u\n", ip, ntohs(sa.sin_port));
  fflush(stdout);
  return fd;
}

static int listen_vsock(int port) {
  int fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_vm addr = {.svm_family = AF_VSOCK, .svm_port = (unsigned)port, .svm_cid = VMADDR_CID_ANY};
  if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 16) != 0) {
    close(fd);
    return -1;
  }
  printf("guest-exec: listening on vsock port %d\n", port);
  fflush(stdout);
  return fd;
}

static void reap(int sig) {
  (void)sig;
  int saved = errno;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
  errno = saved;
}

/* The key the host pushed (64 hex): 0 and it in `key`, or -1 when none was pushed yet. */
static int read_key(char *key) {
  int fd = open(cfg.key_file, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, key, 64);
  close(fd);
  if (n != 64) return -1;
  key[64] = '\0';
  for (int i = 0; i < 64; i++)
    if (!((key[i] >= '0' && key[i] <= '9') || (key[i] >= 'a' && key[i] <= 'f'))) return -1;
  return 0;
}

static int key_matches(const char *want, const char *got) {
  if (strlen(got) != 64) return 0;
  unsigned char diff = 0;
  for (int i = 0; i < 64; i++) diff |= (unsigned char)(want[i] ^ got[i]);
  return diff == 0;
}

/* mkdir -p with mode 0700 (the state directory is root's). */
static void make_private_dirs(const char *dir) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s", dir);
  for (char *p = path + 1;; p++) {
    if (*p == '/' || *p == '\0') {
      char c = *p;
      *p = '\0';
      mkdir(path, 0700);
      *p = c;
      if (!c) break;
    }
  }
}

static void load_defaults(int fd) {
  if (!cfg.spec_path) {
    defaults = (struct defaults){.uid = 0, .gid = 0, .workdir = "/", .env = environ};
    return;
  }
  struct launch_spec s;
  char err[512];
  if (launch_spec_read(cfg.spec_path, &s, err, sizeof err) != 0) {
    respond_error(fd, 503, "unavailable", "the image's launch spec: %s", err);
    linger_close(fd);
    _exit(0);
  }
  defaults = (struct defaults){.uid = s.uid, .gid = s.gid, .workdir = s.workdir, .env = s.env};
}

static void serve(int fd) {
  static struct req r;
  memset(&r, 0, sizeof r);
  r.fd = fd;
  alarm(60); /* a head that never comes ends the child */
  if (read_request(&r) != 0) return;
  alarm(0);
  char key[65];
  if (read_key(key) != 0) {
    respond_error(fd, 503, "unavailable", "no exec key was pushed to this VM yet");
    return;
  }
  if (!key_matches(key, r.key)) {
    respond_error(fd, 401, "unauthorized", "missing or wrong x-agentvm-exec-key");
    return;
  }
  load_defaults(fd);
  char procs[PATH_MAX];
  snprintf(procs, sizeof procs, "%s/procs", cfg.state_dir);
  make_private_dirs(procs);
  state_fd = open(procs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  host_pts_fd = open("/dev/pts", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (state_fd < 0 || chroot(cfg.root) != 0 || chdir("/") != 0) {
    respond_error(fd, 500, "internal", "cannot enter the root %s: %s", cfg.root, strerror(errno));
    return;
  }
  if (strcmp(r.path, "/v1/version") == 0 && strcmp(r.method, "GET") == 0) {
    respond(fd, 200, "text/plain", EXEC_VERSION, strlen(EXEC_VERSION));
  } else if (strcmp(r.path, "/v1/exec") == 0) {
    if (strcmp(r.method, "POST") != 0) respond_error(fd, 405, "method_not_allowed", "POST only");
    else handle_exec(&r);
  } else if (strcmp(r.path, "/v1/procs") == 0 || strncmp(r.path, "/v1/procs/", 10) == 0) {
    handle_procs(&r);
  } else if (strcmp(r.path, "/v1/files") == 0) {
    handle_files(&r);
  } else if (strcmp(r.path, "/v1/tar") == 0) {
    handle_tar(&r);
  } else {
    respond_error(fd, 404, "not_found", "no route %s %s", r.method, r.path);
  }
}

int main(int argc, char **argv) {
  const char *listen_addrs[4];
  int nlisten = 0, vsock_port = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) usage();
    if (strcmp(a, "--listen") == 0 && nlisten < 4) listen_addrs[nlisten++] = v;
    else if (strcmp(a, "--vsock") == 0) vsock_port = atoi(v);
    else if (strcmp(a, "--root") == 0) cfg.root = v;
    else if (strcmp(a, "--spec") == 0) cfg.spec_path = v;
    else if (strcmp(a, "--key-file") == 0) cfg.key_file = v;
    else if (strcmp(a, "--state-dir") == 0) cfg.state_dir = v;
    else if (strcmp(a, "--protect") == 0 && cfg.nprotect < 32) cfg.protect[cfg.nprotect++] = v;
    else if (strcmp(a, "--hide") == 0 && cfg.nhide < 8) cfg.hide[cfg.nhide++] = v;
    else usage();
    i++;
  }
  if (!cfg.root || !cfg.key_file || (nlisten == 0 && !vsock_port)) usage();
  signal(SIGPIPE, SIG_IGN);
  struct sigaction sa = {.sa_handler = reap, .sa_flags = SA_RESTART | SA_NOCLDSTOP};
  sigaction(SIGCHLD, &sa, NULL);
  /* Orphans (background processes' keepers on the host) stay ours: the process driver stops and freezes our tree. */
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  make_private_dirs(cfg.state_dir);

  struct pollfd fds[5];
  int n = 0;
  for (int i = 0; i < nlisten; i++) {
    int fd = listen_tcp(listen_addrs[i]);
    if (fd < 0) {
      fprintf(stderr, "guest-exec: cannot listen on %s: %s\n", listen_addrs[i], strerror(errno));
      return 1;
    }
    fds[n++] = (struct pollfd){.fd = fd, .events = POLLIN};
  }
  if (vsock_port) {
    int fd = listen_vsock(vsock_port);
    if (fd >= 0) fds[n++] = (struct pollfd){.fd = fd, .events = POLLIN};
  }
  for (;;) {
    if (poll(fds, (nfds_t)n, -1) < 0) continue;
    for (int i = 0; i < n; i++) {
      if (!(fds[i].revents & POLLIN)) continue;
      int c = accept4(fds[i].fd, NULL, NULL, SOCK_CLOEXEC);
      if (c < 0) continue;
      pid_t pid = fork();
      if (pid == 0) {
        signal(SIGCHLD, SIG_DFL);
        prctl(PR_SET_CHILD_SUBREAPER, 0);
        for (int j = 0; j < n; j++) close(fds[j].fd);
        int one = 1;
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        serve(c);
        linger_close(c);
        _exit(0);
      }
      close(c);
    }
  }
}
