/* launch <root> <spec-file>: starts an image's entrypoint inside <root> (chroot), as the spec file says (argv, env,
 * workdir, uid, gid). Static and shell-free, because images need have no shell (distroless) and because the same
 * program runs in the guest (root = the overlay over the image) and on the host for the process driver (root = an
 * unpacked rootfs directory): it assumes nothing of either, not even /dev/console; stdio is whatever it was given.
 *
 * The spec file (written by fleet-agent/guest/launch-spec.ts, which documents the format) is a list of
 * NUL-terminated strings:
 *   "agentvm-launch/1" "uid=<n>" "gid=<n>" "workdir=<abs path>" "argc=<n>" <argv...> "envc=<n>" <env...>
 * The spec is read before the chroot (its path is the host's or the initramfs's, not the image's). What it shares
 * with the exec server (reading the spec, the PATH search, the working directory) is in launch-common.h.
 *
 * Exit status when the entrypoint cannot be started: 127 (not found), 126 (found, not executable), 125 (anything
 * else: a bad spec, chroot, chdir, ids), each with one "launch: ..." line on stderr. */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>
#include "launch-common.h"

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

int main(int argc, char **argv) {
  if (argc != 3) die(125, "usage: launch <root> <spec-file>");
  const char *root = argv[1];
  struct launch_spec s;
  char err[512];
  if (launch_spec_read(argv[2], &s, err, sizeof err) != 0) die(125, "%s", err);
  uid_t uid = s.uid;
  gid_t gid = s.gid;
  const char *workdir = s.workdir;

  if (chroot(root) != 0) die(125, "chroot %s: %s", root, strerror(errno));
  if (chdir("/") != 0) die(125, "chdir / in %s: %s", root, strerror(errno));
  if (chdir(workdir) != 0) {
    if (errno != ENOENT) die(125, "chdir %s: %s", workdir, strerror(errno));
    if (launch_make_dirs(workdir, err, sizeof err) != 0) die(125, "%s", err);
    if (chdir(workdir) != 0) die(125, "chdir %s: %s", workdir, strerror(errno));
  }

  /* A parent-death signal it was started with (the process driver starts it under `setpriv --pdeathsig`, so an
   * entrypoint dies with its fleet-agent): a change of ids clears it, so it is set again after them. None in a guest. */
  int pdeath = 0;
  pid_t parent = getppid();
  prctl(PR_GET_PDEATHSIG, &pdeath);

  /* Drop to the image's user: supplementary groups first (only the primary one; the image's /etc/group was
   * resolved at build time), then the group, then the user, which ends the right to change either. */
  if (geteuid() == 0) {
    if (setgroups(1, &gid) != 0) die(125, "setgroups(%u): %s", (unsigned)gid, strerror(errno));
    if (setgid(gid) != 0) die(125, "setgid(%u): %s", (unsigned)gid, strerror(errno));
    if (setuid(uid) != 0) die(125, "setuid(%u): %s", (unsigned)uid, strerror(errno));
  } else if (getuid() != uid || getgid() != gid) {
    die(125, "not root: cannot run as uid %u gid %u", (unsigned)uid, (unsigned)gid);
  }
  if (pdeath != 0) {
    if (prctl(PR_SET_PDEATHSIG, pdeath) != 0) die(125, "prctl(PR_SET_PDEATHSIG): %s", strerror(errno));
    if (getppid() != parent) die(125, "its parent went before the entrypoint started"); /* the signal would never come */
  }

  launch_reset_signals();
  umask(022);

  int e = launch_exec_in_root(s.argv, s.env);
  die(e == ENOENT || e == ENOTDIR ? 127 : e == EACCES || e == ENOEXEC ? 126 : 125, "cannot execute %s: %s", s.argv[0], strerror(e));
}
