/* The guest agent's IDENTITY: a clone's fresh identity (agent id, hostname, entropy for its RNG, where it was cloned
 * from), applied to the kernel, to a built image's /etc and to the identity file the workload reads. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <linux/random.h>
#include "agent.h"

#ifndef RNDRESEEDCRNG
#define RNDRESEEDCRNG _IO('R', 0x07)
#endif

#define IDENTITY_PATH AGENT_DIR "/identity"
/* init's copies of the image's /etc/hostname and /etc/hosts (bound onto them as files: updated in place). */
#define INIT_ETC "/run/init/etc"

/* Identities applied since boot (a clone restored from a snapshot carries its source's count on). */
static int identity_generation = 0;

int valid_chars(const char *s, const char *extra, size_t max) {
  size_t n = strlen(s);
  if (n == 0 || n > max) return 0;
  for (const char *p = s; *p; p++) {
    char c = *p;
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || strchr(extra, c))) return 0;
  }
  return 1;
}

/* RFC 1123: dot-separated labels of letters, digits and hyphens, no label empty or starting or ending with a hyphen;
 * at most 63 characters in all (what sethostname and /etc/hostname take comfortably). */
static int valid_hostname(const char *s) {
  if (!valid_chars(s, "-.", 63)) return 0;
  const char *label = s;
  for (const char *p = s;; p++) {
    if (*p == '.' || *p == '\0') {
      if (p == label || *label == '-' || p[-1] == '-') return 0;
      if (*p == '\0') return 1;
      label = p + 1;
    }
  }
}

static int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Mixes 32 bytes into the kernel's pool and reseeds the CRNG at once, so getrandom() after it differs between two
 * clones of one memory image (crediting alone does not reseed a CRNG that is already initialised). *credited: the
 * RNDADDENTROPY ioctl took it (256 bits credited) rather than a plain write (mixed, not credited). */
static int mix_entropy(const unsigned char bytes[32], int *credited, int *reseeded) {
  int fd = open("/dev/urandom", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  uint32_t raw[2 + 8];
  struct rand_pool_info *info = (struct rand_pool_info *)raw;
  info->entropy_count = 256;
  info->buf_size = 32;
  memcpy(info->buf, bytes, 32);
  *credited = ioctl(fd, RNDADDENTROPY, info) == 0;
  if (!*credited && write(fd, bytes, 32) != 32) {
    close(fd);
    return -1;
  }
  *reseeded = ioctl(fd, RNDRESEEDCRNG) == 0;
  memset(raw, 0, sizeof raw);
  close(fd);
  return 0;
}

/* Rewrites a file in place (it may be bind-mounted onto another as a file: a rename would not show through). */
static void rewrite_in_place(const char *path, const char *content) {
  int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) return;
  write_all(fd, content, strlen(content));
  close(fd);
}

/* A built image's /etc/hostname, and its /etc/hosts line for the old name, follow the new hostname. */
static void update_init_etc(const char *old_name, const char *name) {
  char path[128], content[2048], out[2048 + 128];
  snprintf(path, sizeof path, "%s/hostname", INIT_ETC);
  if (access(path, F_OK) != 0) return; /* the demo: no image root */
  snprintf(content, sizeof content, "%s\n", name);
  rewrite_in_place(path, content);
  snprintf(path, sizeof path, "%s/hosts", INIT_ETC);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ssize_t n = read(fd, content, sizeof content - 1);
  close(fd);
  if (n <= 0) return;
  content[n] = '\0';
  /* Replace every whole-word occurrence of the old name (lines are "addr<TAB>names"). */
  size_t o = 0, old_len = strlen(old_name);
  for (char *p = content; *p && o < sizeof out - 128;) {
    int starts = p == content || p[-1] == '\t' || p[-1] == ' ';
    int same = old_len && starts && strncmp(p, old_name, old_len) == 0 && strchr(" \t\n", p[old_len]) != NULL;
    if (same) {
      o += (size_t)snprintf(out + o, sizeof out - o, "%s", name);
      p += old_len;
    } else {
      out[o++] = *p++;
    }
  }
  out[o] = '\0';
  rewrite_in_place(path, out);
}

/* Writes the identity file by tmp + rename: a reader sees the old identity or the new one, never half of one. */
static int write_identity(const char *agent_id, const char *hostname, const char *cloned_from, int generation) {
  char tmp[128], content[512];
  snprintf(tmp, sizeof tmp, "%s.tmp", IDENTITY_PATH);
  int n = snprintf(content, sizeof content, "agentId=%s\nhostname=%s\nclonedFrom=%s\ngeneration=%d\n", agent_id, hostname,
                   cloned_from, generation);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  ssize_t w = write(fd, content, (size_t)n);
  int ok = w == n && fsync(fd) == 0;
  if (close(fd) != 0) ok = 0;
  if (!ok || rename(tmp, IDENTITY_PATH) != 0) {
    unlink(tmp);
    return -1;
  }
  return 0;
}

/* IDENTITY <agentId> <hostname> <entropyHex64> <clonedFrom> */
void apply_identity(int out, const char *id, char *arg) {
  char *save = NULL;
  char *agent_id = arg ? strtok_r(arg, " ", &save) : NULL;
  char *hostname = agent_id ? strtok_r(NULL, " ", &save) : NULL;
  char *entropy = hostname ? strtok_r(NULL, " ", &save) : NULL;
  char *cloned_from = entropy ? strtok_r(NULL, " ", &save) : NULL;
  if (!cloned_from || strtok_r(NULL, " ", &save)) {
    reply(out, id, "ERR usage: IDENTITY <agentId> <hostname> <entropyHex64> <clonedFrom>");
    return;
  }
  if (strncmp(agent_id, "agt_", 4) != 0 || !valid_chars(agent_id + 4, "_-", 200)) {
    reply(out, id, "ERR bad agent id");
    return;
  }
  if (!valid_hostname(hostname)) {
    reply(out, id, "ERR bad hostname");
    return;
  }
  if (!valid_chars(cloned_from, "_-", 200)) {
    reply(out, id, "ERR bad clonedFrom");
    return;
  }
  unsigned char bytes[32];
  int bad = strlen(entropy) != 64;
  for (int i = 0; !bad && i < 32; i++) {
    int hi = hex_value(entropy[2 * i]), lo = hex_value(entropy[2 * i + 1]);
    if (hi < 0 || lo < 0) bad = 1;
    else bytes[i] = (unsigned char)(hi << 4 | lo);
  }
  if (bad) {
    reply(out, id, "ERR bad entropy: want 64 hex characters (32 bytes)");
    return;
  }
  int credited = 0, reseeded = 0;
  int mixed = mix_entropy(bytes, &credited, &reseeded);
  memset(bytes, 0, sizeof bytes);
  if (mixed != 0) {
    reply(out, id, "ERR entropy: %s", strerror(errno));
    return;
  }
  char old_name[65] = "";
  gethostname(old_name, sizeof old_name - 1);
  if (sethostname(hostname, strlen(hostname)) != 0) {
    reply(out, id, "ERR sethostname: %s", strerror(errno));
    return;
  }
  update_init_etc(old_name, hostname);
  mkdir(AGENT_DIR, 0755);
  if (write_identity(agent_id, hostname, cloned_from, identity_generation + 1) != 0) {
    reply(out, id, "ERR write %s: %s", IDENTITY_PATH, strerror(errno));
    return;
  }
  identity_generation++;
  reply(out, id, "OK identity %d %s %s", identity_generation, credited ? "credited" : "uncredited", reseeded ? "reseeded" : "noreseed");
}
