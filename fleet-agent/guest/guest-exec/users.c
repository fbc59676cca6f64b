/* `user=` of an exec: a name, a uid, or either with `:<group name | gid>`, resolved from the root's /etc/passwd and
 * /etc/group (read after the chroot: the image's own files; static glibc has no NSS). The supplementary groups are
 * the primary group and every group of /etc/group that lists the user's name. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "exec.h"

/* Splits a colon-separated line into up to `max` fields (in place). */
static int fields(char *line, char **f, int max) {
  int n = 0;
  f[n++] = line;
  for (char *p = line; *p && n < max; p++)
    if (*p == ':') {
      *p = '\0';
      f[n++] = p + 1;
    }
  char *nl = strchr(f[n - 1], '\n');
  if (nl) *nl = '\0';
  return n;
}

static int numeric(const char *s, unsigned long *out) {
  if (!*s) return 0;
  char *end;
  errno = 0;
  unsigned long v = strtoul(s, &end, 10);
  if (*end || errno || v > 0xfffffffeUL) return 0;
  *out = v;
  return 1;
}

/* The passwd entry by name (when `name`) or by uid: 1 and its fields copied, else 0. */
static int passwd_find(const char *name, uid_t uid, char *pname, size_t plen, uid_t *puid, gid_t *pgid, char *home, size_t hlen) {
  FILE *f = fopen("/etc/passwd", "re");
  if (!f) return 0;
  char line[1024];
  int found = 0;
  while (fgets(line, sizeof line, f)) {
    char *fl[7];
    if (fields(line, fl, 7) < 7) continue;
    unsigned long u, g;
    if (!numeric(fl[2], &u) || !numeric(fl[3], &g)) continue;
    if (name ? strcmp(fl[0], name) == 0 : u == uid) {
      snprintf(pname, plen, "%s", fl[0]);
      *puid = (uid_t)u;
      *pgid = (gid_t)g;
      snprintf(home, hlen, "%s", fl[5]);
      found = 1;
      break;
    }
  }
  fclose(f);
  return found;
}

static int group_find(const char *name, gid_t *gid) {
  FILE *f = fopen("/etc/group", "re");
  if (!f) return 0;
  char line[4096];
  int found = 0;
  while (fgets(line, sizeof line, f)) {
    char *fl[4];
    unsigned long g;
    if (fields(line, fl, 4) < 3 || !numeric(fl[2], &g)) continue;
    if (strcmp(fl[0], name) == 0) {
      *gid = (gid_t)g;
      found = 1;
      break;
    }
  }
  fclose(f);
  return found;
}

/* The primary group, then the groups that list `name` as a member. */
static void supplementary(const char *name, struct ids *out) {
  out->groups[0] = out->gid;
  out->ngroups = 1;
  if (!name || !*name) return;
  FILE *f = fopen("/etc/group", "re");
  if (!f) return;
  char line[4096];
  while (fgets(line, sizeof line, f) && out->ngroups < 64) {
    char *fl[4];
    unsigned long g;
    if (fields(line, fl, 4) < 4 || !numeric(fl[2], &g) || (gid_t)g == out->gid) continue;
    char *save;
    for (char *m = strtok_r(fl[3], ",", &save); m; m = strtok_r(NULL, ",", &save))
      if (strcmp(m, name) == 0) {
        out->groups[out->ngroups++] = (gid_t)g;
        break;
      }
  }
  fclose(f);
}

int ids_for_uid(uid_t uid, gid_t gid, struct ids *out) {
  char name[256] = "";
  uid_t u;
  gid_t g;
  out->uid = uid;
  out->gid = gid;
  if (!passwd_find(NULL, uid, name, sizeof name, &u, &g, out->home, sizeof out->home)) snprintf(out->home, sizeof out->home, "%s", uid == 0 ? "/root" : "/");
  supplementary(name, out);
  return 0;
}

int resolve_user(const char *spec, struct ids *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (!spec || !*spec) return ids_for_uid(defaults.uid, defaults.gid, out);
  char user[256], *group = NULL;
  snprintf(user, sizeof user, "%s", spec);
  char *colon = strchr(user, ':');
  if (colon) {
    *colon = '\0';
    group = colon + 1;
  }
  char name[256] = "";
  unsigned long n;
  uid_t uid;
  gid_t gid = 0;
  if (numeric(user, &n)) {
    uid = (uid_t)n;
    uid_t u;
    gid_t g;
    if (passwd_find(NULL, uid, name, sizeof name, &u, &g, out->home, sizeof out->home)) gid = g;
    else snprintf(out->home, sizeof out->home, "%s", uid == 0 ? "/root" : "/");
  } else if (!passwd_find(user, 0, name, sizeof name, &uid, &gid, out->home, sizeof out->home)) {
    snprintf(err, errlen, "no user %.200s in the root's /etc/passwd", user);
    return -1;
  }
  if (group) {
    if (numeric(group, &n)) gid = (gid_t)n;
    else if (!group_find(group, &gid)) {
      snprintf(err, errlen, "no group %.200s in the root's /etc/group", group);
      return -1;
    }
  }
  out->uid = uid;
  out->gid = gid;
  supplementary(name, out);
  return 0;
}
