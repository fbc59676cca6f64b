/* The exec server's path rules. A path must be absolute and have no `..` segment (400 before anything else); it is
 * resolved inside the root (the chroot makes `..` and absolute symlinks stay in it), and the resolved path decides:
 * writes and deletes under /proc, /sys, /dev, /run/agentvm (the guest agent's) and the --protect paths are refused
 * (403 forbidden_path), as are reads of the --hide paths (the demo's own key and state). */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "exec.h"

static const char *const builtin_protected[] = {"/proc", "/sys", "/dev", "/run/agentvm"};

int path_syntax(int fd, const char *path) {
  if (path[0] != '/') {
    respond_error(fd, 400, "bad_request", "path must be absolute: %.200s", path);
    return 400;
  }
  for (const char *p = path; *p;) {
    while (*p == '/') p++;
    const char *end = strchrnul(p, '/');
    if (end - p == 2 && p[0] == '.' && p[1] == '.') {
      respond_error(fd, 400, "bad_request", "path must not contain '..': %.200s", path);
      return 400;
    }
    p = end;
  }
  if (strlen(path) >= PATH_MAX - 256) {
    respond_error(fd, 400, "bad_request", "path too long");
    return 400;
  }
  return 0;
}

/* `path` is `prefix` or below it. */
static int under(const char *path, const char *prefix) {
  size_t n = strlen(prefix);
  while (n > 1 && prefix[n - 1] == '/') n--;
  if (n == 1 && prefix[0] == '/') return 1;
  return strncmp(path, prefix, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

int path_hidden(const char *resolved) {
  for (int i = 0; i < cfg.nhide; i++)
    if (under(resolved, cfg.hide[i])) return 1;
  return 0;
}

int path_protected(const char *resolved) {
  for (size_t i = 0; i < sizeof builtin_protected / sizeof *builtin_protected; i++)
    if (under(resolved, builtin_protected[i])) return 1;
  for (int i = 0; i < cfg.nprotect; i++)
    if (under(resolved, cfg.protect[i])) return 1;
  return path_hidden(resolved);
}

int deny_write(int fd, const char *resolved) {
  if (!path_protected(resolved)) return 0;
  respond_error(fd, 403, "forbidden_path", "writing under %.200s is not allowed", resolved);
  return 403;
}

int resolve(int fd, const char *path, int follow, char *out, size_t outlen) {
  char real[PATH_MAX];
  if (follow && realpath(path, real)) {
    snprintf(out, outlen, "%s", real);
    return 0;
  }
  if (strcmp(path, "/") == 0) {
    snprintf(out, outlen, "/");
    return 0;
  }
  char copy[PATH_MAX];
  snprintf(copy, sizeof copy, "%s", path);
  size_t len = strlen(copy);
  while (len > 1 && copy[len - 1] == '/') copy[--len] = '\0';
  char *slash = strrchr(copy, '/');
  const char *name = slash + 1;
  *slash = '\0';
  const char *parent = copy[0] ? copy : "/";
  if (!realpath(parent, real)) {
    int e = errno;
    if (e == ENOENT || e == ENOTDIR) respond_error(fd, 404, "not_found", "no such directory: %.200s", parent);
    else respond_error(fd, 400, "bad_request", "cannot resolve %.200s: %s", parent, strerror(e));
    return e == ENOENT || e == ENOTDIR ? 404 : 400;
  }
  if (snprintf(out, outlen, "%s/%s", strcmp(real, "/") == 0 ? "" : real, name) >= (int)outlen) {
    respond_error(fd, 400, "bad_request", "path too long");
    return 400;
  }
  return 0;
}
