/* /v1/tar: GET a file or tree as a ustar stream (pax headers for long names, large sizes and ids), entries named from
 * the path's last component (as `docker cp` does), symlinks kept as links, never followed below the top, /proc, /sys,
 * /dev and hidden paths left out. PUT extracts a tar (ustar, pax, GNU long names) under a directory (made): every
 * entry is confined to it: a `..` segment, an absolute symlink or one that climbs out, or a path through a symlink
 * is refused with 400, and nothing after it is written; modes, owners and mtimes are kept; device nodes and fifos are
 * skipped. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "exec.h"

int make_parents(int fd, const char *path, uid_t uid, gid_t gid);

static const char *const skip_dirs[] = {"/proc", "/sys", "/dev"};

static void octal(char *dst, size_t len, unsigned long long v) {
  char tmp[32];
  snprintf(tmp, sizeof tmp, "%0*llo", (int)len - 1, v);
  memcpy(dst, tmp, len - 1);
  dst[len - 1] = '\0';
}

/* One pax record "<len> key=value\n" (its length counts itself). */
static void pax_record(struct jbuf *b, const char *key, const char *value) {
  size_t body = strlen(key) + strlen(value) + 3;
  size_t len = body + 1;
  for (;;) {
    char num[24];
    size_t total = body + (size_t)snprintf(num, sizeof num, "%zu", len);
    if (total == len) break;
    len = total;
  }
  jb_printf(b, "%zu ", len);
  jb_raw(b, key, strlen(key));
  jb_raw(b, "=", 1);
  jb_raw(b, value, strlen(value));
  jb_raw(b, "\n", 1);
}

static void fill_header(char *h, const char *name, unsigned mode, unsigned long long uid, unsigned long long gid, unsigned long long size, long long mtime,
                        char type, const char *link) {
  memset(h, 0, 512);
  snprintf(h, 100, "%s", name);
  octal(h + 100, 8, mode);
  octal(h + 108, 8, uid > 07777777 ? 0 : uid);
  octal(h + 116, 8, gid > 07777777 ? 0 : gid);
  octal(h + 124, 12, size > 077777777777ULL ? 0 : size);
  octal(h + 136, 12, mtime < 0 ? 0 : (unsigned long long)mtime);
  h[156] = type;
  if (link) snprintf(h + 157, 100, "%s", link);
  memcpy(h + 257, "ustar\0" "00", 8);
  memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (int i = 0; i < 512; i++) sum += (unsigned char)h[i];
  snprintf(h + 148, 8, "%06o", sum);
  h[155] = ' ';
}

static int tar_header(int fd, const char *name, const struct stat *st, char type, const char *link) {
  char h[512];
  unsigned long long size = type == '0' ? (unsigned long long)st->st_size : 0;
  if (strlen(name) > 99 || (link && strlen(link) > 99) || size > 077777777777ULL || st->st_uid > 07777777 || st->st_gid > 07777777) {
    struct jbuf b = {0};
    char num[32];
    if (strlen(name) > 99) pax_record(&b, "path", name);
    if (link && strlen(link) > 99) pax_record(&b, "linkpath", link);
    if (size > 077777777777ULL) snprintf(num, sizeof num, "%llu", size), pax_record(&b, "size", num);
    if (st->st_uid > 07777777) snprintf(num, sizeof num, "%u", (unsigned)st->st_uid), pax_record(&b, "uid", num);
    if (st->st_gid > 07777777) snprintf(num, sizeof num, "%u", (unsigned)st->st_gid), pax_record(&b, "gid", num);
    fill_header(h, "././@PaxHeader", 0644, 0, 0, b.len, st->st_mtim.tv_sec, 'x', NULL);
    int rc = write_all(fd, h, 512) || write_all(fd, b.p, b.len);
    size_t pad = (512 - b.len % 512) % 512;
    char zero[512] = {0};
    rc = rc || (pad && write_all(fd, zero, pad));
    jb_free(&b);
    if (rc) return -1;
  }
  fill_header(h, name, (unsigned)(st->st_mode & 07777), st->st_uid, st->st_gid, size, st->st_mtim.tv_sec, type, link);
  return write_all(fd, h, 512);
}

static int skip_path(const char *full) {
  if (path_hidden(full)) return 1;
  for (size_t i = 0; i < sizeof skip_dirs / sizeof *skip_dirs; i++)
    if (strcmp(full, skip_dirs[i]) == 0) return 1;
  return 0;
}

/* Archives `name` of `dfd` (full path `full`) as `arcname`. -1 when the connection is gone. */
static int tar_entry(int out, int dfd, const char *name, const char *full, const char *arcname) {
  struct stat st;
  if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return 0;
  if (S_ISLNK(st.st_mode)) {
    char link[4096];
    ssize_t n = readlinkat(dfd, name, link, sizeof link - 1);
    if (n < 0) return 0;
    link[n] = '\0';
    return tar_header(out, arcname, &st, '2', link);
  }
  if (S_ISREG(st.st_mode)) {
    int f = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (f < 0) return 0;
    if (tar_header(out, arcname, &st, '0', NULL) != 0) return close(f), -1;
    static char buf[IO_CHUNK];
    long long left = st.st_size;
    while (left > 0) {
      ssize_t n = read(f, buf, left < (long long)sizeof buf ? (size_t)left : sizeof buf);
      if (n <= 0) { /* shrank meanwhile: zeros keep the archive whole */
        memset(buf, 0, sizeof buf);
        n = left < (long long)sizeof buf ? left : (long long)sizeof buf;
      }
      if (write_all(out, buf, (size_t)n) != 0) return close(f), -1;
      left -= n;
    }
    close(f);
    size_t pad = (size_t)((512 - st.st_size % 512) % 512);
    char zero[512] = {0};
    return pad ? write_all(out, zero, pad) : 0;
  }
  if (!S_ISDIR(st.st_mode)) return 0; /* devices, fifos, sockets: left out */
  char dirname_[4200];
  snprintf(dirname_, sizeof dirname_, "%s/", arcname);
  if (tar_header(out, dirname_, &st, '5', NULL) != 0) return -1;
  int sub = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (sub < 0) return 0;
  DIR *d = fdopendir(sub);
  if (!d) return close(sub), 0;
  struct dirent *e;
  int rc = 0;
  while (rc == 0 && (e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    char cfull[4200], carc[4200];
    snprintf(cfull, sizeof cfull, "%s/%s", strcmp(full, "/") == 0 ? "" : full, e->d_name);
    if (skip_path(cfull)) continue;
    snprintf(carc, sizeof carc, "%s/%s", arcname, e->d_name);
    rc = tar_entry(out, dirfd(d), e->d_name, cfull, carc);
  }
  closedir(d);
  return rc;
}

static void get_tar(struct req *r, const char *path) {
  char real[4096];
  if (resolve(r->fd, path, 1, real, sizeof real) != 0) return;
  struct stat st;
  if (path_hidden(real)) {
    respond_error(r->fd, 403, "forbidden_path", "reading %.200s is not allowed", real);
    return;
  }
  if (lstat(real, &st) != 0) {
    respond_error(r->fd, 404, "not_found", "no such file: %.200s", path);
    return;
  }
  send_head(r->fd, 200, "application/x-tar", -1, NULL);
  const char *base = strcmp(real, "/") == 0 ? "." : strrchr(real, '/') + 1;
  char parent[4096];
  snprintf(parent, sizeof parent, "%s", real);
  char *slash = strrchr(parent, '/');
  if (slash == parent) slash[1] = '\0';
  else *slash = '\0';
  int dfd = open(strcmp(real, "/") == 0 ? "/" : parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0 && tar_entry(r->fd, dfd, strcmp(real, "/") == 0 ? "." : base, real, base) != 0) return;
  char zero[1024] = {0};
  write_all(r->fd, zero, sizeof zero);
}

/* Reads exactly n bytes of the body: 0, or -1 when it ended. */
static int body_exact(struct req *r, void *out, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t k = body_read(r, (char *)out + got, n - got);
    if (k <= 0) return -1;
    got += (size_t)k;
  }
  return 0;
}

static int body_skip(struct req *r, unsigned long long n) {
  static char buf[IO_CHUNK];
  while (n > 0) {
    size_t k = n < sizeof buf ? (size_t)n : sizeof buf;
    if (body_exact(r, buf, k) != 0) return -1;
    n -= k;
  }
  return 0;
}

static unsigned long long parse_num(const char *f, size_t len) {
  if ((unsigned char)f[0] & 0x80) { /* base-256 */
    unsigned long long v = (unsigned char)f[0] & 0x7f;
    for (size_t i = 1; i < len; i++) v = (v << 8) | (unsigned char)f[i];
    return v;
  }
  char tmp[16] = {0};
  memcpy(tmp, f, len < 15 ? len : 15);
  return strtoull(tmp, NULL, 8);
}

/* Normalizes an entry name in place (no leading "/" or "./", no "." segments, no trailing "/"): 0, or -1 on "..". */
static int clean_name(char *name) {
  char out[4096];
  size_t o = 0;
  for (char *p = name; *p;) {
    while (*p == '/') p++;
    char *end = strchrnul(p, '/');
    size_t len = (size_t)(end - p);
    if (len == 2 && p[0] == '.' && p[1] == '.') return -1;
    if (len > 0 && !(len == 1 && p[0] == '.')) {
      if (o) out[o++] = '/';
      memcpy(out + o, p, len);
      o += len;
    }
    p = end;
  }
  out[o] = '\0';
  memcpy(name, out, o + 1);
  return 0;
}

/* The directory holding `name` under rootfd, every component opened without following a symlink and made when
 * missing; `*leaf` is set to the last component. -1 (errno) when a component is a symlink or not a directory. */
static int open_dir_of(int rootfd, char *name, char **leaf) {
  int dfd = dup(rootfd);
  char *p = name;
  for (;;) {
    char *slash = strchr(p, '/');
    if (!slash) break;
    *slash = '\0';
    if (mkdirat(dfd, p, 0755) != 0 && errno != EEXIST) {
      close(dfd);
      *slash = '/';
      return -1;
    }
    int next = openat(dfd, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    *slash = '/';
    close(dfd);
    if (next < 0) return -1;
    dfd = next;
    p = slash + 1;
  }
  *leaf = p;
  return dfd;
}

/* A relative symlink target that stays inside the extraction directory from an entry at `name`. */
static int link_stays(const char *name, const char *target) {
  if (target[0] == '/') return 0;
  int depth = 0;
  for (const char *p = name; *p; p++)
    if (*p == '/') depth++;
  for (const char *p = target; *p;) {
    while (*p == '/') p++;
    const char *end = strchrnul(p, '/');
    size_t len = (size_t)(end - p);
    if (len == 2 && p[0] == '.' && p[1] == '.') {
      if (--depth < 0) return 0;
    } else if (len > 0 && !(len == 1 && p[0] == '.')) {
      depth++;
    }
    p = end;
  }
  return 1;
}

static void put_tar(struct req *r, const char *path) {
  char real[4096];
  if (resolve(r->fd, path, 1, real, sizeof real) || deny_write(r->fd, real)) return;
  struct stat st;
  if (stat(real, &st) != 0) {
    char deeper[4200];
    snprintf(deeper, sizeof deeper, "%s/x", real);
    if (make_parents(r->fd, deeper, defaults.uid, defaults.gid)) return;
  } else if (!S_ISDIR(st.st_mode)) {
    respond_error(r->fd, 400, "bad_request", "%.200s is not a directory", path);
    return;
  }
  int rootfd = open(real, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (rootfd < 0) {
    respond_error(r->fd, 400, "bad_request", "cannot open %.200s: %s", path, strerror(errno));
    return;
  }
  int entries = 0;
  static char pax_path[4096], pax_link[4096], name[4200], link[4200];
  long long pax_size = -1, pax_uid = -1, pax_gid = -1;
  pax_path[0] = pax_link[0] = '\0';
  int zeros = 0;
  for (;;) {
    unsigned char h[512];
    if (body_exact(r, h, 512) != 0) {
      if (zeros || r->body_done) break; /* a tar may end after one zero block, or with none at the body's end */
      respond_error(r->fd, 400, "bad_request", "the tar ends inside an entry (%d written)", entries);
      return;
    }
    int all_zero = 1;
    for (int i = 0; i < 512; i++)
      if (h[i]) all_zero = 0;
    if (all_zero) {
      if (++zeros == 2) break;
      continue;
    }
    zeros = 0;
    unsigned sum = 0, want = (unsigned)parse_num((char *)h + 148, 8);
    for (int i = 0; i < 512; i++) sum += (i >= 148 && i < 156) ? ' ' : h[i];
    if (sum != want) {
      respond_error(r->fd, 400, "bad_request", "bad tar header checksum (%d entries written)", entries);
      return;
    }
    char type = (char)h[156];
    unsigned long long size = parse_num((char *)h + 124, 12);
    if (pax_size >= 0) size = (unsigned long long)pax_size;
    if (type == 'x' || type == 'g' || type == 'L' || type == 'K') {
      if (size > (1 << 20)) {
        respond_error(r->fd, 400, "bad_request", "tar extension header too large");
        return;
      }
      char *data = malloc(size + 1);
      if (!data || body_exact(r, data, size) != 0 || body_skip(r, (512 - size % 512) % 512) != 0) {
        respond_error(r->fd, 400, "bad_request", "the tar ends inside a header");
        return;
      }
      data[size] = '\0';
      if (type == 'L') snprintf(pax_path, sizeof pax_path, "%s", data);
      else if (type == 'K') snprintf(pax_link, sizeof pax_link, "%s", data);
      else if (type == 'x') {
        for (char *p = data; p < data + size;) {
          char *sp = strchr(p, ' ');
          long len = strtol(p, NULL, 10);
          if (!sp || len <= 0 || p + len > data + size) break;
          char *kv = sp + 1, *eq = memchr(kv, '=', (size_t)(p + len - kv));
          if (eq) {
            *eq = '\0';
            p[len - 1] = '\0';
            if (strcmp(kv, "path") == 0) snprintf(pax_path, sizeof pax_path, "%s", eq + 1);
            else if (strcmp(kv, "linkpath") == 0) snprintf(pax_link, sizeof pax_link, "%s", eq + 1);
            else if (strcmp(kv, "size") == 0) pax_size = atoll(eq + 1);
            else if (strcmp(kv, "uid") == 0) pax_uid = atoll(eq + 1);
            else if (strcmp(kv, "gid") == 0) pax_gid = atoll(eq + 1);
          }
          p += len;
        }
      }
      free(data);
      continue;
    }
    if (pax_path[0]) snprintf(name, sizeof name, "%s", pax_path);
    else if (memcmp(h + 257, "ustar", 5) == 0 && h[345]) snprintf(name, sizeof name, "%.155s/%.100s", (char *)h + 345, (char *)h + 0);
    else snprintf(name, sizeof name, "%.100s", (char *)h);
    if (pax_link[0]) snprintf(link, sizeof link, "%s", pax_link);
    else snprintf(link, sizeof link, "%.100s", (char *)h + 157);
    unsigned mode = (unsigned)parse_num((char *)h + 100, 8) & 07777;
    uid_t uid = pax_uid >= 0 ? (uid_t)pax_uid : (uid_t)parse_num((char *)h + 108, 8);
    gid_t gid = pax_gid >= 0 ? (gid_t)pax_gid : (gid_t)parse_num((char *)h + 116, 8);
    long long mtime = (long long)parse_num((char *)h + 136, 12);
    pax_path[0] = pax_link[0] = '\0';
    pax_size = pax_uid = pax_gid = -1;
    unsigned long long pad = (512 - size % 512) % 512;
    if (clean_name(name) != 0) {
      respond_error(r->fd, 400, "bad_request", "tar entry with '..' refused: %.200s (%d entries written)", name, entries);
      return;
    }
    char full[8400];
    snprintf(full, sizeof full, "%s/%s", strcmp(real, "/") == 0 ? "" : real, name);
    if (name[0] && path_protected(full)) {
      respond_error(r->fd, 403, "forbidden_path", "tar entry under a protected path refused: %.200s (%d entries written)", name, entries);
      return;
    }
    if (!name[0] || type == '3' || type == '4' || type == '6') { /* the directory itself; devices and fifos: skipped */
      if (body_skip(r, size + pad) != 0) break;
      continue;
    }
    if (type == '2' && !link_stays(name, link)) {
      respond_error(r->fd, 400, "bad_request", "tar symlink leaving the directory refused: %.200s -> %.200s (%d entries written)", name, link, entries);
      return;
    }
    char *leaf;
    int dfd = open_dir_of(rootfd, name, &leaf);
    if (dfd < 0) {
      respond_error(r->fd, 400, "bad_request", "tar entry through a symlink or a file refused: %.200s (%d entries written)", name, entries);
      return;
    }
    int rc = 0;
    struct timespec times[2] = {{.tv_sec = mtime}, {.tv_sec = mtime}};
    if (type == '5') {
      if (mkdirat(dfd, leaf, 0700) != 0 && errno != EEXIST) rc = -1;
      int d = rc ? -1 : openat(dfd, leaf, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (d < 0) rc = -1;
      else {
        if (fchown(d, uid, gid) != 0 || fchmod(d, mode) != 0) rc = -1;
        futimens(d, times);
        close(d);
      }
      if (body_skip(r, size + pad) != 0) rc = -2;
    } else if (type == '2') {
      struct stat old;
      if (fstatat(dfd, leaf, &old, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(old.st_mode)) unlinkat(dfd, leaf, 0);
      if (symlinkat(link, dfd, leaf) != 0 || fchownat(dfd, leaf, uid, gid, AT_SYMLINK_NOFOLLOW) != 0) rc = -1;
      if (body_skip(r, size + pad) != 0) rc = -2;
    } else if (type == '1') {
      char *tleaf;
      if (clean_name(link) != 0 || !link[0]) rc = -3;
      int tfd = rc ? -1 : open_dir_of(rootfd, link, &tleaf);
      if (tfd < 0) rc = rc ? rc : -3;
      else {
        struct stat old;
        if (fstatat(dfd, leaf, &old, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(old.st_mode)) unlinkat(dfd, leaf, 0);
        if (linkat(tfd, tleaf, dfd, leaf, 0) != 0) rc = -1;
        close(tfd);
      }
      if (rc != -3 && body_skip(r, size + pad) != 0) rc = -2;
    } else { /* a regular file ('0', '\0', '7' and anything unknown) */
      struct stat old;
      if (fstatat(dfd, leaf, &old, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(old.st_mode)) unlinkat(dfd, leaf, 0);
      int f = openat(dfd, leaf, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
      static char buf[IO_CHUNK];
      unsigned long long left = size;
      while (left > 0) {
        size_t k = left < sizeof buf ? (size_t)left : sizeof buf;
        if (body_exact(r, buf, k) != 0) {
          rc = -2;
          break;
        }
        if (f >= 0 && write_all(f, buf, k) != 0) rc = -1;
        left -= k;
      }
      if (f < 0) rc = -1;
      else {
        if (fchown(f, uid, gid) != 0 || fchmod(f, mode) != 0) rc = -1;
        futimens(f, times);
        close(f);
      }
      if (rc != -2 && body_skip(r, pad) != 0) rc = -2;
    }
    close(dfd);
    if (rc == -2) {
      respond_error(r->fd, 400, "bad_request", "the tar ends inside %.200s (%d entries written)", name, entries);
      return;
    }
    if (rc == -3) {
      respond_error(r->fd, 400, "bad_request", "tar hard link to outside the directory refused: %.200s (%d entries written)", name, entries);
      return;
    }
    if (rc != 0) {
      respond_error(r->fd, 400, "bad_request", "cannot write %.200s: %s (%d entries written)", name, strerror(errno), entries);
      return;
    }
    entries++;
  }
  close(rootfd);
  body_drain(r);
  char out[64];
  int len = snprintf(out, sizeof out, "{\"entries\":%d}", entries);
  respond(r->fd, 201, "application/json", out, (size_t)len);
}

void handle_tar(struct req *r) {
  char path[4096];
  if (!query_get(r, "path", path, sizeof path)) {
    respond_error(r->fd, 400, "bad_request", "path= is required");
    return;
  }
  if (path_syntax(r->fd, path)) return;
  if (strcmp(r->method, "GET") == 0) get_tar(r, path);
  else if (strcmp(r->method, "PUT") == 0) put_tar(r, path);
  else respond_error(r->fd, 405, "method_not_allowed", "GET or PUT");
}
