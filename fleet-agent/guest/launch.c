/* launch <root> <spec-file>: starts an image's entrypoint inside <root> (chroot), as the spec file says (argv, env,
 * workdir, uid, gid). Static and shell-free, because images need have no shell (distroless) and because the same
 * program runs in the guest (root = the overlay over the image) and on the host for the process driver (root = an
 * unpacked rootfs directory): it assumes nothing of either, not even /dev/console; stdio is whatever it was given.
 *
 * The spec file (written by fleet-agent/guest/launch-spec.ts, which documents the format) is a list of
 * NUL-terminated strings:
 *   "agentvm-launch/1" "uid=<n>" "gid=<n>" "workdir=<abs path>" "argc=<n>" <argv...> "envc=<n>" <env...>
 * The spec is read before the chroot (its path is the host's or the initramfs's, not the image's).
 *
 * Exit status when the entrypoint cannot be started: 127 (not found), 126 (found, not executable), 125 (anything
 * else: a bad spec, chroot, chdir, ids), each with one "launch: ..." line on stderr. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define SPEC_MAGIC "agentvm-launch/1"
#define SPEC_MAX_BYTES (4 << 20)
#define LIST_MAX 65536
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

__attribute__((noreturn, format(printf, 2, 3)))
static void die(int status, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  dprintf(2, "launch: %s\n", msg);
  _exit(status);
}

struct spec {
  char *buf;
  size_t len;
  size_t pos;
};

/* The next NUL-terminated string of the spec, or NULL at its end. */
static char *next(struct spec *s) {
  if (s->pos >= s->len) return NULL;
  char *str = s->buf + s->pos;
  s->pos += strlen(str) + 1;
  return str;
}

static char *need(struct spec *s, const char *what) {
  char *str = next(s);
  if (!str) die(125, "spec file ends before %s", what);
  return str;
}

/* "<key>=<decimal>" → the number; dies on anything else. */
static unsigned long keyed_number(struct spec *s, const char *key, unsigned long max) {
  char *str = need(s, key);
  size_t klen = strlen(key);
  if (strncmp(str, key, klen) != 0 || str[klen] != '=') die(125, "spec file: expected %s=, found \"%.40s\"", key, str);
  const char *digits = str + klen + 1;
  char *end;
  errno = 0;
  unsigned long v = strtoul(digits, &end, 10);
  if (errno || end == digits || *end || v > max) die(125, "spec file: bad %s \"%.40s\"", key, digits);
  return v;
}

static char **list(struct spec *s, const char *count_key) {
  unsigned long n = keyed_number(s, count_key, LIST_MAX);
  char **items = calloc(n + 1, sizeof *items);
  if (!items) die(125, "out of memory");
  for (unsigned long i = 0; i < n; i++) items[i] = need(s, count_key);
  return items;
}

static void read_spec(const char *path, struct spec *s) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) die(125, "cannot open spec file %s: %s", path, strerror(errno));
  s->buf = malloc(SPEC_MAX_BYTES);
  if (!s->buf) die(125, "out of memory");
  s->len = 0;
  for (;;) {
    ssize_t n = read(fd, s->buf + s->len, SPEC_MAX_BYTES - s->len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) die(125, "cannot read spec file %s: %s", path, strerror(errno));
    if (n == 0) break;
    s->len += (size_t)n;
    if (s->len == SPEC_MAX_BYTES) die(125, "spec file %s is larger than %d bytes", path, SPEC_MAX_BYTES);
  }
  close(fd);
  if (s->len == 0 || s->buf[s->len - 1] != '\0') die(125, "spec file %s is not a list of NUL-terminated strings", path);
  s->pos = 0;
}

/* The PATH the image's environment sets (the last one, as the encoder keeps only one), else the OCI default. */
static const char *search_path(char **env) {
  const char *path = NULL;
  for (char **e = env; *e; e++)
    if (strncmp(*e, "PATH=", 5) == 0) path = *e + 5;
  return path ? path : DEFAULT_PATH;
}

/* execve, looking a slash-less argv[0] up in PATH inside the (already entered) root, as execvpe would but with
 * the image's PATH rather than ours. Returns only on failure, with the errno that best explains it. */
static int exec_in_root(char **argv, char **env) {
  const char *file = argv[0];
  if (strchr(file, '/')) {
    execve(file, argv, env);
    return errno;
  }
  const char *path = search_path(env);
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

/* mkdir -p inside the root, for a WORKDIR the image does not have (OCI runtimes create it too). */
static void make_dirs(const char *dir) {
  char path[PATH_MAX];
  if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) die(125, "workdir too long");
  for (char *p = path + 1;; p++) {
    if (*p == '/' || *p == '\0') {
      char c = *p;
      *p = '\0';
      if (mkdir(path, 0755) != 0 && errno != EEXIST) die(125, "cannot create workdir %s: %s", path, strerror(errno));
      *p = c;
      if (!c) break;
    }
  }
}

int main(int argc, char **argv) {
  if (argc != 3) die(125, "usage: launch <root> <spec-file>");
  const char *root = argv[1];
  struct spec s;
  read_spec(argv[2], &s);
  const char *magic = need(&s, "the header");
  if (strcmp(magic, SPEC_MAGIC) != 0) die(125, "spec file %s: unknown format \"%.40s\" (want %s)", argv[2], magic, SPEC_MAGIC);
  uid_t uid = (uid_t)keyed_number(&s, "uid", 0xfffffffeUL);
  gid_t gid = (gid_t)keyed_number(&s, "gid", 0xfffffffeUL);
  char *workdir_kv = need(&s, "workdir");
  if (strncmp(workdir_kv, "workdir=/", 9) != 0) die(125, "spec file: workdir must be absolute, found \"%.60s\"", workdir_kv);
  const char *workdir = workdir_kv + 8;
  char **args = list(&s, "argc");
  char **env = list(&s, "envc");
  if (!args[0]) die(125, "spec file has no command (argc=0)");
  if (next(&s)) die(125, "spec file has data after the environment");

  if (chroot(root) != 0) die(125, "chroot %s: %s", root, strerror(errno));
  if (chdir("/") != 0) die(125, "chdir / in %s: %s", root, strerror(errno));
  if (chdir(workdir) != 0) {
    if (errno != ENOENT) die(125, "chdir %s: %s", workdir, strerror(errno));
    make_dirs(workdir);
    if (chdir(workdir) != 0) die(125, "chdir %s: %s", workdir, strerror(errno));
  }

  /* Drop to the image's user: supplementary groups first (only the primary one; the image's /etc/group was
   * resolved at build time), then the group, then the user, which ends the right to change either. */
  if (geteuid() == 0) {
    if (setgroups(1, &gid) != 0) die(125, "setgroups(%u): %s", (unsigned)gid, strerror(errno));
    if (setgid(gid) != 0) die(125, "setgid(%u): %s", (unsigned)gid, strerror(errno));
    if (setuid(uid) != 0) die(125, "setuid(%u): %s", (unsigned)uid, strerror(errno));
  } else if (getuid() != uid || getgid() != gid) {
    die(125, "not root: cannot run as uid %u gid %u", (unsigned)uid, (unsigned)gid);
  }

  /* A shell's background job starts with SIGINT/SIGQUIT ignored and signals may be blocked: the entrypoint gets a
   * clean slate, as a container runtime gives it. */
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  for (int sig = 1; sig < NSIG; sig++) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    signal(sig, SIG_DFL);
  }
  umask(022);

  int err = exec_in_root(args, env);
  die(err == ENOENT || err == ENOTDIR ? 127 : err == EACCES || err == ENOEXEC ? 126 : 125, "cannot execute %s: %s", args[0], strerror(err));
}
