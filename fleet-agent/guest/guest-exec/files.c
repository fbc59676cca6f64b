/* /v1/files: GET a regular file's bytes (with its mode, owner and mtime in headers) or a directory's listing (JSON);
 * PUT bytes into a temporary file beside the target, then renamed over it (a reader never sees half of it), owned by
 * the image's user unless told; DELETE a file, a link or a directory (recursive=1 for a tree). Paths are checked and
 * resolved by paths.c; device nodes, fifos and sockets are never opened. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>
#include <linux/magic.h>
#include "exec.h"

static long long mtime_ms(const struct stat *st) {
  return (long long)st->st_mtim.tv_sec * 1000 + st->st_mtim.tv_nsec / 1000000;
}

static const char *type_name(mode_t m) {
  return S_ISREG(m) ? "file" : S_ISDIR(m) ? "dir" : S_ISLNK(m) ? "symlink" : "other";
}

/* A directory where no write may land, whatever path led to it (the second line behind the path rules). */
int dir_fd_forbidden(int dfd) {
  struct statfs fs;
  if (fstatfs(dfd, &fs) != 0) return 1;
  return fs.f_type == PROC_SUPER_MAGIC || fs.f_type == SYSFS_MAGIC || fs.f_type == CGROUP2_SUPER_MAGIC || fs.f_type == CGROUP_SUPER_MAGIC;
}

static void list_dir(int fd, const char *path) {
  DIR *d = opendir(path);
  if (!d) {
    respond_error(fd, 403, "forbidden_path", "cannot list %.200s: %s", path, strerror(errno));
    return;
  }
  struct jbuf b = {0};
  jb_raw(&b, "{\"entries\":[", 12);
  int first = 1;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!first) jb_raw(&b, ",", 1);
    first = 0;
    jb_raw(&b, "{\"name\":", 8);
    jb_str(&b, e->d_name);
    jb_printf(&b, ",\"type\":\"%s\",\"size\":%lld,\"mode\":%u,\"uid\":%u,\"gid\":%u,\"mtimeMs\":%lld}", type_name(st.st_mode), (long long)st.st_size,
              (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid, (unsigned)st.st_gid, mtime_ms(&st));
  }
  closedir(d);
  jb_raw(&b, "]}", 2);
  respond(fd, 200, "application/json", b.p, b.len);
  jb_free(&b);
}

static void get_file(struct req *r, const char *path) {
  char real[4096];
  if (resolve(r->fd, path, 1, real, sizeof real) != 0) return;
  if (path_hidden(real)) {
    respond_error(r->fd, 403, "forbidden_path", "reading %.200s is not allowed", real);
    return;
  }
  struct stat st;
  if (lstat(real, &st) != 0) {
    respond_error(r->fd, 404, "not_found", "no such file: %.200s", path);
    return;
  }
  if (S_ISDIR(st.st_mode)) {
    list_dir(r->fd, real);
    return;
  }
  if (!S_ISREG(st.st_mode)) {
    respond_error(r->fd, 403, "forbidden_path", "%.200s is not a regular file or a directory", path);
    return;
  }
  int f = open(real, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  struct stat fst;
  if (f < 0 || fstat(f, &fst) != 0 || !S_ISREG(fst.st_mode)) {
    if (f >= 0) close(f);
    respond_error(r->fd, 403, "forbidden_path", "cannot open %.200s", path);
    return;
  }
  char extra[256];
  snprintf(extra, sizeof extra, "x-file-mode: %04o\r\nx-file-uid: %u\r\nx-file-gid: %u\r\nx-file-mtime-ms: %lld\r\n", (unsigned)(fst.st_mode & 07777),
           (unsigned)fst.st_uid, (unsigned)fst.st_gid, mtime_ms(&fst));
  send_head(r->fd, 200, "application/octet-stream", (long long)fst.st_size, extra);
  static char buf[IO_CHUNK];
  long long left = fst.st_size;
  while (left > 0) {
    ssize_t n = read(f, buf, sizeof buf < (size_t)left ? sizeof buf : (size_t)left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break; /* shrank meanwhile: the connection ends short, the client sees it */
    if (write_all(r->fd, buf, (size_t)n) != 0) break;
    left -= n;
  }
  close(f);
}

/* Parses the PUT's mode/uid/gid; 0 or the error's status (sent). */
static int owner_args(struct req *r, mode_t *mode, uid_t *uid, gid_t *gid, mode_t def_mode) {
  char v[32];
  *mode = def_mode;
  if (query_get(r, "mode", v, sizeof v) && v[0]) {
    char *end;
    long m = strtol(v, &end, 8);
    if (*end || m < 0 || m > 07777) {
      respond_error(r->fd, 400, "bad_request", "mode must be octal, at most 07777");
      return 400;
    }
    *mode = (mode_t)m;
  }
  long long u = query_num(r, "uid", -1), g = query_num(r, "gid", -1);
  if (u < -1 || u > 0xfffffffeLL || g < -1 || g > 0xfffffffeLL) {
    respond_error(r->fd, 400, "bad_request", "uid and gid must be numbers");
    return 400;
  }
  *uid = u >= 0 ? (uid_t)u : defaults.uid;
  *gid = g >= 0 ? (gid_t)g : (u >= 0 ? (gid_t)u : defaults.gid);
  if (g < 0 && u >= 0) {
    struct ids ids;
    ids_for_uid((uid_t)u, (gid_t)u, &ids);
    *gid = ids.gid;
  }
  return 0;
}

/* mkdir -p of the directories above `path` that are missing, each checked, owned by uid:gid. 0 or the status (sent). */
int make_parents(int fd, const char *path, uid_t uid, gid_t gid) {
  char prefix[4096];
  for (const char *p = path + 1; *p; p++) {
    if (*p != '/') continue;
    size_t n = (size_t)(p - path);
    memcpy(prefix, path, n);
    prefix[n] = '\0';
    struct stat st;
    if (stat(prefix, &st) == 0) continue;
    char real[4096];
    int s = resolve(fd, prefix, 0, real, sizeof real);
    if (s) return s;
    if ((s = deny_write(fd, real)) != 0) return s;
    if (mkdir(real, 0755) != 0 && errno != EEXIST) {
      respond_error(fd, 400, "bad_request", "cannot create %.200s: %s", real, strerror(errno));
      return 400;
    }
    if (lchown(real, uid, gid) != 0) {
    }
  }
  return 0;
}

/* Opens the directory a resolved path is in, refused where writes may not land. -1 with the answer sent. */
int open_parent(int fd, const char *real, char *name, size_t namelen) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", real);
  char *slash = strrchr(dir, '/');
  snprintf(name, namelen, "%s", slash + 1);
  if (slash == dir) slash[1] = '\0';
  else *slash = '\0';
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    respond_error(fd, 404, "not_found", "no such directory: %.200s", dir);
    return -1;
  }
  if (dir_fd_forbidden(dfd)) {
    close(dfd);
    respond_error(fd, 403, "forbidden_path", "writing under %.200s is not allowed", dir);
    return -1;
  }
  return dfd;
}

static void put_file(struct req *r, const char *path) {
  mode_t mode;
  uid_t uid;
  gid_t gid;
  if (owner_args(r, &mode, &uid, &gid, 0644)) return;
  if (query_num(r, "mkdirs", 0) == 1 && make_parents(r->fd, path, uid, gid)) return;
  char real[4096], name[256];
  if (resolve(r->fd, path, 1, real, sizeof real) || deny_write(r->fd, real)) return;
  struct stat st;
  if (lstat(real, &st) == 0 && !S_ISREG(st.st_mode)) {
    if (S_ISDIR(st.st_mode)) respond_error(r->fd, 400, "bad_request", "%.200s is a directory", path);
    else respond_error(r->fd, 403, "forbidden_path", "%.200s is not a regular file", path);
    return;
  }
  int dfd = open_parent(r->fd, real, name, sizeof name);
  if (dfd < 0) return;
  char tmp[300];
  snprintf(tmp, sizeof tmp, ".%.200s.agentvm-%d", name, (int)getpid());
  int f = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (f < 0) {
    respond_error(r->fd, 400, "bad_request", "cannot write beside %.200s: %s", path, strerror(errno));
    close(dfd);
    return;
  }
  static char buf[IO_CHUNK];
  long long size = 0;
  ssize_t n;
  while ((n = body_read(r, buf, sizeof buf)) > 0) {
    if (write_all(f, buf, (size_t)n) != 0) {
      n = -2;
      break;
    }
    size += n;
  }
  if (n < 0) {
    int e = errno;
    close(f);
    unlinkat(dfd, tmp, 0);
    close(dfd);
    if (n == -2) respond_error(r->fd, 507, "internal", "writing %.200s failed: %s", path, strerror(e));
    else respond_error(r->fd, 400, "bad_request", "the body ended early");
    return;
  }
  if (fchown(f, uid, gid) != 0 || fchmod(f, mode) != 0 || renameat(dfd, tmp, dfd, name) != 0) {
    int e = errno;
    close(f);
    unlinkat(dfd, tmp, 0);
    close(dfd);
    respond_error(r->fd, 400, "bad_request", "cannot put %.200s in place: %s", path, strerror(e));
    return;
  }
  close(f);
  close(dfd);
  char out[200];
  int len = snprintf(out, sizeof out, "{\"size\":%lld,\"mode\":%u,\"uid\":%u,\"gid\":%u}", size, (unsigned)mode, (unsigned)uid, (unsigned)gid);
  respond(r->fd, 201, "application/json", out, (size_t)len);
}

/* rm -rf of `name` in `dfd`, never following a symlink. 0 or -1 (errno). */
int remove_tree(int dfd, const char *name) {
  struct stat st;
  if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return -1;
  if (!S_ISDIR(st.st_mode)) return unlinkat(dfd, name, 0);
  int sub = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (sub < 0) return -1;
  DIR *d = fdopendir(sub);
  if (!d) {
    close(sub);
    return -1;
  }
  struct dirent *e;
  int rc = 0;
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (remove_tree(dirfd(d), e->d_name) != 0) rc = -1;
  }
  closedir(d);
  if (rc == 0) rc = unlinkat(dfd, name, AT_REMOVEDIR);
  return rc;
}

static void delete_path(struct req *r, const char *path) {
  char real[4096], name[256];
  if (resolve(r->fd, path, 0, real, sizeof real) || deny_write(r->fd, real)) return;
  if (strcmp(real, "/") == 0) {
    respond_error(r->fd, 403, "forbidden_path", "the root itself cannot be deleted");
    return;
  }
  struct stat st;
  if (lstat(real, &st) != 0) {
    respond_error(r->fd, 404, "not_found", "no such file: %.200s", path);
    return;
  }
  int recursive = query_num(r, "recursive", 0) == 1;
  if (S_ISDIR(st.st_mode) && recursive) {
    /* A tree holding a place no write may touch (/run holds /run/agentvm) is refused whole. */
    static const char *const inner[] = {"/proc", "/sys", "/dev", "/run/agentvm"};
    size_t rl = strlen(real);
    for (size_t i = 0; i < sizeof inner / sizeof *inner + (size_t)cfg.nprotect + (size_t)cfg.nhide; i++) {
      const char *p = i < 4 ? inner[i] : i < 4 + (size_t)cfg.nprotect ? cfg.protect[i - 4] : cfg.hide[i - 4 - (size_t)cfg.nprotect];
      if (strncmp(p, real, rl) == 0 && p[rl] == '/') {
        respond_error(r->fd, 403, "forbidden_path", "%.200s holds %.200s, which may not be deleted", real, p);
        return;
      }
    }
  }
  int dfd = open_parent(r->fd, real, name, sizeof name);
  if (dfd < 0) return;
  int rc = S_ISDIR(st.st_mode) ? (recursive ? remove_tree(dfd, name) : unlinkat(dfd, name, AT_REMOVEDIR)) : unlinkat(dfd, name, 0);
  int e = errno;
  close(dfd);
  if (rc != 0) {
    if (e == ENOTEMPTY || e == EEXIST) respond_error(r->fd, 409, "conflict", "directory not empty: %.200s (recursive=1 deletes a tree)", path);
    else respond_error(r->fd, 400, "bad_request", "cannot delete %.200s: %s", path, strerror(e));
    return;
  }
  respond(r->fd, 204, NULL, NULL, 0);
}

void handle_files(struct req *r) {
  char path[4096];
  if (!query_get(r, "path", path, sizeof path)) {
    respond_error(r->fd, 400, "bad_request", "path= is required");
    return;
  }
  if (path_syntax(r->fd, path)) return;
  if (strcmp(r->method, "GET") == 0) get_file(r, path);
  else if (strcmp(r->method, "PUT") == 0) put_file(r, path);
  else if (strcmp(r->method, "DELETE") == 0) delete_path(r, path);
  else respond_error(r->fd, 405, "method_not_allowed", "GET, PUT or DELETE");
}
