/* The demo agent's routes: the contract listed at the top of main.c (counter, clock, SSE, CPU work holding a lease,
 * echo, statuses, slow answers, the identity, random bytes, checkpoint requests, an outbound call: fetch.c). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "demo.h"

#define LEASE_DIR "/run/leases"
#define IDENTITY_PATH "/run/agentvm/identity"
#define CHECKPOINT_DIR "/run/agentvm/checkpoint-requests"

static long counter = 0;
static long job_seq = 0;

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

int route(struct conn *c, struct request *r) {
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
  if (strcmp(p, "/fetch") == 0 && get) return serve_fetch(c, r);
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
