/* The guest agent's LISTENING: whether a socket in the guest listens on a TCP port (/proc/net/tcp and tcp6, state 0A).
 * The host's readiness check for an image's agent: it sends the workload nothing (a probe request would be a call the
 * agent sees and counts), and unlike a connection through QEMU's user networking, whose host side accepts before the
 * guest does, it is the guest's own answer. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "agent.h"

/* 1 when a line of `path` (the kernel's table: "sl local_address rem_address st …", addresses as HEX_IP:HEX_PORT)
 * is a listening socket (st 0A) on `port`; 0 when none is or the table cannot be read. */
static int listens_in(const char *path, unsigned port) {
  FILE *f = fopen(path, "re");
  if (!f) return 0;
  char line[512];
  int found = 0;
  if (!fgets(line, sizeof line, f)) goto done; /* the header */
  while (!found && fgets(line, sizeof line, f)) {
    char local[128], remote[128], state[8];
    if (sscanf(line, " %*s %127s %127s %7s", local, remote, state) != 3) continue;
    const char *colon = strrchr(local, ':');
    if (!colon) continue;
    if (strtoul(colon + 1, NULL, 16) == port && strcmp(state, "0A") == 0) found = 1;
  }
done:
  fclose(f);
  return found;
}

void listening(int out, const char *id, const char *arg) {
  char *end;
  unsigned long port = arg ? strtoul(arg, &end, 10) : 0;
  if (!arg || *arg == '\0' || *end != '\0' || port == 0 || port > 65535) {
    reply(out, id, "ERR bad port");
    return;
  }
  int yes = listens_in("/proc/net/tcp", (unsigned)port) || listens_in("/proc/net/tcp6", (unsigned)port);
  reply(out, id, "OK %d", yes);
}
