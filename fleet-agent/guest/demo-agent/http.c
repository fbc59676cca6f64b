/* The demo agent's HTTP/1.1: a request's head and body read off a keep-alive connection (Content-Length or chunked,
 * pipelined requests kept for the next), answers written with their length, and query parameters. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include "demo.h"

int send_all(int fd, const char *data, size_t len) {
  while (len > 0) {
    ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    data += n;
    len -= (size_t)n;
  }
  return 0;
}

static const char *reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Status";
  }
}

int respond(struct conn *c, struct request *r, int status, const char *type, const char *body, size_t body_len) {
  int no_body = status == 204 || status == 304 || (status >= 100 && status < 200);
  char head[512];
  int n = snprintf(head, sizeof head, "HTTP/1.1 %d %s\r\n", status, reason(status));
  if (!no_body) n += snprintf(head + n, sizeof head - (size_t)n, "Content-Type: %s\r\nContent-Length: %zu\r\n", type, body_len);
  n += snprintf(head + n, sizeof head - (size_t)n, "Connection: %s\r\n\r\n", r->keep_alive ? "keep-alive" : "close");
  if (send_all(c->fd, head, (size_t)n) != 0) return -1;
  if (!no_body && strcmp(r->method, "HEAD") != 0 && body_len > 0) return send_all(c->fd, body, body_len);
  return 0;
}

int respond_json(struct conn *c, struct request *r, int status, const char *fmt, ...) {
  char body[1400];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);
  return respond(c, r, status, "application/json", body, (size_t)n);
}

/* Reads more bytes into the connection buffer; 0 on end of stream or error. */
static int fill(struct conn *c) {
  if (c->cap - c->len < 4096) {
    size_t cap = c->cap * 2;
    char *next = realloc(c->buf, cap);
    if (!next) return 0;
    c->buf = next;
    c->cap = cap;
  }
  for (;;) {
    ssize_t n = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return 0;
    c->len += (size_t)n;
    return 1;
  }
}

static void consume(struct conn *c, size_t n) {
  memmove(c->buf, c->buf + n, c->len - n);
  c->len -= n;
}

/* Takes exactly n body bytes off the connection into a fresh buffer; NULL on a short read. */
static char *take_bytes(struct conn *c, size_t n) {
  while (c->len < n)
    if (!fill(c)) return NULL;
  char *out = malloc(n + 1);
  if (!out) return NULL;
  memcpy(out, c->buf, n);
  out[n] = '\0';
  consume(c, n);
  return out;
}

/* Index just past the next CRLF-terminated line in the buffer, reading more as needed; 0 on failure. */
static size_t line_end(struct conn *c, size_t limit) {
  for (;;) {
    char *nl = memmem(c->buf, c->len, "\r\n", 2);
    if (nl) return (size_t)(nl - c->buf) + 2;
    if (c->len > limit || !fill(c)) return 0;
  }
}

static int read_chunked(struct conn *c, struct request *r) {
  size_t total = 0, cap = 4096;
  char *body = malloc(cap);
  if (!body) return -1;
  for (;;) {
    size_t end = line_end(c, 1024);
    if (!end) goto fail;
    size_t size = strtoul(c->buf, NULL, 16);
    consume(c, end);
    if (size == 0) break;
    if (total + size > BODY_MAX) goto fail;
    char *chunk = take_bytes(c, size);
    if (!chunk) goto fail;
    if (total + size + 1 > cap) {
      while (total + size + 1 > cap) cap *= 2;
      char *next = realloc(body, cap);
      if (!next) { free(chunk); goto fail; }
      body = next;
    }
    memcpy(body + total, chunk, size);
    total += size;
    free(chunk);
    end = line_end(c, 16); /* the CRLF after the chunk data */
    if (!end) goto fail;
    consume(c, end);
  }
  for (;;) { /* trailers up to the empty line */
    size_t end = line_end(c, HEADER_MAX);
    if (!end) goto fail;
    consume(c, end);
    if (end == 2) break;
  }
  body[total] = '\0';
  r->body = body;
  r->body_len = total;
  return 0;
fail:
  free(body);
  return -1;
}

/* Parses one request head and reads its body. -1 when the connection is done. */
int read_request(struct conn *c, struct request *r) {
  memset(r, 0, sizeof *r);
  r->content_length = -1;
  char *end;
  while ((end = memmem(c->buf, c->len, "\r\n\r\n", 4)) == NULL) {
    if (c->len > HEADER_MAX || !fill(c)) return -1;
  }
  size_t head_len = (size_t)(end - c->buf) + 4;
  char *head = malloc(head_len + 1);
  if (!head) return -1;
  memcpy(head, c->buf, head_len);
  head[head_len] = '\0';
  consume(c, head_len);

  char *save = NULL;
  char *line = strtok_r(head, "\r\n", &save);
  char target[2048] = "", version[16] = "";
  if (!line || sscanf(line, "%15s %2047s %15s", r->method, target, version) != 3) {
    free(head);
    return -1;
  }
  r->http10 = strcmp(version, "HTTP/1.0") == 0;
  r->keep_alive = !r->http10;
  char *q = strchr(target, '?');
  if (q) {
    *q = '\0';
    snprintf(r->query, sizeof r->query, "%s", q + 1);
  }
  snprintf(r->path, sizeof r->path, "%s", target);
  while ((line = strtok_r(NULL, "\r\n", &save)) != NULL) {
    char *colon = strchr(line, ':');
    if (!colon) continue;
    *colon = '\0';
    char *value = colon + 1;
    while (*value == ' ' || *value == '\t') value++;
    if (strcasecmp(line, "Content-Length") == 0) r->content_length = strtol(value, NULL, 10);
    else if (strcasecmp(line, "Transfer-Encoding") == 0) r->chunked = strcasestr(value, "chunked") != NULL;
    else if (strcasecmp(line, "Content-Type") == 0) snprintf(r->content_type, sizeof r->content_type, "%s", value);
    else if (strcasecmp(line, "Connection") == 0) {
      if (strcasestr(value, "close")) r->keep_alive = 0;
      else if (strcasestr(value, "keep-alive")) r->keep_alive = 1;
    }
  }
  free(head);
  if (r->chunked) return read_chunked(c, r);
  if (r->content_length > BODY_MAX) return -1;
  if (r->content_length > 0) {
    r->body = take_bytes(c, (size_t)r->content_length);
    if (!r->body) return -1;
    r->body_len = (size_t)r->content_length;
  }
  return 0;
}

long query_long(const char *query, const char *name, long fallback) {
  size_t len = strlen(name);
  const char *p = query;
  while (p && *p) {
    if (strncmp(p, name, len) == 0 && p[len] == '=') return strtol(p + len + 1, NULL, 10);
    p = strchr(p, '&');
    if (p) p++;
  }
  return fallback;
}

/* The value of query parameter `name` copied into out; 0 when absent or too long. */
int query_text(const char *query, const char *name, char *out, size_t cap) {
  size_t len = strlen(name);
  const char *p = query;
  while (p && *p) {
    if (strncmp(p, name, len) == 0 && p[len] == '=') {
      const char *v = p + len + 1;
      size_t n = strcspn(v, "&");
      if (n >= cap) return 0;
      memcpy(out, v, n);
      out[n] = '\0';
      return 1;
    }
    p = strchr(p, '&');
    if (p) p++;
  }
  return 0;
}
