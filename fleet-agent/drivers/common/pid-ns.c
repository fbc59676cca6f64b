// Runs a process-driver workload (or its exec server) as the first process of a PID namespace of its own, so that
// nothing it starts outlives it: when the namespace's init goes, the kernel kills every process in the namespace,
// also those that left the workload's process group or session (a daemon, a worker pool, `sh -c 'sleep 1000 &'`).
//
//   pid-ns --parent <pid> -- <command> [args...]     run <command> so (its PATH searched when it has no slash)
//   pid-ns --probe                                    exit 0 when a PID namespace can be made here, else 1 and why
//
// Three processes, each dying with the one above it (PR_SET_PDEATHSIG SIGKILL):
// - the outer one: this program, the fleet-agent's child (<pid> is the fleet-agent: a parent already gone before the
//   death signal was set starts nothing), the pid the driver knows. It makes the namespace, forks its init, forwards
//   SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to it, and ends as the command ended: the same exit status,
//   or killed by the same signal.
// - the init (pid 1 inside): forks the command, forwards those signals to the command's process group, reaps the orphans
//   the namespace's processes leave, and exits as soon as the command has ended, telling the outer one how (a pipe):
//   the kernel then ends everything else in the namespace before the outer one sees the init go.
// - the command (pid 2 inside), in a session of its own, as the fleet-agent's detached children are.
// SIGSTOP and SIGCONT cannot be forwarded: the driver sends them to the whole tree below the outer pid, which holds
// every process of the namespace (an orphan inside is reparented to the init, never out of it).
//
// Only a PID namespace: the mounts (and so /proc) stay the host's; the chroots the workload and the exec server make
// have a /proc of their own or none. Exit statuses of its own: 125 (could not set up; 126 or 127 when the command
// could not be executed), each with one "pid-ns: ..." line on stderr. When the namespace cannot be made (no
// CAP_SYS_ADMIN, a namespace limit reached) the command runs in place, without one, after a line saying why: the
// driver asks --probe once at its start and says so itself.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static const int forwarded[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
#define NFORWARDED (sizeof forwarded / sizeof forwarded[0])

/* Where forwarded signals go: the init (from the outer process), minus the command's process group (from the init). */
static volatile pid_t target;

__attribute__((noreturn)) static void fail(const char *what, const char *detail) {
  dprintf(2, "pid-ns: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  _exit(125);
}

static void forward(int sig) {
  int saved = errno;
  pid_t t = target;
  if (t < 0 && kill(t, sig) != 0) kill(-t, sig); /* its group is gone: the command alone, if it lives */
  else if (t > 0) kill(t, sig);
  errno = saved;
}

static void on_forwarded(void (*handler)(int)) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = handler;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < NFORWARDED; i++) sigaction(forwarded[i], &sa, NULL);
}

static void forwarded_set(sigset_t *set) {
  sigemptyset(set);
  for (size_t i = 0; i < NFORWARDED; i++) sigaddset(set, forwarded[i]);
}

/* Ends this process as `status` (a wait status) says the command ended: its exit code, or its signal. */
__attribute__((noreturn)) static void end_as(int status) {
  if (WIFEXITED(status)) _exit(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none); /* the command dumped its core already, if it could */
    signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    sigprocmask(SIG_UNBLOCK, &one, NULL);
    kill(getpid(), sig);
    _exit(128 + sig);
  }
  _exit(125);
}

/* Pid 1 of the namespace: starts the command, reaps, forwards, reports the command's end on `report`. */
__attribute__((noreturn)) static void run_init(char **argv, const sigset_t *original, int report, int lifeline) {
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail("prctl", strerror(errno));
  /* The outer process holds the lifeline's other end until it dies: gone already, no death signal will come. */
  struct pollfd p = {.fd = lifeline, .events = POLLIN};
  if (poll(&p, 1, 0) != 0) _exit(125);
  close(lifeline);
  pid_t child = fork();
  if (child < 0) fail("fork", strerror(errno));
  if (child == 0) {
    close(report);
    setsid();
    /* Default dispositions before the mask opens: a signal pending now is the command's, not forwarded to nobody. */
    for (size_t i = 0; i < NFORWARDED; i++) signal(forwarded[i], SIG_DFL);
    sigprocmask(SIG_SETMASK, original, NULL);
    execvp(argv[0], argv);
    int e = errno;
    dprintf(2, "pid-ns: cannot execute %s: %s\n", argv[0], strerror(e));
    _exit(e == ENOENT || e == ENOTDIR ? 127 : 126);
  }
  target = -child;
  sigprocmask(SIG_SETMASK, original, NULL);
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, 0);
    if (pid == child) {
      while (write(report, &status, sizeof status) < 0 && errno == EINTR) {
      }
      _exit(0); /* the kernel ends the namespace's other processes */
    }
    if (pid < 0 && errno != EINTR) _exit(125); /* no child left without the command's end: cannot be */
  }
}

static int probe(void) {
  if (unshare(CLONE_NEWPID) != 0) {
    dprintf(2, "unshare(CLONE_NEWPID): %s\n", strerror(errno));
    return 1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    dprintf(2, "fork into the new namespace: %s\n", strerror(errno));
    return 1;
  }
  if (pid == 0) _exit(getpid() == 1 ? 0 : 3);
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return 1;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
  dprintf(2, "the namespace's first process is not its pid 1\n");
  return 1;
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--probe") == 0) return probe();
  if (argc < 5 || strcmp(argv[1], "--parent") != 0 || strcmp(argv[3], "--") != 0)
    fail("usage: pid-ns --parent <pid> -- <command> [args...] | pid-ns --probe", NULL);
  char *end = NULL;
  long parent = strtol(argv[2], &end, 10);
  if (*argv[2] == '\0' || *end != '\0' || parent < 1) fail("bad parent pid", argv[2]);
  char **command = argv + 4;

  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail("prctl", strerror(errno));
  if (getppid() != (pid_t)parent) fail("the fleet-agent is gone", NULL);

  if (unshare(CLONE_NEWPID) != 0) {
    dprintf(2, "pid-ns: no PID namespace (unshare: %s): %s runs without one\n", strerror(errno), command[0]);
    execvp(command[0], command);
    int e = errno;
    dprintf(2, "pid-ns: cannot execute %s: %s\n", command[0], strerror(e));
    _exit(e == ENOENT || e == ENOTDIR ? 127 : 126);
  }
  int report[2], lifeline[2];
  if (pipe2(report, O_CLOEXEC) != 0 || pipe2(lifeline, O_CLOEXEC) != 0) fail("pipe", strerror(errno));
  /* Blocked across the fork: a signal that comes before a process's handler is set waits for it. */
  sigset_t fwd, original;
  forwarded_set(&fwd);
  sigprocmask(SIG_BLOCK, &fwd, &original);
  on_forwarded(forward);
  pid_t pid = fork();
  if (pid < 0) fail("fork", strerror(errno));
  if (pid == 0) {
    close(report[0]);
    close(lifeline[1]);
    run_init(command, &original, report[1], lifeline[0]);
  }
  close(report[1]);
  close(lifeline[0]);
  target = pid;
  sigprocmask(SIG_SETMASK, &original, NULL);
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) fail("waitpid", strerror(errno));
  int reported;
  ssize_t n;
  while ((n = read(report[0], &reported, sizeof reported)) < 0 && errno == EINTR) {
  }
  end_as(n == (ssize_t)sizeof reported ? reported : status);
}
