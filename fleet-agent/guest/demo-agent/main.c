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
 *   GET /fetch?url=http://HOST:PORT/PATH[&via=connect][&key=K] → GET PATH from there through $HTTP_PROXY (absolute form,
 *                          or in a CONNECT tunnel; with `Idempotency-Key: K`), answered with its status, type and
 *                          body; 502 {"error":…} when it fails
 *   GET /fetch?…&times=N → N such GETs one after another, 200 {"times":N,"calls":[{"status","bytes","fnv","ms",
 *                          "sentAt","firstByteAt","endAt"} or {"error"}…],"ok":N,"ms":…} (guest wall-clock ms)
 *   anything else        → 404 {"error":"not found","path":…}   (same contract as fleet-agent/workloads/demo.ts,
 *                          which has no identity, /random, checkpoint or fetch routes)
 * Keep-alive, one thread per connection (this file; the parts in demo.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include "demo.h"

#define IDLE_TIMEOUT_S 120

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
