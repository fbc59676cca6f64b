/* The guest agent's CHECKPOINTS: the checkpoint requests the workload made (files under CHECKPOINT_DIR), each named once. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "agent.h"

/* A request's name: [A-Za-z0-9._-]{1,64}. A name starting with a dot is not one (yet): like leases, it is skipped. */
static int valid_request_name(const char *s) {
  return s[0] != '.' && valid_chars(s, "._-", 64);
}

/* CHECKPOINTS: the requests the workload made, each removed as it is named, so each is answered once. What no longer
 * fits in one answer line stays for the next poll, as does a request made after the listing. */
void checkpoint_requests(int out, const char *id) {
  char names[LINE_MAX_LEN - 32] = "";
  size_t len = 0;
  DIR *dir = opendir(CHECKPOINT_DIR);
  if (dir) {
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
      if (!valid_request_name(entry->d_name)) continue;
      size_t n = strlen(entry->d_name);
      if (len + n + 1 >= sizeof names) break;
      char path[sizeof CHECKPOINT_DIR + 256];
      snprintf(path, sizeof path, "%s/%s", CHECKPOINT_DIR, entry->d_name);
      if (unlink(path) != 0) continue; /* a directory, or gone meanwhile */
      names[len++] = ' ';
      memcpy(names + len, entry->d_name, n + 1);
      len += n;
    }
    closedir(dir);
  }
  reply(out, id, "OK%s", names);
}
