/* The guest agent's writing to the host: one answer line per request ("<id> OK …" / "<id> ERR …"), and its log. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>
#include "agent.h"

void log_line(const char *msg) {
  fprintf(stderr, "guest-agent: %s\n", msg);
}

void write_all(int fd, const char *data, size_t len) {
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

void reply(int fd, const char *id, const char *fmt, ...) {
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
