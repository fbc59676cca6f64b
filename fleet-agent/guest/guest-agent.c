/* Guest agent: answers the host's line protocol (PING, SETTIME, GETTIME, LEASES, SYNC) on the
 * virtio-serial port named "agent" and, when the kernel has AF_VSOCK, on vsock port 1024.
 * The protocol is documented at the top of fleet-agent/drivers/common/guest-agent.ts.
 * Single-threaded poll loop; one vsock connection at a time. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <linux/vm_sockets.h>

#define VSOCK_PORT 1024
#define LINE_MAX_LEN 512
#define LEASE_DIR "/run/leases"

struct channel {
  int fd;
  char buf[LINE_MAX_LEN];
  size_t len;
};

/* Newest host timestamp applied so far: an older one is a delayed retry and must not move the clock back. */
static int64_t last_applied_sec = -1;
static int64_t last_applied_nsec = 0;

static void log_line(const char *msg) {
  fprintf(stderr, "guest-agent: %s\n", msg);
}

static void write_all(int fd, const char *data, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, data, len);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return; /* host went away; it re-sends after reconnecting */
    }
    data += n;
    len -= (size_t)n;
  }
}

__attribute__((format(printf, 3, 4)))
static void reply(int fd, const char *id, const char *fmt, ...) {
  char out[LINE_MAX_LEN + 64];
  int n = snprintf(out, sizeof out, "%s ", id);
  va_list ap;
  va_start(ap, fmt);
  n += vsnprintf(out + n, sizeof out - (size_t)n - 1, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof out - 2) n = (int)sizeof out - 2;
  out[n++] = '\n';
  write_all(fd, out, (size_t)n);
}

/* "<sec>.<nsec9>" → seconds and nanoseconds; exactly nine fraction digits like the host sends. */
static int parse_time(const char *text, int64_t *sec, int64_t *nsec) {
  char *end;
  errno = 0;
  long long s = strtoll(text, &end, 10);
  if (errno || end == text || *end != '.' || s < 0) return -1;
  const char *frac = end + 1;
  int64_t ns = 0;
  int digits = 0;
  while (frac[digits] >= '0' && frac[digits] <= '9') {
    ns = ns * 10 + (frac[digits] - '0');
    digits++;
  }
  if (digits != 9 || (frac[digits] != '\0' && frac[digits] != '\r')) return -1;
  *sec = s;
  *nsec = ns;
  return 0;
}

static int count_leases(void) {
  DIR *dir = opendir(LEASE_DIR);
  if (!dir) return 0;
  time_t now = time(NULL);
  int count = 0;
  struct dirent *entry;
  while ((entry = readdir(dir)) != NULL) {
    if (entry->d_name[0] == '.') continue;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", LEASE_DIR, entry->d_name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    char content[64];
    ssize_t n = read(fd, content, sizeof content - 1);
    close(fd);
    if (n <= 0) continue;
    content[n] = '\0';
    char *end;
    long long expiry = strtoll(content, &end, 10);
    if (end == content) continue;
    if (expiry > (long long)now) count++;
  }
  closedir(dir);
  return count;
}

static void handle_line(int fd, char *line) {
  size_t len = strlen(line);
  while (len > 0 && (line[len - 1] == '\r' || line[len - 1] == ' ')) line[--len] = '\0';
  char *space = strchr(line, ' ');
  if (!space) return; /* not a request: no id to answer to */
  *space = '\0';
  const char *id = line;
  for (const char *p = id; *p; p++)
    if (*p < '0' || *p > '9') return;
  char *command = space + 1;
  char *arg = strchr(command, ' ');
  if (arg) *arg++ = '\0';

  struct timespec ts;
  if (strcmp(command, "PING") == 0) {
    reply(fd, id, "OK pong");
  } else if (strcmp(command, "GETTIME") == 0) {
    clock_gettime(CLOCK_REALTIME, &ts);
    reply(fd, id, "OK %lld.%09ld", (long long)ts.tv_sec, ts.tv_nsec);
  } else if (strcmp(command, "SETTIME") == 0) {
    int64_t sec, nsec;
    if (!arg || parse_time(arg, &sec, &nsec) != 0) {
      reply(fd, id, "ERR bad time");
      return;
    }
    if (sec < last_applied_sec || (sec == last_applied_sec && nsec < last_applied_nsec)) {
      clock_gettime(CLOCK_REALTIME, &ts);
      reply(fd, id, "OK stale %lld.%09ld", (long long)ts.tv_sec, ts.tv_nsec);
      return;
    }
    struct timespec target = {.tv_sec = (time_t)sec, .tv_nsec = (long)nsec};
    if (clock_settime(CLOCK_REALTIME, &target) != 0) {
      reply(fd, id, "ERR clock_settime: %s", strerror(errno));
      return;
    }
    last_applied_sec = sec;
    last_applied_nsec = nsec;
    clock_gettime(CLOCK_REALTIME, &ts);
    reply(fd, id, "OK %lld.%09ld", (long long)ts.tv_sec, ts.tv_nsec);
  } else if (strcmp(command, "LEASES") == 0) {
    reply(fd, id, "OK %d", count_leases());
  } else if (strcmp(command, "SYNC") == 0) {
    /* Before a hibernation: the agent's disk then holds everything written so far, so a cold boot from it alone
     * (the memory snapshot lost) finds the files. Blocks this loop while it runs; the host waits with a timeout. */
    sync();
    reply(fd, id, "OK synced");
  } else {
    reply(fd, id, "ERR unknown command");
  }
}

/* Reads what is available; answers every complete line. Returns 0 at end of stream. */
static int pump(struct channel *ch) {
  ssize_t n = read(ch->fd, ch->buf + ch->len, sizeof ch->buf - ch->len - 1);
  if (n < 0) return (errno == EINTR || errno == EAGAIN) ? 1 : 0;
  if (n == 0) return 0;
  ch->len += (size_t)n;
  ch->buf[ch->len] = '\0';
  char *start = ch->buf;
  char *nl;
  while ((nl = memchr(start, '\n', ch->len - (size_t)(start - ch->buf))) != NULL) {
    *nl = '\0';
    handle_line(ch->fd, start);
    start = nl + 1;
  }
  size_t rest = ch->len - (size_t)(start - ch->buf);
  if (rest == sizeof ch->buf - 1) rest = 0; /* an overlong line: drop it */
  memmove(ch->buf, start, rest);
  ch->len = rest;
  return 1;
}

/* /dev/virtio-ports/agent is made by init; fall back to finding the port by its name in sysfs. */
static int open_serial(void) {
  int fd = open("/dev/virtio-ports/agent", O_RDWR | O_CLOEXEC | O_NONBLOCK);
  if (fd >= 0) return fd;
  DIR *dir = opendir("/sys/class/virtio-ports");
  if (!dir) return -1;
  struct dirent *entry;
  while ((entry = readdir(dir)) != NULL) {
    if (entry->d_name[0] == '.') continue;
    char path[300], name[64] = {0};
    snprintf(path, sizeof path, "/sys/class/virtio-ports/%s/name", entry->d_name);
    int nfd = open(path, O_RDONLY | O_CLOEXEC);
    if (nfd < 0) continue;
    ssize_t n = read(nfd, name, sizeof name - 1);
    close(nfd);
    if (n > 0 && strncmp(name, "agent", 5) == 0 && (name[5] == '\n' || name[5] == '\0')) {
      snprintf(path, sizeof path, "/dev/%s", entry->d_name);
      fd = open(path, O_RDWR | O_CLOEXEC | O_NONBLOCK);
      break;
    }
  }
  closedir(dir);
  return fd;
}

static int open_vsock_listener(void) {
  int fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_vm addr = {.svm_family = AF_VSOCK, .svm_port = VSOCK_PORT, .svm_cid = VMADDR_CID_ANY};
  if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 4) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static void sleep_ms(long ms) {
  struct timespec ts = {.tv_sec = 0, .tv_nsec = ms * 1000000L};
  nanosleep(&ts, NULL);
}

int main(void) {
  struct channel serial = {.fd = -1};
  struct channel vconn = {.fd = -1};
  int vlisten = open_vsock_listener();
  log_line(vlisten >= 0 ? "listening on vsock port 1024" : "no vsock; virtio-serial only");
  mkdir(LEASE_DIR, 0777);

  for (;;) {
    if (serial.fd < 0) {
      serial.fd = open_serial();
      serial.len = 0;
      if (serial.fd >= 0) log_line("virtio-serial port agent open");
    }
    struct pollfd fds[3];
    int nfds = 0, serial_i = -1, listen_i = -1, conn_i = -1;
    if (serial.fd >= 0) { serial_i = nfds; fds[nfds++] = (struct pollfd){.fd = serial.fd, .events = POLLIN}; }
    if (vlisten >= 0) { listen_i = nfds; fds[nfds++] = (struct pollfd){.fd = vlisten, .events = POLLIN}; }
    if (vconn.fd >= 0) { conn_i = nfds; fds[nfds++] = (struct pollfd){.fd = vconn.fd, .events = POLLIN}; }

    /* A virtio-serial port reports POLLHUP without data while no host is connected and a read then
     * returns 0; there is nothing to wait on, so poll again on a short timer until the host connects. */
    int timeout = serial.fd < 0 ? 100 : -1;
    int ready = poll(fds, (nfds_t)nfds, timeout);
    if (ready < 0) {
      if (errno != EINTR) sleep_ms(10);
      continue;
    }
    int serial_idle = 0;
    if (serial_i >= 0 && fds[serial_i].revents) {
      if (fds[serial_i].revents & POLLIN) {
        if (!pump(&serial)) serial_idle = 1;
      } else {
        serial_idle = 1;
      }
    }
    if (listen_i >= 0 && (fds[listen_i].revents & POLLIN)) {
      int c = accept4(vlisten, NULL, NULL, SOCK_CLOEXEC);
      if (c >= 0) {
        if (vconn.fd >= 0) close(vconn.fd); /* newest connection wins: the old host side is gone */
        vconn.fd = c;
        vconn.len = 0;
      }
    } else if (conn_i >= 0 && fds[conn_i].revents) {
      if (!pump(&vconn)) {
        close(vconn.fd);
        vconn.fd = -1;
      }
    }
    if (serial_idle) sleep_ms(10);
  }
}
