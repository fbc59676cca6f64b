/* The guest agent's clock: GETTIME, and SETTIME, the clock fix the host sends after every boot and restore (with the
 * neighbour table's flush a restore may need). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "agent.h"

/* Newest host timestamp applied so far: an older one is a delayed retry and must not move the clock back. */
static int64_t last_applied_sec = -1;
static int64_t last_applied_nsec = 0;

/* "<sec>.<nsec9>" → seconds and nanoseconds; exactly nine fraction digits like the host sends. */
static int parse_time(const char *text, int64_t *sec, int64_t *nsec) {
  char *end;
  errno = 0;
  long long s = strtoll(text, &end, 10);
  if (errno || end == text || *end != '.' || s < 0) return -1;
  const char *frac = end + 1;
  int64_t ns = 0;
  int digits = 0;
  while (frac[digits] >= '0' && frac[digits] <= '9') {
    ns = ns * 10 + (frac[digits] - '0');
    digits++;
  }
  if (digits != 9 || (frac[digits] != '\0' && frac[digits] != '\r')) return -1;
  *sec = s;
  *nsec = ns;
  return 0;
}

/* After a restore the host side of the network is a new process (a new QEMU's user network, perhaps with a guestfwd
 * the old one lacked, such as the egress proxy after egress was turned on). An address the guest failed to resolve
 * before the snapshot stays a FAILED neighbour in its memory, and connections to it keep failing after the restore
 * (seen: the egress proxy unreachable). So the clock fix, which follows every restore, also flushes the neighbour
 * table when /proc/net/arp holds an unresolved entry (flags 0x0); when none is, it costs one read, no process. The
 * host skips it (`same-net`) when the addresses it forwards are the ones the guest last saw. */
static void forget_unresolved_neighbours(void) {
  FILE *arp = fopen("/proc/net/arp", "r");
  if (!arp) return;
  char line[256];
  int unresolved = 0;
  if (fgets(line, sizeof line, arp)) { /* header */
    while (fgets(line, sizeof line, arp)) {
      char ip[64], hw[64], flags[16];
      if (sscanf(line, "%63s %63s %15s", ip, hw, flags) == 3 && strcmp(flags, "0x0") == 0) unresolved = 1;
    }
  }
  fclose(arp);
  if (!unresolved) return;
  if (system("ip neigh flush all >/dev/null 2>&1") != 0) log_line("could not flush the neighbour table after a restore");
}

/* GETTIME */
void get_time(int out, const char *id) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  reply(out, id, "OK %lld.%09ld", (long long)ts.tv_sec, ts.tv_nsec);
}

/* SETTIME <sec>.<nsec9> [same-net] */
void set_time(int out, const char *id, char *arg) {
  struct timespec ts;
  /* "SETTIME <time> same-net": the host side of the network is the one the guest last ran against (the same QEMU,
   * or one with the same forwarded addresses), so no neighbour can have become resolvable: the check, a read of
   * /proc/net/arp through code a restored guest has not run yet under TCG (~20 ms), is skipped. */
  int same_net = 0;
  char *flag = arg ? strchr(arg, ' ') : NULL;
  if (flag) {
    *flag++ = '\0';
    if (strcmp(flag, "same-net") != 0) {
      reply(out, id, "ERR bad time");
      return;
    }
    same_net = 1;
  }
  int64_t sec, nsec;
  if (!arg || parse_time(arg, &sec, &nsec) != 0) {
    reply(out, id, "ERR bad time");
    return;
  }
  if (sec < last_applied_sec || (sec == last_applied_sec && nsec < last_applied_nsec)) {
    clock_gettime(CLOCK_REALTIME, &ts);
    reply(out, id, "OK stale %lld.%09ld", (long long)ts.tv_sec, ts.tv_nsec);
    return;
  }
  struct timespec target = {.tv_sec = (time_t)sec, .tv_nsec = (long)nsec};
  if (clock_settime(CLOCK_REALTIME, &target) != 0) {
    reply(out, id, "ERR clock_settime: %s", strerror(errno));
    return;
  }
  last_applied_sec = sec;
  last_applied_nsec = nsec;
  if (!same_net) forget_unresolved_neighbours();
  clock_gettime(CLOCK_REALTIME, &ts);
  reply(out, id, "OK %lld.%09ld", (long long)ts.tv_sec, ts.tv_nsec);
}
