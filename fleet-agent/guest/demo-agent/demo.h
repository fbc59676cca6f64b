/* The demo agent's parts (fleet-agent/guest/demo-agent/, compiled together by build-image.ts): HTTP/1.1 requests read and
 * answered (http.c), the routes of the contract (routes.c, listed in main.c), the outbound call (fetch.c), the clocks
 * (clock.c); main.c accepts connections, one thread each. */
#ifndef DEMO_AGENT_H
#define DEMO_AGENT_H

#include <stddef.h>
#include <stdint.h>

#define HEADER_MAX 16384
#define BODY_MAX (16 * 1024 * 1024)

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

/* clock.c */
int64_t now_ms(void);
double wall_ms(void);
double mono_s(void);
void sleep_ms(long ms);

/* http.c */
int send_all(int fd, const char *data, size_t len);
int respond(struct conn *c, struct request *r, int status, const char *type, const char *body, size_t body_len);
int respond_json(struct conn *c, struct request *r, int status, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
int read_request(struct conn *c, struct request *r);
long query_long(const char *query, const char *name, long fallback);
int query_text(const char *query, const char *name, char *out, size_t cap);

/* routes.c */
int route(struct conn *c, struct request *r);

/* fetch.c */
int serve_fetch(struct conn *c, struct request *r);

#endif
