/* The demo agent's outbound call (GET /fetch): one HTTP GET through the egress proxy named by $HTTP_PROXY, in absolute
 * form, or with via=connect inside a CONNECT tunnel (as a TLS client reaches HTTPS through $HTTPS_PROXY); directly
 * when no proxy is set. Answered with the upstream's status, content type and body: what an agent that waits on an
 * outbound call (a model) does to its VM, and what reaches it afterwards. The proxy and a direct target are IPv4
 * literals (the guest has no resolver of its own to rely on); a tunnel's target may be a name: the proxy resolves it. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include "demo.h"

#define FETCH_MAX (4 * 1024 * 1024)
/* A model may take minutes to answer; a stopped guest's clock does not run meanwhile anyway. */
#define FETCH_TIMEOUT_S 300

struct hostport {
  char host[256];
  int port;
};

/* "host:port" (n bytes of s) into hp; 0 when it is not one. */
static int parse_hostport(const char *s, size_t n, struct hostport *hp) {
  const char *colon = memrchr(s, ':', n);
  if (!colon || colon == s || (size_t)(colon - s) >= sizeof hp->host) return 0;
  memcpy(hp->host, s, (size_t)(colon - s));
  hp->host[colon - s] = '\0';
  char digits[8];
  size_t dn = n - (size_t)(colon - s) - 1;
  if (dn == 0 || dn >= sizeof digits) return 0;
  memcpy(digits, colon + 1, dn);
  digits[dn] = '\0';
  char *end;
  long port = strtol(digits, &end, 10);
  if (*end || port < 1 || port > 65535) return 0;
  hp->port = (int)port;
  return 1;
}

/* "http://host[:port][/path]" into hp and the path ("/" when absent); 0 when it is not one. */
static int parse_http_url(const char *url, struct hostport *hp, const char **path) {
  if (strncmp(url, "http://", 7) != 0) return 0;
  const char *authority = url + 7;
  const char *slash = strchr(authority, '/');
  size_t n = slash ? (size_t)(slash - authority) : strlen(authority);
  *path = slash ? slash : "/";
  if (memchr(authority, ':', n)) return parse_hostport(authority, n, hp);
  if (n == 0 || n >= sizeof hp->host) return 0;
  memcpy(hp->host, authority, n);
  hp->host[n] = '\0';
  hp->port = 80;
  return 1;
}

/* A TCP connection to an IPv4 literal; -1 with errno set. */
static int dial(const struct hostport *hp) {
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)hp->port)};
  if (inet_pton(AF_INET, hp->host, &addr.sin_addr) != 1) {
    errno = EINVAL;
    return -1;
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct timeval t = {.tv_sec = FETCH_TIMEOUT_S};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof t);
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

/* The proxy's answer to CONNECT, read byte by byte so that nothing of the tunnel's own bytes is taken; its status or -1. */
static int connect_answer(int fd) {
  char head[2048];
  size_t n = 0;
  while (n < sizeof head - 1) {
    ssize_t got = recv(fd, head + n, 1, 0);
    if (got <= 0) return -1;
    n++;
    if (n >= 4 && memcmp(head + n - 4, "\r\n\r\n", 4) == 0) break;
  }
  head[n] = '\0';
  int status;
  return sscanf(head, "HTTP/1.%*d %d", &status) == 1 ? status : -1;
}

/* Everything until the far end closes (at most FETCH_MAX); 0 on success. */
static int read_all(int fd, char **out, size_t *len) {
  size_t cap = 16384;
  char *buf = malloc(cap);
  *len = 0;
  while (buf) {
    if (cap - *len < 4096) {
      if (cap >= FETCH_MAX) break;
      char *next = realloc(buf, cap * 2);
      if (!next) break;
      buf = next;
      cap *= 2;
    }
    ssize_t got = recv(fd, buf + *len, cap - *len - 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) break;
    if (got == 0) {
      buf[*len] = '\0';
      *out = buf;
      return 0;
    }
    *len += (size_t)got;
  }
  free(buf);
  return -1;
}

/* A chunked body decoded in place; its new length, or -1 when it is malformed or cut short. */
static long dechunk(char *body, size_t len) {
  size_t in = 0, out = 0;
  for (;;) {
    char *end;
    unsigned long size = strtoul(body + in, &end, 16);
    char *crlf = memmem(body + in, len - in, "\r\n", 2);
    if (end == body + in || !crlf) return -1;
    in = (size_t)(crlf - body) + 2;
    if (size == 0) return (long)out;
    if (size > len - in || len - in - size < 2) return -1;
    memmove(body + out, body + in, size);
    out += size;
    in += size + 2;
  }
}

/* The value of a header (name with its colon, e.g. "Content-Type:") in a response head, copied into out; 0 when absent. */
static int header(const char *head, const char *name, char *out, size_t cap) {
  const char *line = strstr(head, "\r\n");
  size_t len = strlen(name);
  while (line && line[2] != '\r') {
    line += 2;
    if (strncasecmp(line, name, len) == 0) {
      const char *v = line + len;
      while (*v == ' ' || *v == '\t') v++;
      size_t n = strcspn(v, "\r\n");
      if (n >= cap) n = cap - 1;
      memcpy(out, v, n);
      out[n] = '\0';
      return 1;
    }
    line = strstr(line, "\r\n");
  }
  return 0;
}

int serve_fetch(struct conn *c, struct request *r) {
  char url[900];
  struct hostport target, proxy;
  const char *path;
  if (!query_text(r->query, "url", url, sizeof url) || !parse_http_url(url, &target, &path))
    return respond_json(c, r, 400, "{\"error\":\"url must be http://host[:port]/path (its own query without &)\"}");
  char via[16] = "";
  query_text(r->query, "via", via, sizeof via);
  int tunnel = strcmp(via, "connect") == 0;
  const char *proxy_url = getenv("HTTP_PROXY");
  const char *proxy_path;
  int proxied = proxy_url && *proxy_url;
  if (proxied && !parse_http_url(proxy_url, &proxy, &proxy_path)) return respond_json(c, r, 502, "{\"error\":\"HTTP_PROXY is not http://ip:port\"}");
  if (tunnel && !proxied) return respond_json(c, r, 502, "{\"error\":\"via=connect needs HTTP_PROXY\"}");
  int fd = dial(proxied ? &proxy : &target);
  if (fd < 0) return respond_json(c, r, 502, "{\"error\":\"connect to %s: %s\"}", proxied ? "the proxy" : "the target", strerror(errno));
  char req[1400];
  int n;
  if (tunnel) {
    n = snprintf(req, sizeof req, "CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n", target.host, target.port, target.host, target.port);
    int status = send_all(fd, req, (size_t)n) == 0 ? connect_answer(fd) : -1;
    if (status != 200) {
      close(fd);
      return respond_json(c, r, 502, "{\"error\":\"the proxy answered CONNECT with %d\"}", status);
    }
  }
  const char *form = proxied && !tunnel ? url : path; /* absolute form to a proxy, origin form otherwise */
  n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n", form, target.host, target.port);
  char *resp = NULL;
  size_t len = 0;
  int failed = send_all(fd, req, (size_t)n) != 0 || read_all(fd, &resp, &len) != 0;
  int err = errno;
  close(fd);
  if (failed) return respond_json(c, r, 502, "{\"error\":\"the exchange failed: %s\"}", strerror(err));
  int status;
  char *body = strstr(resp, "\r\n\r\n");
  if (!body || sscanf(resp, "HTTP/1.%*d %d", &status) != 1) {
    free(resp);
    return respond_json(c, r, 502, "{\"error\":\"not an HTTP response\"}");
  }
  body[2] = '\0'; /* the head ends with its last header's CRLF */
  body += 4;
  size_t body_len = len - (size_t)(body - resp);
  char value[256], type[256] = "application/octet-stream";
  header(resp, "Content-Type:", type, sizeof type);
  if (header(resp, "Transfer-Encoding:", value, sizeof value) && strcasestr(value, "chunked")) {
    long decoded = dechunk(body, body_len);
    if (decoded < 0) {
      free(resp);
      return respond_json(c, r, 502, "{\"error\":\"a chunked body cut short\"}");
    }
    body_len = (size_t)decoded;
  } else if (header(resp, "Content-Length:", value, sizeof value) && strtoul(value, NULL, 10) < body_len) {
    body_len = strtoul(value, NULL, 10);
  }
  int rc = respond(c, r, status, type, body, body_len);
  free(resp);
  return rc;
}
