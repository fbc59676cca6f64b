/* The guest agent's line protocol: "<id> <COMMAND> [args]" lines read from a channel, each dispatched to its handler,
 * which answers "<id> OK …" or "<id> ERR …". The protocol is documented at the top of fleet-agent/drivers/common/guest-agent.ts. */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <unistd.h>
#include "agent.h"

static void handle_line(int fd, char *line) {
  size_t len = strlen(line);
  while (len > 0 && (line[len - 1] == '\r' || line[len - 1] == ' ')) line[--len] = '\0';
  char *space = strchr(line, ' ');
  if (!space) return; /* not a request: no id to answer to */
  *space = '\0';
  const char *id = line;
  for (const char *p = id; *p; p++)
    if (*p < '0' || *p > '9') return;
  char *command = space + 1;
  char *arg = strchr(command, ' ');
  if (arg) *arg++ = '\0';

  if (strcmp(command, "PING") == 0) {
    reply(fd, id, "OK pong");
  } else if (strcmp(command, "GETTIME") == 0) {
    get_time(fd, id);
  } else if (strcmp(command, "SETTIME") == 0) {
    set_time(fd, id, arg);
  } else if (strcmp(command, "LISTENING") == 0) {
    listening(fd, id, arg);
  } else if (strcmp(command, "LEASES") == 0) {
    reply(fd, id, "OK %d", count_leases());
  } else if (strcmp(command, "SYNC") == 0) {
    /* Before a hibernation: the agent's disk then holds everything written so far, so a cold boot from it alone
     * (the memory snapshot lost) finds the files. Blocks this loop while it runs; the host waits with a timeout. */
    sync();
    reply(fd, id, "OK synced");
  } else if (strcmp(command, "IDENTITY") == 0) {
    apply_identity(fd, id, arg);
  } else if (strcmp(command, "CHECKPOINTS") == 0) {
    checkpoint_requests(fd, id);
  } else if (strcmp(command, "EXECKEY") == 0) {
    set_exec_key(fd, id, arg);
  } else if (strcmp(command, "PROBE") == 0) {
    /* Blocks this loop for at most PROBE_MAX_MS (probe.c): a test's tool, the host waits with a timeout. */
    probe_direct(fd, id, arg);
  } else if (strcmp(command, "PROBEVIA") == 0) {
    probe_via(fd, id, arg);
  } else {
    reply(fd, id, "ERR unknown command");
  }
}

/* Reads what is available; answers every complete line. Returns 0 at end of stream. */
int pump(struct channel *ch) {
  ssize_t n = read(ch->fd, ch->buf + ch->len, sizeof ch->buf - ch->len - 1);
  if (n < 0) return (errno == EINTR || errno == EAGAIN) ? 1 : 0;
  if (n == 0) return 0;
  ch->len += (size_t)n;
  ch->buf[ch->len] = '\0';
  char *start = ch->buf;
  char *nl;
  while ((nl = memchr(start, '\n', ch->len - (size_t)(start - ch->buf))) != NULL) {
    *nl = '\0';
    handle_line(ch->fd, start);
    start = nl + 1;
  }
  size_t rest = ch->len - (size_t)(start - ch->buf);
  if (rest == sizeof ch->buf - 1) rest = 0; /* an overlong line: drop it */
  memmove(ch->buf, start, rest);
  ch->len = rest;
  return 1;
}
