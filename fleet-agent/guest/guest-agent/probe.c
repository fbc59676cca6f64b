/* The guest agent's egress probes, PROBE and PROBEVIA: a process inside the VM opening a TCP connection the way a
 * workload would (the same kernel, virtio-net and QEMU user network), so the host's tests can see what the guest can
 * and cannot reach. */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "agent.h"

#define PROBE_MAX_MS 10000
#define PROBE_GREETING "agentvm-probe\n"
#define PROBE_READ_MAX 96

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits for `events` on fd until the deadline: 1 ready, 0 timed out, -1 error. */
static int wait_fd(int fd, short events, int64_t deadline) {
  for (;;) {
    int64_t left = deadline - now_ms();
    if (left <= 0) return 0;
    struct pollfd p = {.fd = fd, .events = events};
    int r = poll(&p, 1, (int)left);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) return 0;
    return 1;
  }
}

/* A word for a failed connect: what the host's side parses. */
static const char *connect_failure(int err) {
  if (err == ECONNREFUSED) return "refused";
  if (err == ETIMEDOUT) return "timeout";
  if (err == ENETUNREACH || err == EHOSTUNREACH) return "unreachable";
  if (err == ECONNRESET) return "reset";
  return NULL;
}

/* Non-blocking connect to ip:port within the deadline. Returns the socket, or -1 with *why set ("refused", …). */
static int probe_connect(const char *ip, const char *port_text, int64_t deadline, char *why, size_t why_len) {
  struct sockaddr_in addr = {.sin_family = AF_INET};
  char *end;
  long port = strtol(port_text, &end, 10);
  if (inet_pton(AF_INET, ip, &addr.sin_addr) != 1 || *end || port < 1 || port > 65535) {
    snprintf(why, why_len, "error bad address");
    return -1;
  }
  addr.sin_port = htons((uint16_t)port);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(why, why_len, "error socket: %s", strerror(errno));
    return -1;
  }
  int err = 0;
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
    if (errno != EINPROGRESS) {
      err = errno;
    } else {
      int r = wait_fd(fd, POLLOUT, deadline);
      if (r == 0) err = ETIMEDOUT;
      else if (r < 0) err = errno;
      else {
        socklen_t len = sizeof err;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      }
    }
  }
  if (err) {
    const char *word = connect_failure(err);
    if (word) snprintf(why, why_len, "%s", word);
    else snprintf(why, why_len, "error %s", strerror(err));
    close(fd);
    return -1;
  }
  return fd;
}

static int send_all(int fd, const char *data, size_t len, int64_t deadline) {
  while (len > 0) {
    ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (wait_fd(fd, POLLOUT, deadline) != 1) return -1;
      continue;
    }
    if (n <= 0) return -1;
    data += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Reads into buf until `stop` has been seen (NULL: one newline), the buffer is full, the peer closes, or the deadline. */
static size_t read_until(int fd, char *buf, size_t cap, const char *stop, int64_t deadline) {
  size_t got = 0;
  while (got < cap) {
    if (wait_fd(fd, POLLIN, deadline) != 1) break;
    ssize_t n = recv(fd, buf + got, cap - got, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) break;
    got += (size_t)n;
    if (stop ? memmem(buf, got, stop, strlen(stop)) != NULL : memchr(buf, '\n', got) != NULL) break;
  }
  return got;
}

/* Sends the greeting and answers what came back, hex-encoded ("-" for nothing). */
static void greet_and_reply(int out, int fd, const char *id, const char *prefix, int64_t deadline) {
  char got[PROBE_READ_MAX];
  size_t n = 0;
  if (send_all(fd, PROBE_GREETING, strlen(PROBE_GREETING), deadline) == 0) n = read_until(fd, got, sizeof got, NULL, deadline);
  char hex[PROBE_READ_MAX * 2 + 2] = "-";
  for (size_t i = 0; i < n; i++) snprintf(hex + 2 * i, 3, "%02x", (unsigned char)got[i]);
  reply(out, id, "OK %s %s", prefix, hex);
}

static int64_t probe_deadline(const char *text) {
  char *end;
  long ms = text ? strtol(text, &end, 10) : -1;
  if (!text || *end || ms < 1) ms = 2000;
  if (ms > PROBE_MAX_MS) ms = PROBE_MAX_MS;
  return now_ms() + ms;
}

/* PROBE <ipv4> <port> <timeoutMs>: a direct connection. */
void probe_direct(int out, const char *id, char *arg) {
  char *ip = arg ? strtok(arg, " ") : NULL, *port = ip ? strtok(NULL, " ") : NULL, *ms = port ? strtok(NULL, " ") : NULL;
  if (!port) {
    reply(out, id, "ERR usage: PROBE <ipv4> <port> <timeoutMs>");
    return;
  }
  int64_t deadline = probe_deadline(ms);
  char why[128];
  int fd = probe_connect(ip, port, deadline, why, sizeof why);
  if (fd < 0) {
    reply(out, id, "OK %s", why);
    return;
  }
  greet_and_reply(out, fd, id, "connected", deadline);
  close(fd);
}

/* PROBEVIA <proxy-ipv4> <proxy-port> <host:port> <timeoutMs>: an HTTP CONNECT through the egress proxy. */
void probe_via(int out, const char *id, char *arg) {
  char *ip = arg ? strtok(arg, " ") : NULL, *port = ip ? strtok(NULL, " ") : NULL, *target = port ? strtok(NULL, " ") : NULL;
  char *ms = target ? strtok(NULL, " ") : NULL;
  if (!target || strlen(target) > 200) {
    reply(out, id, "ERR usage: PROBEVIA <proxy-ipv4> <proxy-port> <host:port> <timeoutMs>");
    return;
  }
  int64_t deadline = probe_deadline(ms);
  char why[128];
  int fd = probe_connect(ip, port, deadline, why, sizeof why);
  if (fd < 0) {
    reply(out, id, "OK proxy-%s", why);
    return;
  }
  char request[512];
  int len = snprintf(request, sizeof request, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target);
  char head[1024];
  size_t n = 0;
  if (send_all(fd, request, (size_t)len, deadline) == 0) n = read_until(fd, head, sizeof head - 1, "\r\n\r\n", deadline);
  head[n] = '\0';
  int status = 0;
  if (n == 0 || sscanf(head, "HTTP/1.%*d %d", &status) != 1) {
    reply(out, id, "OK proxy-silent");
  } else if (status != 200) {
    reply(out, id, "OK status %d -", status);
  } else {
    greet_and_reply(out, fd, id, "status 200", deadline);
  }
  close(fd);
}
