/* The guest agent's LEASES: how many leases the workload holds (files under LEASE_DIR naming an expiry still ahead). */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "agent.h"

int count_leases(void) {
  DIR *dir = opendir(LEASE_DIR);
  if (!dir) return 0;
  time_t now = time(NULL);
  int count = 0;
  struct dirent *entry;
  while ((entry = readdir(dir)) != NULL) {
    if (entry->d_name[0] == '.') continue;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", LEASE_DIR, entry->d_name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    char content[64];
    ssize_t n = read(fd, content, sizeof content - 1);
    close(fd);
    if (n <= 0) continue;
    content[n] = '\0';
    char *end;
    long long expiry = strtoll(content, &end, 10);
    if (end == content) continue;
    if (expiry > (long long)now) count++;
  }
  closedir(dir);
  return count;
}
