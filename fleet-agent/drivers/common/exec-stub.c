// A process started ahead of need that becomes a VM's hypervisor when told (exec-stubs.ts): a fork of the big
// fleet-agent costs tens of ms of page-table copying on its event loop, an exec of this small waiting one does not.
//
// Reads its whole standard input (until the other end closes it):
//   cwd NUL argc NUL argv[0] NUL … argv[argc-1] NUL env[0] NUL … env[n-1] NUL
// (an empty cwd keeps the current one; argv[0] is looked up on PATH when it has no slash), then puts /dev/null on
// standard input and execs it with exactly that environment. Its stdout and stderr (and process group) are what it was
// started with. Nothing read (the fleet-agent went away before using it): exits 0. An exec that fails says why on
// stderr, prefixed "exec-stub:", and exits 127.
//
// What it execs dies with the fleet-agent (PR_SET_PDEATHSIG, kept across the exec): a host killed with SIGKILL leaves
// no hypervisor running its VMs unmetered and reachable until a restart reaps them, and none at all if it never
// comes back. A fleet-agent that already went away before the exec: nothing is started.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

static char *read_all(size_t *len) {
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  if (!buf) return NULL;
  for (;;) {
    if (n == cap) {
      cap *= 2;
      char *more = realloc(buf, cap);
      if (!more) return NULL;
      buf = more;
    }
    ssize_t r = read(0, buf + n, cap - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return NULL;
    if (r == 0) break;
    n += (size_t)r;
  }
  *len = n;
  return buf;
}

static void fail(const char *what, const char *detail) {
  dprintf(2, "exec-stub: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  _exit(127);
}

int main(void) {
  pid_t parent = getppid();
  size_t len = 0;
  char *buf = read_all(&len);
  if (!buf) fail("cannot read the request", strerror(errno));
  if (len == 0) return 0;
  if (buf[len - 1] != '\0') fail("request does not end in NUL", NULL);
  // Split into fields.
  size_t fields = 0;
  for (size_t i = 0; i < len; i++) fields += buf[i] == '\0';
  char **field = calloc(fields + 1, sizeof(char *));
  if (!field) fail("out of memory", NULL);
  size_t f = 0;
  for (size_t i = 0; i < len; i += strlen(buf + i) + 1) field[f++] = buf + i;
  if (fields < 3) fail("request too short", NULL);
  char *end = NULL;
  long argc = strtol(field[1], &end, 10);
  if (*field[1] == '\0' || *end != '\0' || argc < 1 || (size_t)argc > fields - 2) fail("bad argument count", field[1]);
  char **argv = field + 2;
  char **envp = field + 2 + argc;
  // argv and envp are NULL-terminated: the env list ends at the calloc'd NULL; argv ends where envp begins.
  char **args = calloc((size_t)argc + 1, sizeof(char *));
  if (!args) fail("out of memory", NULL);
  memcpy(args, argv, (size_t)argc * sizeof(char *));
  if (*field[0] != '\0' && chdir(field[0]) != 0) fail(field[0], strerror(errno));
  int devnull = open("/dev/null", O_RDONLY);
  if (devnull < 0 || dup2(devnull, 0) < 0) fail("/dev/null", strerror(errno));
  if (devnull != 0) close(devnull);
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail("prctl", strerror(errno));
  if (getppid() != parent) fail("the fleet-agent is gone", NULL);
  execvpe(args[0], args, envp);
  fail(args[0], strerror(errno));
  return 127;
}
