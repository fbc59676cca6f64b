/* The exec server's parts (fleet-agent/guest/guest-exec/, compiled together by build-image.ts and, for the process
 * driver, by drivers/process/launcher.ts). The wire protocol is documented in docs/exec.md.
 *   main.c   options, the listeners (TCP, vsock), the accept loop: a child per connection, which checks the key, reads
 *            the image's defaults, chroots into the root and dispatches the request
 *   http.c   reading one HTTP/1.1 request (head, query, a body by length or chunked), writing answers, JSON text
 *   paths.c  path rules: absolute, no `..`, resolved inside the root, the forbidden and hidden places, device nodes
 *   users.c  `user=` resolved from the root's /etc/passwd and /etc/group (static glibc has no NSS)
 *   run.c    the exec spec, the environment, starting a command as the image's user in its own session
 *   exec.c   POST /v1/exec in the foreground: frames out, stdin in, flow control, the timeout
 *   tty.c    a foreground exec on a pseudo-terminal: the PTY, its input frames (bytes, window sizes), the hangup
 *   procs.c  background processes: the keeper, their files under the state directory, /v1/procs/…
 *   files.c  /v1/files: read, list, write by rename, delete
 *   tar.c    /v1/tar: a tree out as ustar (pax for long names), a tar in, every entry confined */
#ifndef GUEST_EXEC_H
#define GUEST_EXEC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define EXEC_VERSION "agentvm-exec/2"
#define IO_CHUNK 65536

/* main.c: the server's configuration (fixed at start) and the image's defaults (read per connection). */
struct config {
  const char *root;
  const char *spec_path; /* NULL: the demo (root user, our own environment) */
  const char *key_file;
  const char *state_dir;
  const char *protect[32]; /* writes and deletes refused at and below these */
  int nprotect;
  const char *hide[8]; /* reads refused too */
  int nhide;
};
extern struct config cfg;

struct defaults {
  uid_t uid;
  gid_t gid;
  const char *workdir;
  char **env;
};
extern struct defaults defaults;
/* The state directory, opened before the chroot (it is outside the root). */
extern int state_fd;
/* The server's own /dev/pts (O_PATH), opened before the chroot: a terminal for a root without one (tty.c). */
extern int host_pts_fd;
long long now_ms(void);
long long mono_ms(void);

/* http.c */
struct req {
  int fd;
  char method[8];
  char path[1024];
  char query[4096];
  char key[80];
  long long content_length; /* -1: none given */
  int chunked;
  /* Body reading: bytes read with the head, then the socket. */
  char buf[16384];
  size_t buf_len, buf_pos;
  long long body_left; /* by length; chunked: the current chunk's rest */
  int body_done;
  int chunk_state; /* 0: expecting a size line, 1: in data, 2: done */
};
int read_request(struct req *r);
ssize_t body_read(struct req *r, void *out, size_t n);
int body_drain(struct req *r);
int query_get(const struct req *r, const char *name, char *out, size_t outlen);
long long query_num(const struct req *r, const char *name, long long def);
int write_all(int fd, const void *buf, size_t len);
void send_head(int fd, int status, const char *ctype, long long length, const char *extra);
void respond(int fd, int status, const char *ctype, const char *body, size_t len);
__attribute__((format(printf, 4, 5))) void respond_error(int fd, int status, const char *code, const char *fmt, ...);
void linger_close(int fd);

struct jbuf {
  char *p;
  size_t len, cap;
};
void jb_raw(struct jbuf *b, const char *s, size_t n);
__attribute__((format(printf, 2, 3))) void jb_printf(struct jbuf *b, const char *fmt, ...);
void jb_str(struct jbuf *b, const char *s);
void jb_free(struct jbuf *b);

/* paths.c: 0 or an HTTP status (the answer already sent) */
int path_syntax(int fd, const char *path);
int path_hidden(const char *resolved);
int path_protected(const char *resolved);
/* The path with its directories resolved (symlinks followed inside the root); the last component too when `follow`
 * and it exists. Answers 0 and fills `out`, or sends the error and answers its status. */
int resolve(int fd, const char *path, int follow, char *out, size_t outlen);
int deny_write(int fd, const char *resolved);

/* users.c */
struct ids {
  uid_t uid;
  gid_t gid;
  gid_t groups[64];
  int ngroups;
  char home[512];
};
int resolve_user(const char *spec, struct ids *out, char *err, size_t errlen);
int ids_for_uid(uid_t uid, gid_t gid, struct ids *out);

/* run.c */
struct exec_spec {
  char *raw;
  char *argv[4096];
  int argc;
  char *env[4096];
  int nenv;
  const char *cwd;
  const char *user;
  long long timeout_ms;
  int background;
  int use_stdin;
  int tty; /* on a PTY of tty_rows x tty_cols (`tty=<rows>x<cols>`) */
  int tty_rows, tty_cols;
};
int read_exec_spec(struct req *r, struct exec_spec *sp);
char **merged_env(struct exec_spec *sp, const struct ids *ids);
/* Forks the command (its own session, the user's ids, cwd); `err_out` gets why it could not start (read it to EOF:
 * empty means it runs). Answers the pid or -1. */
pid_t start_command(struct exec_spec *sp, const struct ids *ids, char **env, int in_fd, int out_fd, int err_fd, int *err_out);
/* Reads the start pipe: 0 when the command runs, else 1 with the message. */
int start_failed(int err_fd, char *msg, size_t len);
int pidfd_of(pid_t pid);

/* tty.c: `<rows>x<cols>` (each 1..65535) → 0; the PTY (answers 0, or sends the error and answers -1); the input pump. */
int parse_tty_size(const char *s, int *rows, int *cols);
int open_tty(int fd, const struct exec_spec *sp, const struct ids *ids, int *master, int *slave);
void tty_pump(struct req *r, int master, pid_t pid);

/* exec.c, procs.c, files.c, tar.c */
void handle_exec(struct req *r);
void start_background(struct req *r, struct exec_spec *sp, const struct ids *ids, char **env);
void handle_procs(struct req *r);
void handle_files(struct req *r);
void handle_tar(struct req *r);

#endif
