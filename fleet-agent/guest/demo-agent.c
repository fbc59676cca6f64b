/* Demo agent workload: a small HTTP/1.1 server (default port 8080, or $PORT) with the contract the
 * tests and benchmarks use against every driver:
 *   GET /                → 200 {"ok":true,"agent":"demo"}      GET /healthz → 200 ok
 *   GET /counter         → {"count":N}                         POST /counter → increments, {"count":N}
 *   GET /clock           → {"nowMs":<guest wall clock ms>}
 *   GET /sse?n=&intervalMs= → text/event-stream, n events "id: i\ndata: {"i":i,"nowMs":…}\n\n" (i from 0), then ends
 *   POST /work?seconds=S[&lease=1] → 202 {"started":true}; burns CPU for S s (holding a lease file when asked)
 *   POST /echo           → 200 with the request body (Content-Length or chunked) and its content-type
 *   GET /status/CODE     → that status, body {"status":CODE}  GET /slow?ms=N → waits, 200 {"slept":N}
 *   GET /identity        → the identity the host gave this VM (/run/agentvm/identity, text), 404 before any
 *   GET /random          → 32 hex characters from getrandom(16 bytes)
 *   POST /checkpoint?name=N → 202 {"requested":N}: asks the host for a checkpoint (/run/agentvm/checkpoint-requests/N)
 *   anything else        → 404 {"error":"not found","path":…}   (same contract as fleet-agent/workloads/demo.ts,
 *                          which has no identity, /random or checkpoint routes)
 * Keep-alive, one thread per connection. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define HEADER_MAX 16384
#define BODY_MAX (16 * 1024 * 1024)
#define IDLE_TIMEOUT_S 120
#define LEASE_DIR "/run/leases"
#define IDENTITY_PATH "/run/agentvm/identity"
#define CHECKPOINT_DIR "/run/agentvm/checkpoint-requests"

static long counter = 0;
static long job_seq = 0;

struct conn {
  int fd;
  char *buf; /* bytes read but not consumed yet (pipelined requests) */
  size_t len, cap;
};

struct request {
  char method[16];
  char path[1024];
  char query[1024];
  int http10;
  int keep_alive;
  long content_length; /* -1 when absent */
  int chunked;
  char content_type[256];
  char *body;
  size_t body_len;
};

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(long ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static int send_all(int fd, const char *data, size_t len) {
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

static int respond(struct conn *c, struct request *r, int status, const char *type, const char *body, size_t body_len) {
  int no_body = status == 204 || status == 304 || (status >= 100 && status < 200);
  char head[512];
  int n = snprintf(head, sizeof head, "HTTP/1.1 %d %s\r\n", status, reason(status));
  if (!no_body) n += snprintf(head + n, sizeof head - (size_t)n, "Content-Type: %s\r\nContent-Length: %zu\r\n", type, body_len);
  n += snprintf(head + n, sizeof head - (size_t)n, "Connection: %s\r\n\r\n", r->keep_alive ? "keep-alive" : "close");
  if (send_all(c->fd, head, (size_t)n) != 0) return -1;
  if (!no_body && strcmp(r->method, "HEAD") != 0 && body_len > 0) return send_all(c->fd, body, body_len);
  return 0;
}

static int respond_json(struct conn *c, struct request *r, int status, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int respond_json(struct conn *c, struct request *r, int status, const char *fmt, ...) {
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
static int read_request(struct conn *c, struct request *r) {
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

static long query_long(const char *query, const char *name, long fallback) {
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
static int query_text(const char *query, const char *name, char *out, size_t cap) {
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

static int serve_identity(struct conn *c, struct request *r) {
  char content[1024];
  int fd = open(IDENTITY_PATH, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return respond_json(c, r, 404, "{\"error\":\"no identity yet\"}");
  ssize_t n = read(fd, content, sizeof content);
  close(fd);
  if (n < 0) return respond_json(c, r, 500, "{\"error\":\"cannot read the identity\"}");
  return respond(c, r, 200, "text/plain", content, (size_t)n);
}

static int serve_random(struct conn *c, struct request *r) {
  unsigned char bytes[16];
  if (getrandom(bytes, sizeof bytes, 0) != (ssize_t)sizeof bytes) return respond_json(c, r, 500, "{\"error\":\"getrandom failed\"}");
  char hex[33];
  for (size_t i = 0; i < sizeof bytes; i++) snprintf(hex + 2 * i, 3, "%02x", bytes[i]);
  return respond(c, r, 200, "text/plain", hex, 32);
}

/* A checkpoint request is an empty file named after it; the guest agent hands it to the host on its next poll. */
static int request_checkpoint(struct conn *c, struct request *r) {
  char name[65];
  int ok = query_text(r->query, "name", name, sizeof name) && name[0] && name[0] != '.';
  for (const char *p = name; ok && *p; p++)
    ok = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' || *p == '-';
  if (!ok) return respond_json(c, r, 400, "{\"error\":\"name must match [A-Za-z0-9._-]{1,64}, not starting with a dot\"}");
  char path[sizeof CHECKPOINT_DIR + 72];
  snprintf(path, sizeof path, "%s/%s", CHECKPOINT_DIR, name);
  int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return respond_json(c, r, 500, "{\"error\":\"cannot make the request: %s\"}", strerror(errno));
  close(fd);
  return respond_json(c, r, 202, "{\"requested\":\"%s\"}", name);
}

struct job {
  long seconds;
  int lease;
};

static void *burn(void *arg) {
  struct job job = *(struct job *)arg;
  free(arg);
  char lease_path[128] = "";
  if (job.lease) {
    long id = __atomic_add_fetch(&job_seq, 1, __ATOMIC_SEQ_CST);
    snprintf(lease_path, sizeof lease_path, "%s/work-%ld", LEASE_DIR, id);
    mkdir(LEASE_DIR, 0777);
    FILE *f = fopen(lease_path, "w");
    if (f) {
      fprintf(f, "%lld\n", (long long)(time(NULL) + job.seconds + 1));
      fclose(f);
    }
  }
  double until = mono_s() + (double)job.seconds;
  volatile uint64_t x = 1;
  while (mono_s() < until)
    for (int i = 0; i < 100000; i++) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
  if (lease_path[0]) unlink(lease_path);
  return NULL;
}

static int serve_sse(struct conn *c, struct request *r) {
  long n = query_long(r->query, "n", 5);
  long interval = query_long(r->query, "intervalMs", 200);
  if (n < 0) n = 0;
  if (interval < 0) interval = 0;
  const char *head =
      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
      "Transfer-Encoding: chunked\r\n";
  char buf[512];
  int len = snprintf(buf, sizeof buf, "%sConnection: %s\r\n\r\n", head, r->keep_alive ? "keep-alive" : "close");
  if (send_all(c->fd, buf, (size_t)len) != 0) return -1;
  for (long i = 0; i < n; i++) {
    if (i > 0 && interval > 0) sleep_ms(interval);
    char event[256];
    int elen = snprintf(event, sizeof event, "id: %ld\ndata: {\"i\":%ld,\"nowMs\":%lld}\n\n", i, i, (long long)now_ms());
    len = snprintf(buf, sizeof buf, "%x\r\n%s\r\n", elen, event);
    if (send_all(c->fd, buf, (size_t)len) != 0) return -1;
  }
  return send_all(c->fd, "0\r\n\r\n", 5);
}

static int route(struct conn *c, struct request *r) {
  int get = strcmp(r->method, "GET") == 0 || strcmp(r->method, "HEAD") == 0;
  int post = strcmp(r->method, "POST") == 0;
  const char *p = r->path;
  if (strcmp(p, "/") == 0 && get) return respond_json(c, r, 200, "{\"ok\":true,\"agent\":\"demo\"}");
  if (strcmp(p, "/healthz") == 0 && get) return respond(c, r, 200, "text/plain", "ok", 2);
  if (strcmp(p, "/counter") == 0 && get) return respond_json(c, r, 200, "{\"count\":%ld}", __atomic_load_n(&counter, __ATOMIC_SEQ_CST));
  if (strcmp(p, "/counter") == 0 && post) return respond_json(c, r, 200, "{\"count\":%ld}", __atomic_add_fetch(&counter, 1, __ATOMIC_SEQ_CST));
  if (strcmp(p, "/clock") == 0 && get) return respond_json(c, r, 200, "{\"nowMs\":%lld}", (long long)now_ms());
  if (strcmp(p, "/sse") == 0 && get) return serve_sse(c, r);
  if (strcmp(p, "/identity") == 0 && get) return serve_identity(c, r);
  if (strcmp(p, "/random") == 0 && get) return serve_random(c, r);
  if (strcmp(p, "/checkpoint") == 0 && post) return request_checkpoint(c, r);
  if (strcmp(p, "/work") == 0 && post) {
    struct job *job = malloc(sizeof *job);
    if (!job) return respond_json(c, r, 500, "{\"error\":\"out of memory\"}");
    job->seconds = query_long(r->query, "seconds", 1);
    job->lease = query_long(r->query, "lease", 0) == 1;
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int err = pthread_create(&t, &attr, burn, job);
    pthread_attr_destroy(&attr);
    if (err) {
      free(job);
      return respond_json(c, r, 500, "{\"error\":\"cannot start job\"}");
    }
    return respond_json(c, r, 202, "{\"started\":true}");
  }
  if (strcmp(p, "/echo") == 0 && post)
    return respond(c, r, 200, r->content_type[0] ? r->content_type : "application/octet-stream", r->body ? r->body : "", r->body_len);
  if (strncmp(p, "/status/", 8) == 0) {
    long code = strtol(p + 8, NULL, 10);
    if (code < 100 || code > 599 || strlen(p) != 11) return respond_json(c, r, 400, "{\"error\":\"bad status\"}");
    return respond_json(c, r, (int)code, "{\"status\":%ld}", code);
  }
  if (strcmp(p, "/slow") == 0 && get) {
    long ms = query_long(r->query, "ms", 1000);
    if (ms > 0) sleep_ms(ms);
    return respond_json(c, r, 200, "{\"slept\":%ld}", ms);
  }
  char escaped[1100];
  size_t n = 0;
  for (const char *q = p; *q && n < sizeof escaped - 8; q++) {
    if (*q == '"' || *q == '\\') escaped[n++] = '\\';
    if ((unsigned char)*q >= 0x20) escaped[n++] = *q;
  }
  escaped[n] = '\0';
  return respond_json(c, r, 404, "{\"error\":\"not found\",\"path\":\"%s\"}", escaped);
}

static void *serve(void *arg) {
  struct conn c = {.fd = (int)(intptr_t)arg, .cap = 8192};
  c.buf = malloc(c.cap);
  struct timeval idle = {.tv_sec = IDLE_TIMEOUT_S};
  setsockopt(c.fd, SOL_SOCKET, SO_RCVTIMEO, &idle, sizeof idle);
  int one = 1;
  setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  while (c.buf) {
    struct request r;
    if (read_request(&c, &r) != 0) break;
    int rc = route(&c, &r);
    free(r.body);
    if (rc != 0 || !r.keep_alive) break;
  }
  free(c.buf);
  close(c.fd);
  return NULL;
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const char *port_env = getenv("PORT");
  int port = port_env ? atoi(port_env) : 8080;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_ANY)};
  if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 512) != 0) {
    perror("demo-agent: listen");
    return 1;
  }
  fprintf(stderr, "demo-agent: listening on port %d\n", port);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  for (;;) {
    int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno != EINTR) sleep_ms(10);
      continue;
    }
    pthread_t t;
    if (pthread_create(&t, &attr, serve, (void *)(intptr_t)c) != 0) close(c);
  }
}
