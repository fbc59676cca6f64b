/* What the image launcher (launch.c) and the exec server (guest-exec/) share: reading a launch spec (its format is
 * documented in launch-spec.ts), finding and executing a command inside an entered root with the image's PATH, making
 * a missing working directory, and the clean signal state a started program gets. Header-only (static functions), so
 * launch.c still compiles alone: `gcc -static -O2 -o launch launch.c`. */
#ifndef LAUNCH_COMMON_H
#define LAUNCH_COMMON_H

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define LAUNCH_SPEC_MAGIC "agentvm-launch/1"
#define LAUNCH_SPEC_MAX_BYTES (4 << 20)
#define LAUNCH_LIST_MAX 65536
#define LAUNCH_DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

/* A decoded launch spec; its strings point into `buf`. */
struct launch_spec {
  char *buf;
  size_t len;
  size_t pos;
  uid_t uid;
  gid_t gid;
  const char *workdir;
  char **argv;
  char **env;
};

/* The next NUL-terminated string of the spec, or NULL at its end. */
static inline char *launch_next(struct launch_spec *s) {
  if (s->pos >= s->len) return NULL;
  char *str = s->buf + s->pos;
  s->pos += strlen(str) + 1;
  return str;
}

/* "<key>=<decimal>" → 0 and the number; -1 with `err` on anything else. */
static inline int launch_keyed_number(struct launch_spec *s, const char *key, unsigned long max, unsigned long *out, char *err, size_t errlen) {
  char *str = launch_next(s);
  if (!str) return snprintf(err, errlen, "spec file ends before %s", key), -1;
  size_t klen = strlen(key);
  if (strncmp(str, key, klen) != 0 || str[klen] != '=') return snprintf(err, errlen, "spec file: expected %s=, found \"%.40s\"", key, str), -1;
  const char *digits = str + klen + 1;
  char *end;
  errno = 0;
  unsigned long v = strtoul(digits, &end, 10);
  if (errno || end == digits || *end || v > max) return snprintf(err, errlen, "spec file: bad %s \"%.40s\"", key, digits), -1;
  *out = v;
  return 0;
}

static inline char **launch_list(struct launch_spec *s, const char *count_key, char *err, size_t errlen) {
  unsigned long n;
  if (launch_keyed_number(s, count_key, LAUNCH_LIST_MAX, &n, err, errlen) != 0) return NULL;
  char **items = calloc(n + 1, sizeof *items);
  if (!items) return snprintf(err, errlen, "out of memory"), NULL;
  for (unsigned long i = 0; i < n; i++) {
    items[i] = launch_next(s);
    if (!items[i]) return snprintf(err, errlen, "spec file ends before %s", count_key), NULL;
  }
  return items;
}

/* Reads and decodes the spec file at `path`: 0, or -1 with a message in `err`. */
static inline int launch_spec_read(const char *path, struct launch_spec *s, char *err, size_t errlen) {
  memset(s, 0, sizeof *s);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return snprintf(err, errlen, "cannot open spec file %s: %s", path, strerror(errno)), -1;
  s->buf = malloc(LAUNCH_SPEC_MAX_BYTES);
  if (!s->buf) return close(fd), snprintf(err, errlen, "out of memory"), -1;
  for (;;) {
    ssize_t n = read(fd, s->buf + s->len, LAUNCH_SPEC_MAX_BYTES - s->len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return close(fd), snprintf(err, errlen, "cannot read spec file %s: %s", path, strerror(errno)), -1;
    if (n == 0) break;
    s->len += (size_t)n;
    if (s->len == LAUNCH_SPEC_MAX_BYTES) return close(fd), snprintf(err, errlen, "spec file %s is larger than %d bytes", path, LAUNCH_SPEC_MAX_BYTES), -1;
  }
  close(fd);
  if (s->len == 0 || s->buf[s->len - 1] != '\0') return snprintf(err, errlen, "spec file %s is not a list of NUL-terminated strings", path), -1;
  const char *magic = launch_next(s);
  if (strcmp(magic, LAUNCH_SPEC_MAGIC) != 0)
    return snprintf(err, errlen, "spec file %s: unknown format \"%.40s\" (want %s)", path, magic, LAUNCH_SPEC_MAGIC), -1;
  unsigned long uid, gid;
  if (launch_keyed_number(s, "uid", 0xfffffffeUL, &uid, err, errlen) != 0) return -1;
  if (launch_keyed_number(s, "gid", 0xfffffffeUL, &gid, err, errlen) != 0) return -1;
  s->uid = (uid_t)uid;
  s->gid = (gid_t)gid;
  char *workdir_kv = launch_next(s);
  if (!workdir_kv) return snprintf(err, errlen, "spec file ends before workdir"), -1;
  if (strncmp(workdir_kv, "workdir=/", 9) != 0) return snprintf(err, errlen, "spec file: workdir must be absolute, found \"%.60s\"", workdir_kv), -1;
  s->workdir = workdir_kv + 8;
  if (!(s->argv = launch_list(s, "argc", err, errlen))) return -1;
  if (!(s->env = launch_list(s, "envc", err, errlen))) return -1;
  if (!s->argv[0]) return snprintf(err, errlen, "spec file has no command (argc=0)"), -1;
  if (launch_next(s)) return snprintf(err, errlen, "spec file has data after the environment"), -1;
  return 0;
}

/* The PATH the environment sets (the last one), else the OCI default. */
static inline const char *launch_search_path(char **env) {
  const char *path = NULL;
  for (char **e = env; *e; e++)
    if (strncmp(*e, "PATH=", 5) == 0) path = *e + 5;
  return path ? path : LAUNCH_DEFAULT_PATH;
}

/* execve, looking a slash-less argv[0] up in PATH inside the (already entered) root, as execvpe would but with
 * the environment's PATH rather than ours. Returns only on failure, with the errno that best explains it. */
static inline int launch_exec_in_root(char **argv, char **env) {
  const char *file = argv[0];
  if (strchr(file, '/')) {
    execve(file, argv, env);
    return errno;
  }
  const char *path = launch_search_path(env);
  int best = ENOENT;
  for (const char *p = path;; p++) {
    const char *end = strchrnul(p, ':');
    size_t dlen = (size_t)(end - p);
    char full[PATH_MAX];
    /* An empty PATH element means the working directory, as in POSIX. */
    if (snprintf(full, sizeof full, "%.*s%s%s", (int)dlen, dlen ? p : ".", "/", file) < (int)sizeof full) {
      execve(full, argv, env);
      /* Keep looking on "not here"; remember "here but not runnable" to report it if nothing else runs. */
      if (errno == EACCES || errno == ENOEXEC || errno == ETXTBSY) best = errno;
      else if (errno != ENOENT && errno != ENOTDIR && best == ENOENT) best = errno;
    }
    if (!*end) break;
    p = end;
  }
  return best;
}

/* mkdir -p inside the root, for a working directory the image does not have (OCI runtimes create it too). */
static inline int launch_make_dirs(const char *dir, char *err, size_t errlen) {
  char path[PATH_MAX];
  if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) return snprintf(err, errlen, "workdir too long"), -1;
  for (char *p = path + 1;; p++) {
    if (*p == '/' || *p == '\0') {
      char c = *p;
      *p = '\0';
      if (mkdir(path, 0755) != 0 && errno != EEXIST) return snprintf(err, errlen, "cannot create workdir %.300s: %s", path, strerror(errno)), -1;
      *p = c;
      if (!c) break;
    }
  }
  return 0;
}

/* A shell's background job starts with SIGINT/SIGQUIT ignored and signals may be blocked: a started program gets a
 * clean slate, as a container runtime gives it. */
static inline void launch_reset_signals(void) {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  for (int sig = 1; sig < NSIG; sig++) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    signal(sig, SIG_DFL);
  }
}

#endif
