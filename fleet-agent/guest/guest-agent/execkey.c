/* The guest agent's EXECKEY: the key each request to the exec server (guest-exec/) must carry, written root-only
 * (0600, in a 0700 directory) outside the workload's root, replaced by rename; guest-exec reads it per request. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "agent.h"

void set_exec_key(int out, const char *id, const char *arg) {
  if (!arg || strlen(arg) != 64 || !valid_chars(arg, "", 64)) {
    reply(out, id, "ERR bad key (64 hex)");
    return;
  }
  for (const char *p = arg; *p; p++)
    if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) {
      reply(out, id, "ERR bad key (64 lowercase hex)");
      return;
    }
  mkdir(EXEC_DIR, 0700);
  chmod(EXEC_DIR, 0700);
  int fd = open(EXEC_KEY_FILE ".tmp", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    reply(out, id, "ERR cannot write the key: %s", strerror(errno));
    return;
  }
  fchmod(fd, 0600);
  write_all(fd, arg, 64);
  close(fd);
  if (rename(EXEC_KEY_FILE ".tmp", EXEC_KEY_FILE) != 0) {
    reply(out, id, "ERR cannot put the key in place: %s", strerror(errno));
    return;
  }
  reply(out, id, "OK exec/1");
}
