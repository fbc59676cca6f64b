/* The exec server's HTTP/1.1: one request per connection (`connection: close`), its head, query parameters, a body
 * by content-length or chunked, and the answers (a head, an error as JSON), plus a small JSON text builder. */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>
#include "exec.h"

#define HEAD_MAX 16384

/* Reads into r->buf until the end of the head; parses it. 0, or -1 (bad or closed: nothing to answer). */
int read_request(struct req *r) {
  r->content_length = -1;
  size_t end = 0;
  for (;;) {
    char *p = memmem(r->buf, r->buf_len, "\r\n\r\n", 4);
    if (p) {
      end = (size_t)(p - r->buf) + 4;
      break;
    }
    if (r->buf_len >= sizeof r->buf - 1) return -1;
    ssize_t n = read(r->fd, r->buf + r->buf_len, sizeof r->buf - 1 - r->buf_len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      struct pollfd pfd = {.fd = r->fd, .events = POLLIN};
      poll(&pfd, 1, -1);
      continue;
    }
    if (n <= 0) return -1;
    r->buf_len += (size_t)n;
  }
  char head[HEAD_MAX];
  if (end >= sizeof head) return -1;
  memcpy(head, r->buf, end);
  head[end] = '\0';
  r->buf_pos = end;
  char *save;
  char *line = strtok_r(head, "\r\n", &save);
  if (!line) return -1;
  char target[sizeof r->path + sizeof r->query + 2];
  if (sscanf(line, "%7s %5119s HTTP/1.%*c", r->method, target) != 2) return -1;
  char *q = strchr(target, '?');
  if (q) {
    *q++ = '\0';
    snprintf(r->query, sizeof r->query, "%s", q);
  }
  if (snprintf(r->path, sizeof r->path, "%s", target) >= (int)sizeof r->path) return -1;
  int expect = 0;
  while ((line = strtok_r(NULL, "\r\n", &save)) != NULL) {
    char *colon = strchr(line, ':');
    if (!colon) continue;
    *colon = '\0';
    char *v = colon + 1;
    while (*v == ' ' || *v == '\t') v++;
    size_t vl = strlen(v);
    while (vl > 0 && (v[vl - 1] == ' ' || v[vl - 1] == '\t')) v[--vl] = '\0';
    if (strcasecmp(line, "content-length") == 0) r->content_length = strtoll(v, NULL, 10);
    else if (strcasecmp(line, "transfer-encoding") == 0 && strcasestr(v, "chunked")) r->chunked = 1;
    else if (strcasecmp(line, "x-agentvm-exec-key") == 0) snprintf(r->key, sizeof r->key, "%s", v);
    else if (strcasecmp(line, "expect") == 0 && strcasecmp(v, "100-continue") == 0) expect = 1;
  }
  if (r->chunked) r->content_length = -1;
  r->body_left = r->chunked ? 0 : (r->content_length > 0 ? r->content_length : 0);
  r->body_done = !r->chunked && r->body_left == 0;
  if (expect && !r->body_done) {
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    write_all(r->fd, cont, sizeof cont - 1);
  }
  return 0;
}

/* Up to n raw bytes of the connection: what was read with the head first. 0 at EOF, -1 on error. */
static ssize_t raw_read(struct req *r, void *out, size_t n) {
  if (r->buf_pos < r->buf_len) {
    size_t k = r->buf_len - r->buf_pos;
    if (k > n) k = n;
    memcpy(out, r->buf + r->buf_pos, k);
    r->buf_pos += k;
    return (ssize_t)k;
  }
  for (;;) {
    ssize_t k = read(r->fd, out, n);
    if (k >= 0) return k;
    if (errno == EINTR) continue;
    if (errno == EAGAIN) {
      struct pollfd pfd = {.fd = r->fd, .events = POLLIN};
      poll(&pfd, 1, -1);
      continue;
    }
    return -1;
  }
}

/* One line (a chunk size or trailer) into `line`; -1 when too long or closed. */
static int raw_line(struct req *r, char *line, size_t len) {
  size_t i = 0;
  for (;;) {
    char c;
    if (raw_read(r, &c, 1) != 1) return -1;
    if (c == '\n') break;
    if (i + 1 >= len) return -1;
    if (c != '\r') line[i++] = c;
  }
  line[i] = '\0';
  return 0;
}

/* Up to n bytes of the body: 0 at its end, -1 when the connection ends early or the chunking is bad. */
ssize_t body_read(struct req *r, void *out, size_t n) {
  if (r->body_done || n == 0) return 0;
  if (r->chunked && r->body_left == 0) {
    char line[128];
    if (r->chunk_state == 1 && raw_line(r, line, sizeof line) != 0) return -1; /* the CRLF after a chunk */
    if (raw_line(r, line, sizeof line) != 0) return -1;
    char *end;
    long long size = strtoll(line, &end, 16);
    if (end == line || size < 0) return -1;
    if (size == 0) {
      do {
        if (raw_line(r, line, sizeof line) != 0) return -1;
      } while (line[0] != '\0'); /* trailers */
      r->body_done = 1;
      r->chunk_state = 2;
      return 0;
    }
    r->body_left = size;
    r->chunk_state = 1;
  }
  if ((long long)n > r->body_left) n = (size_t)r->body_left;
  ssize_t k = raw_read(r, out, n);
  if (k <= 0) return -1;
  r->body_left -= k;
  if (!r->chunked && r->body_left == 0) r->body_done = 1;
  return k;
}

/* Reads the rest of the body away. 0, or -1 when it ended early. */
int body_drain(struct req *r) {
  char tmp[8192];
  ssize_t n;
  while ((n = body_read(r, tmp, sizeof tmp)) > 0) {
  }
  return n < 0 ? -1 : 0;
}

static int hexval(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  c = tolower(c);
  return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* The query parameter `name`, percent-decoded (`+` is a space); 1 when present. A NUL in it makes it absent. */
int query_get(const struct req *r, const char *name, char *out, size_t outlen) {
  size_t nl = strlen(name);
  const char *p = r->query;
  while (*p) {
    const char *amp = strchrnul(p, '&');
    if ((size_t)(amp - p) >= nl && strncmp(p, name, nl) == 0 && (p[nl] == '=' || p + nl == amp)) {
      const char *v = p[nl] == '=' ? p + nl + 1 : amp;
      size_t o = 0;
      while (v < amp) {
        int c = (unsigned char)*v;
        if (c == '%' && amp - v >= 3 && hexval(v[1]) >= 0 && hexval(v[2]) >= 0) {
          c = hexval(v[1]) * 16 + hexval(v[2]);
          v += 3;
        } else {
          if (c == '+') c = ' ';
          v++;
        }
        if (c == 0 || o + 1 >= outlen) return 0;
        out[o++] = (char)c;
      }
      out[o] = '\0';
      return 1;
    }
    p = *amp ? amp + 1 : amp;
  }
  return 0;
}

long long query_num(const struct req *r, const char *name, long long def) {
  char v[32];
  if (!query_get(r, name, v, sizeof v) || !v[0]) return def;
  char *end;
  long long n = strtoll(v, &end, 10);
  return *end ? def : n;
}

/* Writes everything, waiting while the socket is full. 0, or -1 (the peer went away). */
int write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == ENOTSOCK) n = write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        poll(&pfd, 1, -1);
        continue;
      }
      return -1;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static const char *reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 503: return "Service Unavailable";
    default: return status >= 500 ? "Internal Server Error" : "Unknown";
  }
}

/* The status line and headers; `length` -1: the body runs until the connection closes. `extra`: more header lines. */
void send_head(int fd, int status, const char *ctype, long long length, const char *extra) {
  char head[2048];
  int n = snprintf(head, sizeof head, "HTTP/1.1 %d %s\r\nconnection: close\r\n", status, reason(status));
  if (ctype) n += snprintf(head + n, sizeof head - (size_t)n, "content-type: %s\r\n", ctype);
  if (length >= 0) n += snprintf(head + n, sizeof head - (size_t)n, "content-length: %lld\r\n", length);
  if (extra) n += snprintf(head + n, sizeof head - (size_t)n, "%s", extra);
  n += snprintf(head + n, sizeof head - (size_t)n, "\r\n");
  write_all(fd, head, (size_t)n);
}

void respond(int fd, int status, const char *ctype, const char *body, size_t len) {
  send_head(fd, status, ctype, (long long)len, NULL);
  if (len) write_all(fd, body, len);
}

/* `{"code":…,"message":…}` with the status. */
void respond_error(int fd, int status, const char *code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  struct jbuf b = {0};
  jb_raw(&b, "{\"code\":", 8);
  jb_str(&b, code);
  jb_raw(&b, ",\"message\":", 11);
  jb_str(&b, msg);
  jb_raw(&b, "}", 1);
  respond(fd, status, "application/json", b.p, b.len);
  jb_free(&b);
}

/* The end of a connection: our side shut, what the peer still sends read away for a moment (a close with unread data
 * would reset the connection and could lose the end of the answer), then closed. */
void linger_close(int fd) {
  shutdown(fd, SHUT_WR);
  char tmp[4096];
  long long until = mono_ms() + 2000;
  for (;;) {
    long long left = until - mono_ms();
    if (left <= 0) break;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (poll(&pfd, 1, (int)left) <= 0) break;
    ssize_t n = read(fd, tmp, sizeof tmp);
    if (n <= 0 && !(n < 0 && (errno == EINTR || errno == EAGAIN))) break;
  }
  close(fd);
}

void jb_raw(struct jbuf *b, const char *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 1024;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) _exit(70);
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

void jb_printf(struct jbuf *b, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n > 0) jb_raw(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A JSON string: control characters, quotes and backslashes escaped; other bytes as they are (names are UTF-8). */
void jb_str(struct jbuf *b, const char *s) {
  jb_raw(b, "\"", 1);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') {
      char e[2] = {'\\', (char)*p};
      jb_raw(b, e, 2);
    } else if (*p < 0x20 || *p == 0x7f) {
      jb_printf(b, "\\u%04x", *p);
    } else {
      jb_raw(b, (const char *)p, 1);
    }
  }
  jb_raw(b, "\"", 1);
}

void jb_free(struct jbuf *b) {
  free(b->p);
  b->p = NULL;
  b->len = b->cap = 0;
}
