/* POST /v1/exec in the foreground: the command's stdout and stderr as frames ([u8 type][u32 BE length][payload]:
 * 1 stdout, 2 stderr, 3 exit, 4 error) until the connection closes. On a PTY (tty.c) its one output is stdout and the
 * body's input frames go through a helper of tty.c's. Flow control: at most one pipe read (64 KiB) is
 * held; while it has not gone out on the socket, the pipes are not read, so a slow reader slows the command down
 * (its pipe fills) rather than growing memory here. With stdin=1 a helper process copies the rest of the request
 * body into the command's stdin, closing it at the body's end. The timeout kills the process group, and so does the
 * client going away (watched once the body is in). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "exec.h"

enum { F_STDOUT = 1, F_STDERR = 2, F_EXIT = 3, F_ERROR = 4 };

static void put_header(unsigned char *h, int type, size_t len) {
  h[0] = (unsigned char)type;
  h[1] = (unsigned char)(len >> 24);
  h[2] = (unsigned char)(len >> 16);
  h[3] = (unsigned char)(len >> 8);
  h[4] = (unsigned char)len;
}

static int send_frame(int fd, int type, const char *data, size_t len) {
  unsigned char h[5];
  put_header(h, type, len);
  if (write_all(fd, h, 5) != 0) return -1;
  return len ? write_all(fd, data, len) : 0;
}

static void send_exit(int fd, int status, int timed_out, long long ms) {
  char msg[128];
  int n = WIFSIGNALED(status) ? snprintf(msg, sizeof msg, "signal=%d", WTERMSIG(status)) : snprintf(msg, sizeof msg, "code=%d", WEXITSTATUS(status));
  if (timed_out) n += snprintf(msg + n, sizeof msg - (size_t)n, " timeout=1");
  n += snprintf(msg + n, sizeof msg - (size_t)n, " ms=%lld", ms);
  send_frame(fd, F_EXIT, msg, (size_t)n);
}

static void kill_group(pid_t pid) {
  kill(-pid, SIGKILL);
  kill(pid, SIGKILL);
}

void handle_exec(struct req *r) {
  static struct exec_spec sp;
  if (read_exec_spec(r, &sp) != 0) return;
  struct ids ids;
  char err[512];
  if (resolve_user(sp.user, &ids, err, sizeof err) != 0) {
    respond_error(r->fd, 400, "bad_request", "%s", err);
    return;
  }
  char **env = merged_env(&sp, &ids);
  if (sp.background) {
    start_background(r, &sp, &ids, env);
    return;
  }
  int out[2], errp[2], in[2];
  if (sp.tty) {
    /* One terminal for all three; the master is read as stdout (errp[0] -1: no stderr) and written by the pump. */
    int master, slave;
    if (open_tty(r->fd, &sp, &ids, &master, &slave) != 0) return;
    out[0] = master;
    out[1] = slave;
    errp[0] = -1;
    errp[1] = fcntl(slave, F_DUPFD_CLOEXEC, 0);
    in[0] = fcntl(slave, F_DUPFD_CLOEXEC, 0);
    in[1] = -1;
  } else if (pipe2(out, O_CLOEXEC) || pipe2(errp, O_CLOEXEC) || pipe2(in, O_CLOEXEC)) {
    respond_error(r->fd, 500, "internal", "pipe: %s", strerror(errno));
    return;
  }
  long long t0 = mono_ms();
  int ef;
  pid_t pid = start_command(&sp, &ids, env, in[0], out[1], errp[1], &ef);
  close(in[0]);
  close(out[1]);
  close(errp[1]);
  if (pid < 0) {
    respond_error(r->fd, 500, "internal", "fork: %s", strerror(errno));
    return;
  }
  char msg[1024];
  int failed = start_failed(ef, msg, sizeof msg);
  send_head(r->fd, 200, "application/vnd.agentvm.exec-frames", -1, NULL);
  int status = 0;
  if (failed) {
    waitpid(pid, &status, 0);
    send_frame(r->fd, F_ERROR, msg, strlen(msg));
    send_exit(r->fd, 127 << 8, 0, mono_ms() - t0);
    return;
  }
  pid_t pump = -1;
  if (sp.tty) {
    pump = fork();
    if (pump == 0) {
      tty_pump(r, out[0], pid);
      _exit(0);
    }
  } else if (sp.use_stdin) {
    pump = fork();
    if (pump == 0) {
      close(out[0]);
      close(errp[0]);
      static char buf[IO_CHUNK];
      ssize_t n;
      while ((n = body_read(r, buf, sizeof buf)) > 0)
        if (write_all(in[1], buf, (size_t)n) != 0) break;
      _exit(0);
    }
  }
  if (in[1] >= 0) close(in[1]);
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  if (errp[0] >= 0) fcntl(errp[0], F_SETFL, O_NONBLOCK);

  int pfd = pidfd_of(pid);
  /* While the helper reads the body the socket is its; once the body is in, a close by the client is watched for. */
  int pump_fd = pump > 0 ? pidfd_of(pump) : -1;
  int watch_close = pump <= 0;
  static unsigned char buf[5 + IO_CHUNK];
  size_t pend_off = 0, pend_len = 0;
  int open_fd[2] = {out[0], errp[0]};
  int exited = 0, timed_out = 0, gone = 0;
  long long deadline = sp.timeout_ms > 0 ? t0 + sp.timeout_ms : 0;
  long long ended = 0;
  for (;;) {
    if (pend_len == 0 && exited && open_fd[0] < 0 && open_fd[1] < 0) break;
    struct pollfd fds[5];
    int n = 0, sock_i = -1, pid_i = -1, pump_i = -1, pipe_i[2] = {-1, -1};
    if (pend_len > 0) {
      sock_i = n;
      fds[n++] = (struct pollfd){.fd = r->fd, .events = POLLOUT | (watch_close ? POLLRDHUP : 0)};
    } else {
      for (int k = 0; k < 2; k++)
        if (open_fd[k] >= 0) {
          pipe_i[k] = n;
          fds[n++] = (struct pollfd){.fd = open_fd[k], .events = POLLIN};
        }
      if (watch_close) {
        sock_i = n;
        fds[n++] = (struct pollfd){.fd = r->fd, .events = POLLRDHUP};
      }
    }
    if (pump_fd >= 0) {
      pump_i = n;
      fds[n++] = (struct pollfd){.fd = pump_fd, .events = POLLIN};
    }
    if (!exited && pfd >= 0) {
      pid_i = n;
      fds[n++] = (struct pollfd){.fd = pfd, .events = POLLIN};
    }
    int timeout = -1;
    if (exited && pend_len == 0) timeout = 0; /* draining: what the pipes hold now, then the end */
    else if (deadline) timeout = (int)(deadline - mono_ms() > 0 ? deadline - mono_ms() : 0);
    if (!exited && pfd < 0 && (timeout < 0 || timeout > 100)) timeout = 100;
    int ready = poll(fds, (nfds_t)n, timeout);
    if (ready < 0 && errno != EINTR) break;
    if (deadline && !exited && mono_ms() >= deadline) {
      kill_group(pid);
      timed_out = 1;
      deadline = 0;
    }
    if ((pid_i >= 0 && (fds[pid_i].revents & POLLIN)) || (pfd < 0 && !exited && waitpid(pid, &status, WNOHANG) == pid)) {
      if (pfd >= 0) waitpid(pid, &status, 0);
      exited = 1;
      ended = mono_ms();
    }
    if (pump_i >= 0 && (fds[pump_i].revents & POLLIN)) {
      waitpid(pump, NULL, 0);
      close(pump_fd);
      pump_fd = -1;
      pump = -1;
      watch_close = 1;
    }
    if (ready == 0 && exited && pend_len == 0) break;
    if (sock_i >= 0 && (fds[sock_i].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
      gone = 1; /* the client went away: so does the command */
      break;
    }
    if (pend_len > 0 && sock_i >= 0 && (fds[sock_i].revents & POLLOUT)) {
      ssize_t k = send(r->fd, buf + pend_off, pend_len, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k < 0 && errno != EAGAIN && errno != EINTR) {
        gone = 1;
        break;
      }
      if (k > 0) {
        pend_off += (size_t)k;
        pend_len -= (size_t)k;
      }
      continue;
    }
    for (int k = 0; k < 2 && pend_len == 0; k++) {
      if (pipe_i[k] < 0 || !fds[pipe_i[k]].revents) continue;
      ssize_t got = read(open_fd[k], buf + 5, IO_CHUNK);
      if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (got <= 0) {
        close(open_fd[k]);
        open_fd[k] = -1;
        continue;
      }
      put_header(buf, k == 0 ? F_STDOUT : F_STDERR, (size_t)got);
      pend_off = 0;
      pend_len = 5 + (size_t)got;
      ssize_t s = send(r->fd, buf, pend_len, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (s < 0 && errno != EAGAIN && errno != EINTR) {
        gone = 1;
        break;
      }
      if (s > 0) {
        pend_off = (size_t)s;
        pend_len -= (size_t)s;
      }
    }
    if (gone) break;
  }
  if (pump > 0) {
    kill(pump, SIGKILL);
    waitpid(pump, NULL, 0);
  }
  if (pump_fd >= 0) close(pump_fd);
  if (gone) {
    if (!exited) {
      kill_group(pid);
      waitpid(pid, NULL, 0);
    }
    return;
  }
  send_exit(r->fd, status, timed_out, (ended ? ended : mono_ms()) - t0);
}
