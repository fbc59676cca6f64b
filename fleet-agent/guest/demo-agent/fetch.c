/* The demo agent's outbound call (GET /fetch): one HTTP GET through the egress proxy named by $HTTP_PROXY, in absolute
 * form, or with via=connect inside a CONNECT tunnel (as a TLS client reaches HTTPS through $HTTPS_PROXY); directly
 * when no proxy is set. Answered with the upstream's status, content type and body: what an agent that waits on an
 * outbound call (a model) does to its VM, and what reaches it afterwards. With times=N, N such calls one after
 * another (an agent turn of several model calls), answered with a JSON summary of each: status, body bytes and
 * FNV-1a, and the guest's wall-clock times of its sending, first byte and end. The proxy and a direct target are IPv4
 * literals (the guest has no resolver of its own to rely on); a tunnel's target may be a name: the proxy resolves it.
 * With key=K each GET carries `Idempotency-Key: K` (a call through an upstream: recorded once, replayed after). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
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
/* times=N: at most this many calls one after another. */
#define FETCH_TIMES_MAX 1000

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

/* Everything until the far end closes (at most FETCH_MAX); 0 on success. `first_at`: the wall clock (ms) when the
 * first byte came. */
static int read_all(int fd, char **out, size_t *len, double *first_at) {
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
    if (*len == 0) *first_at = wall_ms();
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

/* Where a fetch goes and how: the target, and the proxy ($HTTP_PROXY) when one is set, directly or in a tunnel. */
struct route_plan {
  char url[900];
  struct hostport target;
  const char *path;
  int proxied, tunnel;
  struct hostport proxy;
  /* key=K: sent as `Idempotency-Key: K` (an upstream call the host records and replays); "" for none. */
  char key[128];
};

/* What one exchange got: the status, the content type, the body (inside `resp`, freed by the caller), and when it was
 * sent, when its first byte came and when it ended (the guest's wall clock, ms: it is set right after a wake or doze). */
struct fetched {
  int status;
  char type[256];
  char *resp;
  char *body;
  size_t body_len;
  double sent_at, first_at, end_at;
};

/* One GET along the plan into out; 0, or an HTTP status for the failure with its message in err. */
static int fetch_once(const struct route_plan *p, struct fetched *out, char *err, size_t errcap) {
  memset(out, 0, sizeof *out);
  int fd = dial(p->proxied ? &p->proxy : &p->target);
  if (fd < 0) {
    snprintf(err, errcap, "connect to %s: %s", p->proxied ? "the proxy" : "the target", strerror(errno));
    return 502;
  }
  char req[1400];
  int n;
  if (p->tunnel) {
    n = snprintf(req, sizeof req, "CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n", p->target.host, p->target.port, p->target.host, p->target.port);
    int status = send_all(fd, req, (size_t)n) == 0 ? connect_answer(fd) : -1;
    if (status != 200) {
      close(fd);
      snprintf(err, errcap, "the proxy answered CONNECT with %d", status);
      return 502;
    }
  }
  const char *form = p->proxied && !p->tunnel ? p->url : p->path; /* absolute form to a proxy, origin form otherwise */
  char key_line[160] = "";
  if (p->key[0]) snprintf(key_line, sizeof key_line, "Idempotency-Key: %s\r\n", p->key);
  n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: %s:%d\r\n%sConnection: close\r\n\r\n", form, p->target.host, p->target.port, key_line);
  size_t len = 0;
  out->sent_at = wall_ms();
  int failed = send_all(fd, req, (size_t)n) != 0 || read_all(fd, &out->resp, &len, &out->first_at) != 0;
  int e = errno;
  out->end_at = wall_ms();
  close(fd);
  if (failed) {
    snprintf(err, errcap, "the exchange failed: %s", strerror(e));
    return 502;
  }
  char *body = strstr(out->resp, "\r\n\r\n");
  if (!body || sscanf(out->resp, "HTTP/1.%*d %d", &out->status) != 1) {
    snprintf(err, errcap, "not an HTTP response");
    return 502;
  }
  body[2] = '\0'; /* the head ends with its last header's CRLF */
  body += 4;
  out->body = body;
  out->body_len = len - (size_t)(body - out->resp);
  char value[256];
  snprintf(out->type, sizeof out->type, "application/octet-stream");
  header(out->resp, "Content-Type:", out->type, sizeof out->type);
  if (header(out->resp, "Transfer-Encoding:", value, sizeof value) && strcasestr(value, "chunked")) {
    long decoded = dechunk(out->body, out->body_len);
    if (decoded < 0) {
      snprintf(err, errcap, "a chunked body cut short");
      return 502;
    }
    out->body_len = (size_t)decoded;
  } else if (header(out->resp, "Content-Length:", value, sizeof value) && strtoul(value, NULL, 10) < out->body_len) {
    out->body_len = strtoul(value, NULL, 10);
  }
  return 0;
}

/* A message made safe inside a JSON string (quotes and backslashes become '). */
static char *json_safe(char *msg) {
  for (char *q = msg; *q; q++)
    if (*q == '"' || *q == '\\') *q = '\'';
  return msg;
}

/* FNV-1a, 32 bits (scripts/bench/slow-model.ts computes the same over what it sent). */
static uint32_t fnv1a(const char *data, size_t len) {
  uint32_t h = 0x811c9dc5u;
  for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)data[i]) * 0x01000193u;
  return h;
}

/* times=N: the calls one after another, answered with what each did (per call 200 bytes at most). */
static int serve_times(struct conn *c, struct request *r, const struct route_plan *p, long times) {
  size_t cap = 128 + (size_t)times * 200;
  char *json = malloc(cap);
  if (!json) return respond_json(c, r, 500, "{\"error\":\"out of memory\"}");
  size_t n = 0;
  long ok = 0;
  double began = wall_ms();
  n += (size_t)snprintf(json + n, cap - n, "{\"times\":%ld,\"calls\":[", times);
  for (long i = 0; i < times; i++) {
    struct fetched f;
    char err[160];
    int failed = fetch_once(p, &f, err, sizeof err);
    if (i > 0) json[n++] = ',';
    if (failed) {
      n += (size_t)snprintf(json + n, cap - n, "{\"error\":\"%s\"}", json_safe(err));
    } else {
      ok += f.status >= 200 && f.status < 300;
      n += (size_t)snprintf(json + n, cap - n,
                            "{\"status\":%d,\"bytes\":%zu,\"fnv\":\"%08x\",\"ms\":%.3f,\"sentAt\":%.3f,\"firstByteAt\":%.3f,\"endAt\":%.3f}",
                            f.status, f.body_len, fnv1a(f.body, f.body_len), f.end_at - f.sent_at, f.sent_at, f.first_at, f.end_at);
    }
    free(f.resp);
  }
  n += (size_t)snprintf(json + n, cap - n, "],\"ok\":%ld,\"ms\":%.3f}", ok, wall_ms() - began);
  int rc = respond(c, r, 200, "application/json", json, n);
  free(json);
  return rc;
}

int serve_fetch(struct conn *c, struct request *r) {
  struct route_plan p;
  if (!query_text(r->query, "url", p.url, sizeof p.url) || !parse_http_url(p.url, &p.target, &p.path))
    return respond_json(c, r, 400, "{\"error\":\"url must be http://host[:port]/path (its own query without &)\"}");
  char via[16] = "";
  query_text(r->query, "via", via, sizeof via);
  p.key[0] = '\0';
  query_text(r->query, "key", p.key, sizeof p.key);
  for (const char *k = p.key; *k; k++)
    if (*k < 0x21 || *k > 0x7e) return respond_json(c, r, 400, "{\"error\":\"key must be printable ASCII without spaces\"}");
  p.tunnel = strcmp(via, "connect") == 0;
  long times = query_long(r->query, "times", 0);
  if (times < 0 || times > FETCH_TIMES_MAX) return respond_json(c, r, 400, "{\"error\":\"times must be 1 to %d\"}", FETCH_TIMES_MAX);
  const char *proxy_url = getenv("HTTP_PROXY");
  const char *proxy_path;
  p.proxied = proxy_url && *proxy_url;
  if (p.proxied && !parse_http_url(proxy_url, &p.proxy, &proxy_path)) return respond_json(c, r, 502, "{\"error\":\"HTTP_PROXY is not http://ip:port\"}");
  if (p.tunnel && !p.proxied) return respond_json(c, r, 502, "{\"error\":\"via=connect needs HTTP_PROXY\"}");
  if (times > 0) return serve_times(c, r, &p, times);
  struct fetched f;
  char err[160];
  int failed = fetch_once(&p, &f, err, sizeof err);
  int rc = failed ? respond_json(c, r, failed, "{\"error\":\"%s\"}", json_safe(err)) : respond(c, r, f.status, f.type, f.body, f.body_len);
  free(f.resp);
  return rc;
}
