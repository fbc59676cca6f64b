/* Background processes (exec with background=1) and /v1/procs/…. A keeper (its own session, detached from the
 * connection) starts the command and holds its pipes: stdout and stderr go to files in the state directory's
 * `<pid>/` (16 MiB each; bytes beyond are counted in `<stream>.dropped`), stdin comes from the fifo `stdin` (what
 * POST …/stdin writes; `eof=1` writes "e" into the fifo `ctl`, which closes it), and the exit goes to `status` (by
 * rename: it exists only once all output is written). `meta` holds the pid, the command and the start. A timeout_ms
 * kills its process group (`"timedOut":true` in the status). The last 64 exited processes are kept. The state
 * directory is guest tmpfs outside the root: all of it survives hibernate and wake with the guest's memory. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "exec.h"

#define OUTPUT_CAP (16LL << 20)
#define STDIN_BODY_MAX (1 << 20)

int remove_tree(int dfd, const char *name);

static int write_file_at(int dfd, const char *name, const char *data, size_t len) {
  char tmp[64];
  snprintf(tmp, sizeof tmp, ".%s.tmp", name);
  int f = openat(dfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (f < 0) return -1;
  int rc = write_all(f, data, len);
  close(f);
  return rc == 0 ? renameat(dfd, tmp, dfd, name) : -1;
}

/* The whole (small) file `name` in `dfd`, NUL-terminated, or NULL. */
static char *read_small(int dfd, const char *name) {
  int f = openat(dfd, name, O_RDONLY | O_CLOEXEC);
  if (f < 0) return NULL;
  char *buf = malloc(1 << 20);
  ssize_t n = buf ? read(f, buf, (1 << 20) - 1) : -1;
  close(f);
  if (n < 0) {
    free(buf);
    return NULL;
  }
  buf[n] = '\0';
  return buf;
}

struct stream {
  int fd;
  int file;
  int dropped_file;
  long long size;
  long long dropped;
};

/* Moves what the pipe holds now into its file, bounded. Returns 0 when the pipe ended. */
static int pump_output(struct stream *s) {
  static char buf[IO_CHUNK];
  for (;;) {
    ssize_t n = read(s->fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return 1; /* EAGAIN: nothing more now */
    if (n == 0) return 0;
    long long keep = OUTPUT_CAP - s->size;
    if (keep > n) keep = n;
    if (keep > 0 && write_all(s->file, buf, (size_t)keep) == 0) s->size += keep;
    else keep = keep > 0 ? 0 : keep;
    if (keep < n) {
      s->dropped += n - (keep > 0 ? keep : 0);
      char num[32];
      int len = snprintf(num, sizeof num, "%lld\n", s->dropped);
      if (pwrite(s->dropped_file, num, (size_t)len, 0) < 0) {
      }
    }
  }
}

__attribute__((noreturn)) static void keeper(struct exec_spec *sp, const struct ids *ids, char **env, char *body, size_t body_len, int report) {
  setsid();
  int out[2], err[2], in[2];
  if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) || pipe2(in, O_CLOEXEC)) _exit(1);
  int ef;
  pid_t pid = start_command(sp, ids, env, in[0], out[1], err[1], &ef);
  close(in[0]);
  close(out[1]);
  close(err[1]);
  if (pid < 0) _exit(1);
  if (!sp->use_stdin) {
    close(in[1]);
    in[1] = -1;
  }
  char msg[1024];
  int failed = start_failed(ef, msg, sizeof msg);
  char name[32];
  snprintf(name, sizeof name, "%d", (int)pid);
  if (mkdirat(state_fd, name, 0700) != 0 && errno == EEXIST) { /* an earlier process with the same pid: replaced */
    remove_tree(state_fd, name);
    mkdirat(state_fd, name, 0700);
  }
  int dfd = openat(state_fd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    kill(-pid, SIGKILL);
    _exit(1);
  }
  struct jbuf m = {0};
  jb_printf(&m, "\"pid\":%d,\"cmd\":[", (int)pid);
  for (int i = 0; i < sp->argc; i++) {
    if (i) jb_raw(&m, ",", 1);
    jb_str(&m, sp->argv[i]);
  }
  jb_printf(&m, "],\"startedAtMs\":%lld", now_ms());
  write_file_at(dfd, "meta", m.p, m.len);
  char kp[32];
  int kl = snprintf(kp, sizeof kp, "%d", (int)getpid());
  write_file_at(dfd, "keeper", kp, (size_t)kl);
  struct stream s[2] = {{.fd = out[0]}, {.fd = err[0]}};
  const char *files[2][2] = {{"stdout", "stdout.dropped"}, {"stderr", "stderr.dropped"}};
  for (int k = 0; k < 2; k++) {
    s[k].file = openat(dfd, files[k][0], O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
    s[k].dropped_file = openat(dfd, files[k][1], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    fcntl(s[k].fd, F_SETFL, O_NONBLOCK);
  }
  int fifo = -1, ctl = -1;
  if (sp->use_stdin && !failed) {
    mkfifoat(dfd, "stdin", 0600);
    mkfifoat(dfd, "ctl", 0600);
    fifo = openat(dfd, "stdin", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    ctl = openat(dfd, "ctl", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    fcntl(in[1], F_SETFL, O_NONBLOCK);
  }
  if (failed) {
    write_all(s[1].file, msg, strlen(msg));
    write_all(s[1].file, "\n", 1);
  }
  (void)!write(report, name, strlen(name));
  if (failed) (void)!write(report, msg, strlen(msg));
  close(report);

  int status = 0, timed_out = 0;
  if (failed) {
    waitpid(pid, &status, 0);
    status = 127 << 8;
  } else {
    int pfd = pidfd_of(pid);
    static char pend[IO_CHUNK];
    size_t pend_off = 0, pend_len = 0;
    if (body_len > 0) {
      /* The request's own stdin bytes go first (at most STDIN_BODY_MAX, held here once). */
      char *p = body;
      size_t left = body_len;
      while (left > 0 && in[1] >= 0) {
        struct pollfd w = {.fd = in[1], .events = POLLOUT};
        poll(&w, 1, 1000);
        ssize_t n = write(in[1], p, left);
        if (n < 0 && errno != EAGAIN && errno != EINTR) break;
        if (n > 0) {
          p += n;
          left -= (size_t)n;
        }
        pump_output(&s[0]);
        pump_output(&s[1]);
        if (waitpid(pid, &status, WNOHANG) == pid) {
          pfd = -2;
          break;
        }
      }
    }
    free(body);
    int eof_asked = 0, exited = pfd == -2;
    long long deadline = sp->timeout_ms > 0 ? mono_ms() + sp->timeout_ms : 0;
    while (!exited) {
      struct pollfd fds[6];
      int n = 0, oi[2] = {-1, -1}, fi = -1, ci = -1, wi = -1, pi = -1;
      for (int k = 0; k < 2; k++)
        if (s[k].fd >= 0) {
          oi[k] = n;
          fds[n++] = (struct pollfd){.fd = s[k].fd, .events = POLLIN};
        }
      if (fifo >= 0 && pend_len == 0 && in[1] >= 0) {
        fi = n;
        fds[n++] = (struct pollfd){.fd = fifo, .events = POLLIN};
      }
      if (ctl >= 0) {
        ci = n;
        fds[n++] = (struct pollfd){.fd = ctl, .events = POLLIN};
      }
      if (pend_len > 0 && in[1] >= 0) {
        wi = n;
        fds[n++] = (struct pollfd){.fd = in[1], .events = POLLOUT};
      }
      if (pfd >= 0) {
        pi = n;
        fds[n++] = (struct pollfd){.fd = pfd, .events = POLLIN};
      }
      int wait_ms = pfd >= 0 ? -1 : 100;
      if (deadline) {
        long long left = deadline - mono_ms();
        wait_ms = left <= 0 ? 0 : (wait_ms < 0 || left < wait_ms ? (int)left : wait_ms);
      }
      if (poll(fds, (nfds_t)n, wait_ms) < 0 && errno != EINTR) break;
      if (deadline && mono_ms() >= deadline) { /* its timeout: the process group is killed */
        kill(-pid, SIGKILL);
        kill(pid, SIGKILL);
        deadline = 0;
        timed_out = 1;
      }
      for (int k = 0; k < 2; k++)
        if (oi[k] >= 0 && fds[oi[k]].revents && !pump_output(&s[k])) {
          close(s[k].fd);
          s[k].fd = -1;
        }
      if (ci >= 0 && (fds[ci].revents & POLLIN)) {
        char c[16];
        if (read(ctl, c, sizeof c) > 0) eof_asked = 1;
      }
      if (fi >= 0 && (fds[fi].revents & POLLIN)) {
        ssize_t k = read(fifo, pend, sizeof pend);
        if (k > 0) {
          pend_off = 0;
          pend_len = (size_t)k;
        }
      }
      if (pend_len > 0 && in[1] >= 0) {
        ssize_t k = write(in[1], pend + pend_off, pend_len);
        if (k > 0) {
          pend_off += (size_t)k;
          pend_len -= (size_t)k;
        } else if (k < 0 && errno != EAGAIN && errno != EINTR) {
          close(in[1]); /* the command closed its stdin */
          in[1] = -1;
          pend_len = 0;
        }
      }
      (void)wi;
      if (eof_asked && in[1] >= 0 && pend_len == 0) {
        ssize_t k = read(fifo, pend, sizeof pend); /* what was written before the eof goes first */
        if (k > 0) {
          pend_off = 0;
          pend_len = (size_t)k;
        } else {
          close(in[1]);
          in[1] = -1;
        }
      }
      if ((pi >= 0 && (fds[pi].revents & POLLIN)) || (pfd < 0 && waitpid(pid, &status, WNOHANG) == pid)) {
        if (pfd >= 0) waitpid(pid, &status, 0);
        exited = 1;
      }
    }
    for (int k = 0; k < 2; k++)
      if (s[k].fd >= 0) pump_output(&s[k]);
  }
  if (fifo >= 0) unlinkat(dfd, "stdin", 0);
  if (ctl >= 0) unlinkat(dfd, "ctl", 0);
  char st[200];
  int len = WIFSIGNALED(status) ? snprintf(st, sizeof st, "\"state\":\"exited\",\"exitCode\":null,\"signal\":%d,\"endedAtMs\":%lld", WTERMSIG(status), now_ms())
                                : snprintf(st, sizeof st, "\"state\":\"exited\",\"exitCode\":%d,\"signal\":null,\"endedAtMs\":%lld", WEXITSTATUS(status), now_ms());
  if (timed_out) len += snprintf(st + len, sizeof st - (size_t)len, ",\"timedOut\":true");
  write_file_at(dfd, "status", st, (size_t)len);
  _exit(0);
}

struct ended {
  long long at;
  char name[16];
};

static int by_end(const void *a, const void *b) {
  long long x = ((const struct ended *)a)->at, y = ((const struct ended *)b)->at;
  return x < y ? -1 : x > y;
}

/* Keeps the records of at most KEEP_EXITED exited processes (their output is guest memory): the oldest go first. */
static void prune_exited(void) {
  enum { KEEP_EXITED = 64, MAX_SEEN = 4096 };
  static struct ended list[MAX_SEEN];
  int n = 0;
  DIR *d = fdopendir(dup(state_fd));
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL && n < MAX_SEEN) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9' || strlen(e->d_name) >= sizeof list[0].name) continue;
    char path[64];
    snprintf(path, sizeof path, "%s/status", e->d_name);
    struct stat st;
    if (fstatat(state_fd, path, &st, 0) != 0) continue;
    list[n].at = (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
    snprintf(list[n].name, sizeof list[n].name, "%s", e->d_name);
    n++;
  }
  if (d) closedir(d);
  if (n <= KEEP_EXITED) return;
  qsort(list, (size_t)n, sizeof *list, by_end);
  for (int i = 0; i < n - KEEP_EXITED; i++) remove_tree(state_fd, list[i].name);
}

void start_background(struct req *r, struct exec_spec *sp, const struct ids *ids, char **env) {
  prune_exited();
  char *body = NULL;
  size_t body_len = 0;
  if (sp->use_stdin) {
    body = malloc(STDIN_BODY_MAX + 1);
    if (!body) _exit(70);
    ssize_t n;
    while ((n = body_read(r, body + body_len, STDIN_BODY_MAX + 1 - body_len)) > 0) {
      body_len += (size_t)n;
      if (body_len > STDIN_BODY_MAX) {
        respond_error(r->fd, 413, "payload_too_large", "a background process's first stdin is at most %d bytes (write more with …/stdin)", STDIN_BODY_MAX);
        return;
      }
    }
  }
  int rp[2];
  if (pipe2(rp, O_CLOEXEC) != 0) {
    respond_error(r->fd, 500, "internal", "pipe: %s", strerror(errno));
    return;
  }
  pid_t k = fork();
  if (k == 0) {
    close(rp[0]);
    close(r->fd);
    keeper(sp, ids, env, body, body_len, rp[1]);
  }
  close(rp[1]);
  free(body);
  char got[1200];
  size_t n = 0;
  ssize_t m;
  while ((m = read(rp[0], got + n, sizeof got - 1 - n)) > 0) n += (size_t)m;
  close(rp[0]);
  got[n] = '\0';
  if (k < 0 || n == 0) {
    respond_error(r->fd, 500, "internal", "the background process could not be started");
    return;
  }
  char *msg = got;
  while (*msg >= '0' && *msg <= '9') msg++;
  struct jbuf b = {0};
  jb_printf(&b, "{\"pid\":%.*s", (int)(msg - got), got);
  if (*msg) {
    jb_raw(&b, ",\"error\":", 9);
    jb_str(&b, msg);
  }
  jb_raw(&b, "}", 1);
  respond(r->fd, 201, "application/json", b.p, b.len);
  jb_free(&b);
}

/* One process's JSON into `b`; 0, or -1 when there is no such process. */
static int proc_json(struct jbuf *b, const char *name) {
  int dfd = openat(state_fd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return -1;
  char *meta = read_small(dfd, "meta");
  if (!meta) {
    close(dfd);
    return -1;
  }
  char *status = read_small(dfd, "status");
  jb_raw(b, "{", 1);
  jb_raw(b, meta, strlen(meta));
  if (status) {
    jb_raw(b, ",", 1);
    jb_raw(b, status, strlen(status));
  } else {
    char *kp = read_small(dfd, "keeper");
    int alive = kp && kill(atoi(kp), 0) == 0;
    free(kp);
    jb_printf(b, ",\"state\":\"%s\",\"exitCode\":null,\"signal\":null,\"endedAtMs\":null", alive ? "running" : "exited");
  }
  jb_raw(b, "}", 1);
  free(meta);
  free(status);
  close(dfd);
  return 0;
}

static int by_number(const void *a, const void *b) {
  return *(const int *)a - *(const int *)b;
}

static void list_procs(struct req *r) {
  int dup_fd = dup(state_fd);
  DIR *d = fdopendir(dup_fd);
  static int pids[65536];
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL && n < 65536)
    if (e->d_name[0] >= '1' && e->d_name[0] <= '9') pids[n++] = atoi(e->d_name);
  if (d) closedir(d);
  qsort(pids, (size_t)n, sizeof *pids, by_number);
  struct jbuf b = {0};
  jb_raw(&b, "{\"processes\":[", 14);
  int first = 1;
  for (int i = 0; i < n; i++) {
    char name[32];
    snprintf(name, sizeof name, "%d", pids[i]);
    size_t before = b.len;
    if (!first) jb_raw(&b, ",", 1);
    if (proc_json(&b, name) != 0) {
      b.len = before;
      continue;
    }
    first = 0;
  }
  jb_raw(&b, "]}", 2);
  respond(r->fd, 200, "application/json", b.p, b.len);
  jb_free(&b);
}

static int exited(int dfd) {
  return faccessat(dfd, "status", F_OK, 0) == 0;
}

static void read_output(struct req *r, int dfd) {
  char stream[16] = "stdout";
  query_get(r, "stream", stream, sizeof stream);
  if (strcmp(stream, "stdout") != 0 && strcmp(stream, "stderr") != 0) {
    respond_error(r->fd, 400, "bad_request", "stream must be stdout or stderr");
    return;
  }
  long long offset = query_num(r, "offset", 0), limit = query_num(r, "limit", 1 << 20);
  if (offset < 0 || limit < 0) {
    respond_error(r->fd, 400, "bad_request", "offset and limit must not be negative");
    return;
  }
  if (limit > OUTPUT_CAP) limit = OUTPUT_CAP;
  int done = exited(dfd); /* before the size: once the status exists, every byte is in the file */
  int f = openat(dfd, stream, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (f < 0 || fstat(f, &st) != 0) {
    respond_error(r->fd, 404, "not_found", "no output");
    return;
  }
  char dname[32];
  snprintf(dname, sizeof dname, "%s.dropped", stream);
  char *dropped = read_small(dfd, dname);
  long long n = st.st_size > offset ? st.st_size - offset : 0;
  if (n > limit) n = limit;
  char extra[200];
  snprintf(extra, sizeof extra, "x-next-offset: %lld\r\nx-dropped: %lld\r\n%s", offset + n, dropped ? atoll(dropped) : 0LL,
           done && offset + n >= st.st_size ? "x-eof: 1\r\n" : "");
  free(dropped);
  send_head(r->fd, 200, "application/octet-stream", n, extra);
  static char buf[IO_CHUNK];
  while (n > 0) {
    ssize_t k = pread(f, buf, n < (long long)sizeof buf ? (size_t)n : sizeof buf, offset);
    if (k <= 0 || write_all(r->fd, buf, (size_t)k) != 0) break;
    n -= k;
    offset += k;
  }
  close(f);
}

static void write_stdin(struct req *r, int dfd) {
  int f = openat(dfd, "stdin", O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (f < 0) {
    respond_error(r->fd, 409, "conflict", exited(dfd) ? "the process has exited" : "the process has no stdin (start it with stdin=1) or it was closed");
    return;
  }
  fcntl(f, F_SETFL, 0);
  /* One writer at a time: the bytes of two requests never interleave. */
  flock(f, LOCK_EX);
  static char buf[IO_CHUNK];
  ssize_t n;
  while ((n = body_read(r, buf, sizeof buf)) > 0)
    if (write_all(f, buf, (size_t)n) != 0) break;
  if (query_num(r, "eof", 0) == 1) {
    int c = openat(dfd, "ctl", O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (c >= 0) {
      (void)!write(c, "e", 1);
      close(c);
    }
  }
  close(f);
  respond(r->fd, 204, NULL, NULL, 0);
}

static void wait_proc(struct req *r, int dfd, const char *name) {
  long long timeout = query_num(r, "timeout_ms", 30000);
  if (timeout < 0) timeout = 0;
  if (timeout > 3600000) timeout = 3600000;
  long long until = mono_ms() + timeout;
  int in = inotify_init1(IN_CLOEXEC);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", dfd);
  if (in >= 0) inotify_add_watch(in, path, IN_MOVED_TO | IN_CREATE);
  while (!exited(dfd)) {
    long long left = until - mono_ms();
    if (left <= 0) break;
    struct pollfd p = {.fd = in, .events = POLLIN};
    if (in < 0 || poll(&p, 1, (int)(left < 200 ? left : 200)) > 0) {
      char ev[4096];
      if (in >= 0 && read(in, ev, sizeof ev) < 0) {
      }
    }
  }
  if (in >= 0) close(in);
  struct jbuf b = {0};
  if (proc_json(&b, name) != 0) respond_error(r->fd, 404, "not_found", "no process %s", name);
  else respond(r->fd, 200, "application/json", b.p, b.len);
  jb_free(&b);
}

void handle_procs(struct req *r) {
  if (strcmp(r->path, "/v1/procs") == 0 || strcmp(r->path, "/v1/procs/") == 0) {
    if (strcmp(r->method, "GET") == 0) list_procs(r);
    else respond_error(r->fd, 405, "method_not_allowed", "GET only");
    return;
  }
  const char *p = r->path + 10;
  char name[16];
  size_t i = 0;
  while (p[i] >= '0' && p[i] <= '9' && i < sizeof name - 1) {
    name[i] = p[i];
    i++;
  }
  name[i] = '\0';
  const char *rest = p + i;
  int dfd = i > 0 && name[0] != '0' ? openat(state_fd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
  if (dfd < 0 || faccessat(dfd, "meta", F_OK, 0) != 0) {
    respond_error(r->fd, 404, "not_found", "no process %.20s", p);
    return;
  }
  int get = strcmp(r->method, "GET") == 0, post = strcmp(r->method, "POST") == 0;
  if (*rest == '\0' && get) {
    struct jbuf b = {0};
    if (proc_json(&b, name) != 0) respond_error(r->fd, 404, "not_found", "no process %s", name);
    else respond(r->fd, 200, "application/json", b.p, b.len);
    jb_free(&b);
  } else if (strcmp(rest, "/output") == 0 && get) {
    read_output(r, dfd);
  } else if (strcmp(rest, "/wait") == 0 && get) {
    wait_proc(r, dfd, name);
  } else if (strcmp(rest, "/stdin") == 0 && post) {
    write_stdin(r, dfd);
  } else if (strcmp(rest, "/signal") == 0 && post) {
    long long sig = query_num(r, "sig", -1);
    if (sig < 1 || sig > 64) respond_error(r->fd, 400, "bad_request", "sig must be a signal number");
    else if (exited(dfd)) respond_error(r->fd, 409, "conflict", "the process has exited");
    else if (kill(-atoi(name), (int)sig) != 0 && kill(atoi(name), (int)sig) != 0) respond_error(r->fd, 409, "conflict", "cannot signal: %s", strerror(errno));
    else respond(r->fd, 204, NULL, NULL, 0);
  } else {
    respond_error(r->fd, 404, "not_found", "no route %s %s", r->method, r->path);
  }
  close(dfd);
}
