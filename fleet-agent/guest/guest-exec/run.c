/* An exec's spec (the request body's length-prefixed NUL-terminated key=value strings), its environment (the image's,
 * HOME of an explicit user, then the request's), and starting the command like the entrypoint: its own session and
 * process group, the working directory, the user's supplementary groups, gid and uid, a clean signal state, the
 * PATH search inside the root (launch-common.h). Why it could not start comes back on a close-on-exec pipe. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "exec.h"
#include "../launch-common.h"

#define SPEC_MAX (1 << 20)

int read_exec_spec(struct req *r, struct exec_spec *sp) {
  memset(sp, 0, sizeof *sp);
  unsigned char lenb[4];
  size_t got = 0;
  while (got < 4) {
    ssize_t n = body_read(r, lenb + got, 4 - got);
    if (n <= 0) {
      respond_error(r->fd, 400, "bad_request", "the body must start with the spec's 4-byte length");
      return -1;
    }
    got += (size_t)n;
  }
  size_t len = ((size_t)lenb[0] << 24) | ((size_t)lenb[1] << 16) | ((size_t)lenb[2] << 8) | lenb[3];
  if (len == 0 || len > SPEC_MAX) {
    respond_error(r->fd, 400, "bad_request", "spec length %zu out of range", len);
    return -1;
  }
  sp->raw = malloc(len + 1);
  if (!sp->raw) _exit(70);
  for (got = 0; got < len;) {
    ssize_t n = body_read(r, sp->raw + got, len - got);
    if (n <= 0) {
      respond_error(r->fd, 400, "bad_request", "the body ends inside the spec");
      return -1;
    }
    got += (size_t)n;
  }
  if (sp->raw[len - 1] != '\0') {
    respond_error(r->fd, 400, "bad_request", "the spec's strings must each end in a NUL byte");
    return -1;
  }
  sp->timeout_ms = 0;
  for (char *s = sp->raw; s < sp->raw + len; s += strlen(s) + 1) {
    if (strncmp(s, "arg=", 4) == 0 && sp->argc < 4095) sp->argv[sp->argc++] = s + 4;
    else if (strncmp(s, "env=", 4) == 0 && sp->nenv < 4095) {
      char *eq = strchr(s + 4, '=');
      if (!eq || eq == s + 4) {
        respond_error(r->fd, 400, "bad_request", "env must be NAME=VALUE: %.100s", s + 4);
        return -1;
      }
      sp->env[sp->nenv++] = s + 4;
    } else if (strncmp(s, "cwd=", 4) == 0) sp->cwd = s + 4;
    else if (strncmp(s, "user=", 5) == 0) sp->user = s + 5;
    else if (strncmp(s, "timeout_ms=", 11) == 0) sp->timeout_ms = strtoll(s + 11, NULL, 10);
    else if (strcmp(s, "background=1") == 0) sp->background = 1;
    else if (strcmp(s, "stdin=1") == 0) sp->use_stdin = 1;
    else if (strncmp(s, "tty=", 4) == 0) {
      if (parse_tty_size(s + 4, &sp->tty_rows, &sp->tty_cols) != 0) {
        respond_error(r->fd, 400, "bad_request", "tty must be <rows>x<cols>, each 1..65535: %.100s", s + 4);
        return -1;
      }
      sp->tty = 1;
    }
    else if (*s) {
      respond_error(r->fd, 400, "bad_request", "unknown spec entry: %.100s", s);
      return -1;
    }
  }
  if (sp->argc == 0) {
    respond_error(r->fd, 400, "bad_request", "the spec has no arg=");
    return -1;
  }
  if (sp->cwd && sp->cwd[0] != '/') {
    respond_error(r->fd, 400, "bad_request", "cwd must be absolute");
    return -1;
  }
  if (sp->tty && sp->background) {
    respond_error(r->fd, 400, "bad_request", "a background process cannot have a tty");
    return -1;
  }
  if (sp->timeout_ms < 0) sp->timeout_ms = 0;
  return 0;
}

/* `list` (a NULL-terminated array with room) with `entry` replacing the entry of the same NAME in place, or added. */
static void env_set(char **list, int *n, char *entry) {
  size_t klen = (size_t)(strchr(entry, '=') - entry) + 1;
  for (int i = 0; i < *n; i++)
    if (strncmp(list[i], entry, klen) == 0) {
      list[i] = entry;
      return;
    }
  list[(*n)++] = entry;
  list[*n] = NULL;
}

char **merged_env(struct exec_spec *sp, const struct ids *ids) {
  int base = 0;
  while (defaults.env[base]) base++;
  char **env = calloc((size_t)base + (size_t)sp->nenv + 5, sizeof *env);
  if (!env) _exit(70);
  int n = 0;
  for (int i = 0; i < base; i++) env_set(env, &n, defaults.env[i]);
  int has_path = 0;
  for (int i = 0; i < n; i++)
    if (strncmp(env[i], "PATH=", 5) == 0) has_path = 1;
  if (!has_path) env_set(env, &n, "PATH=" LAUNCH_DEFAULT_PATH);
  if (sp->user && *sp->user) {
    char *home = malloc(strlen(ids->home) + 6);
    sprintf(home, "HOME=%s", ids->home);
    env_set(env, &n, home);
  }
  if (sp->tty) env_set(env, &n, "TERM=xterm-256color"); /* the request's TERM, if any, comes next */
  for (int i = 0; i < sp->nenv; i++) env_set(env, &n, sp->env[i]);
  return env;
}

__attribute__((noreturn)) static void fail(int ep, const char *fmt, const char *a, const char *b) {
  char msg[1024];
  int n = snprintf(msg, sizeof msg, fmt, a, b);
  if (n > 0) (void)!write(ep, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
  _exit(127);
}

pid_t start_command(struct exec_spec *sp, const struct ids *ids, char **env, int in_fd, int out_fd, int err_fd, int *err_out) {
  int ep[2];
  if (pipe2(ep, O_CLOEXEC) != 0) return -1;
  pid_t pid = fork();
  if (pid < 0) {
    close(ep[0]);
    close(ep[1]);
    return -1;
  }
  if (pid == 0) {
    close(ep[0]);
    setsid();
    if (dup2(in_fd, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0) fail(ep[1], "cannot set up stdio%s%s", "", "");
    /* On a PTY: it is the new session's controlling terminal (job control, ^C as SIGINT, SIGWINCH). */
    if (sp->tty && ioctl(0, TIOCSCTTY, 0) != 0) fail(ep[1], "TIOCSCTTY: %s%s", strerror(errno), "");
    const char *cwd = sp->cwd ? sp->cwd : defaults.workdir;
    if (chdir(cwd) != 0) {
      char err[512];
      if (sp->cwd || errno != ENOENT || launch_make_dirs(cwd, err, sizeof err) != 0 || chdir(cwd) != 0) fail(ep[1], "cwd %.300s: %s", cwd, strerror(errno));
    }
    if (geteuid() == 0) {
      if (setgroups((size_t)ids->ngroups, ids->groups) != 0) fail(ep[1], "setgroups: %s%s", strerror(errno), "");
      if (setgid(ids->gid) != 0) fail(ep[1], "setgid: %s%s", strerror(errno), "");
      if (setuid(ids->uid) != 0) fail(ep[1], "setuid: %s%s", strerror(errno), "");
    } else if (getuid() != ids->uid) {
      fail(ep[1], "not root: cannot run as another user%s%s", "", "");
    }
    launch_reset_signals();
    umask(022);
    int e = launch_exec_in_root(sp->argv, env);
    if (e == ENOENT || e == ENOTDIR) fail(ep[1], "not found: %.300s%s", sp->argv[0], "");
    if (e == EACCES || e == ENOEXEC) fail(ep[1], "not executable: %.300s (%s)", sp->argv[0], strerror(e));
    fail(ep[1], "cannot execute %.300s: %s", sp->argv[0], strerror(e));
  }
  close(ep[1]);
  *err_out = ep[0];
  return pid;
}

int start_failed(int err_fd, char *msg, size_t len) {
  size_t got = 0;
  for (;;) {
    ssize_t n = read(err_fd, msg + got, len - 1 - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
    if (got >= len - 1) break;
  }
  msg[got] = '\0';
  close(err_fd);
  return got > 0;
}

int pidfd_of(pid_t pid) {
  return (int)syscall(SYS_pidfd_open, pid, 0);
}
