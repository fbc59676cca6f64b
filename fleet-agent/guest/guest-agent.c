/* Guest agent: answers the host's line protocol (PING, SETTIME, GETTIME, LEASES, SYNC, IDENTITY, CHECKPOINTS, PROBE,
 * PROBEVIA) on the virtio-serial port named "agent" and, when the kernel has AF_VSOCK, on vsock port 1024.
 * The protocol is documented at the top of fleet-agent/drivers/common/guest-agent.ts.
 * Single-threaded poll loop; one vsock connection at a time. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <linux/random.h>
#include <linux/vm_sockets.h>

#ifndef RNDRESEEDCRNG
#define RNDRESEEDCRNG _IO('R', 0x07)
#endif

#define VSOCK_PORT 1024
#define LINE_MAX_LEN 512
#define LEASE_DIR "/run/leases"
/* What the workload reads and writes besides leases. A built image's workload sees the same directory at the same
 * path: init binds it into the agent's root (init.sh, start_image). */
#define AGENT_DIR "/run/agentvm"
#define IDENTITY_PATH AGENT_DIR "/identity"
#define CHECKPOINT_DIR AGENT_DIR "/checkpoint-requests"
/* init's copies of the image's /etc/hostname and /etc/hosts (bound onto them as files: updated in place). */
#define INIT_ETC "/run/init/etc"

struct channel {
  int fd;
  char buf[LINE_MAX_LEN];
  size_t len;
};

/* Newest host timestamp applied so far: an older one is a delayed retry and must not move the clock back. */
static int64_t last_applied_sec = -1;
static int64_t last_applied_nsec = 0;

static void log_line(const char *msg) {
  fprintf(stderr, "guest-agent: %s\n", msg);
}

static void write_all(int fd, const char *data, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, data, len);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return; /* host went away; it re-sends after reconnecting */
    }
    data += n;
    len -= (size_t)n;
  }
}

__attribute__((format(printf, 3, 4)))
static void reply(int fd, const char *id, const char *fmt, ...) {
  char out[LINE_MAX_LEN + 64];
  int n = snprintf(out, sizeof out, "%s ", id);
  va_list ap;
  va_start(ap, fmt);
  n += vsnprintf(out + n, sizeof out - (size_t)n - 1, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof out - 2) n = (int)sizeof out - 2;
  out[n++] = '\n';
  write_all(fd, out, (size_t)n);
}

/* "<sec>.<nsec9>" → seconds and nanoseconds; exactly nine fraction digits like the host sends. */
static int parse_time(const char *text, int64_t *sec, int64_t *nsec) {
  char *end;
  errno = 0;
  long long s = strtoll(text, &end, 10);
  if (errno || end == text || *end != '.' || s < 0) return -1;
  const char *frac = end + 1;
  int64_t ns = 0;
  int digits = 0;
  while (frac[digits] >= '0' && frac[digits] <= '9') {
    ns = ns * 10 + (frac[digits] - '0');
    digits++;
  }
  if (digits != 9 || (frac[digits] != '\0' && frac[digits] != '\r')) return -1;
  *sec = s;
  *nsec = ns;
  return 0;
}

/* After a restore the host side of the network is a new process (a new QEMU's user network, perhaps with a guestfwd
 * the old one lacked, such as the egress proxy after egress was turned on). An address the guest failed to resolve
 * before the snapshot stays a FAILED neighbour in its memory, and connections to it keep failing after the restore
 * (seen: the egress proxy unreachable). So the clock fix, which follows every restore, also flushes the neighbour
 * table when /proc/net/arp holds an unresolved entry (flags 0x0); when none is, it costs one read, no process. The
 * host skips it (`same-net`) when the addresses it forwards are the ones the guest last saw. */
static void forget_unresolved_neighbours(void) {
  FILE *arp = fopen("/proc/net/arp", "r");
  if (!arp) return;
  char line[256];
  int unresolved = 0;
  if (fgets(line, sizeof line, arp)) { /* header */
    while (fgets(line, sizeof line, arp)) {
      char ip[64], hw[64], flags[16];
      if (sscanf(line, "%63s %63s %15s", ip, hw, flags) == 3 && strcmp(flags, "0x0") == 0) unresolved = 1;
    }
  }
  fclose(arp);
  if (!unresolved) return;
  if (system("ip neigh flush all >/dev/null 2>&1") != 0) log_line("could not flush the neighbour table after a restore");
}

static int count_leases(void) {
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

/* ---- A clone's fresh identity, and checkpoint requests from the workload. ---- */

/* Identities applied since boot (a clone restored from a snapshot carries its source's count on). */
static int identity_generation = 0;

static int valid_chars(const char *s, const char *extra, size_t max) {
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
static void apply_identity(int out, const char *id, char *arg) {
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

/* A request's name: [A-Za-z0-9._-]{1,64}. A name starting with a dot is not one (yet): like leases, it is skipped. */
static int valid_request_name(const char *s) {
  return s[0] != '.' && valid_chars(s, "._-", 64);
}

/* CHECKPOINTS: the requests the workload made, each removed as it is named, so each is answered once. What no longer
 * fits in one answer line stays for the next poll, as does a request made after the listing. */
static void checkpoint_requests(int out, const char *id) {
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

/* ---- Egress probes: a process inside the VM opening a TCP connection the way a workload would (the same kernel,
 * virtio-net and QEMU user network), so the host's tests can see what the guest can and cannot reach. ---- */

#define PROBE_MAX_MS 10000
#define PROBE_GREETING "agentvm-probe\n"
#define PROBE_READ_MAX 96

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits for `events` on fd until the deadline: 1 ready, 0 timed out, -1 error. */
static int wait_fd(int fd, short events, int64_t deadline) {
  for (;;) {
    int64_t left = deadline - now_ms();
    if (left <= 0) return 0;
    struct pollfd p = {.fd = fd, .events = events};
    int r = poll(&p, 1, (int)left);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) return 0;
    return 1;
  }
}

/* A word for a failed connect: what the host's side parses. */
static const char *connect_failure(int err) {
  if (err == ECONNREFUSED) return "refused";
  if (err == ETIMEDOUT) return "timeout";
  if (err == ENETUNREACH || err == EHOSTUNREACH) return "unreachable";
  if (err == ECONNRESET) return "reset";
  return NULL;
}

/* Non-blocking connect to ip:port within the deadline. Returns the socket, or -1 with *why set ("refused", …). */
static int probe_connect(const char *ip, const char *port_text, int64_t deadline, char *why, size_t why_len) {
  struct sockaddr_in addr = {.sin_family = AF_INET};
  char *end;
  long port = strtol(port_text, &end, 10);
  if (inet_pton(AF_INET, ip, &addr.sin_addr) != 1 || *end || port < 1 || port > 65535) {
    snprintf(why, why_len, "error bad address");
    return -1;
  }
  addr.sin_port = htons((uint16_t)port);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(why, why_len, "error socket: %s", strerror(errno));
    return -1;
  }
  int err = 0;
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
    if (errno != EINPROGRESS) {
      err = errno;
    } else {
      int r = wait_fd(fd, POLLOUT, deadline);
      if (r == 0) err = ETIMEDOUT;
      else if (r < 0) err = errno;
      else {
        socklen_t len = sizeof err;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      }
    }
  }
  if (err) {
    const char *word = connect_failure(err);
    if (word) snprintf(why, why_len, "%s", word);
    else snprintf(why, why_len, "error %s", strerror(err));
    close(fd);
    return -1;
  }
  return fd;
}

static int send_all(int fd, const char *data, size_t len, int64_t deadline) {
  while (len > 0) {
    ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (wait_fd(fd, POLLOUT, deadline) != 1) return -1;
      continue;
    }
    if (n <= 0) return -1;
    data += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Reads into buf until `stop` has been seen (NULL: one newline), the buffer is full, the peer closes, or the deadline. */
static size_t read_until(int fd, char *buf, size_t cap, const char *stop, int64_t deadline) {
  size_t got = 0;
  while (got < cap) {
    if (wait_fd(fd, POLLIN, deadline) != 1) break;
    ssize_t n = recv(fd, buf + got, cap - got, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) break;
    got += (size_t)n;
    if (stop ? memmem(buf, got, stop, strlen(stop)) != NULL : memchr(buf, '\n', got) != NULL) break;
  }
  return got;
}

/* Sends the greeting and answers what came back, hex-encoded ("-" for nothing). */
static void greet_and_reply(int out, int fd, const char *id, const char *prefix, int64_t deadline) {
  char got[PROBE_READ_MAX];
  size_t n = 0;
  if (send_all(fd, PROBE_GREETING, strlen(PROBE_GREETING), deadline) == 0) n = read_until(fd, got, sizeof got, NULL, deadline);
  char hex[PROBE_READ_MAX * 2 + 2] = "-";
  for (size_t i = 0; i < n; i++) snprintf(hex + 2 * i, 3, "%02x", (unsigned char)got[i]);
  reply(out, id, "OK %s %s", prefix, hex);
}

static int64_t probe_deadline(const char *text) {
  char *end;
  long ms = text ? strtol(text, &end, 10) : -1;
  if (!text || *end || ms < 1) ms = 2000;
  if (ms > PROBE_MAX_MS) ms = PROBE_MAX_MS;
  return now_ms() + ms;
}

/* PROBE <ipv4> <port> <timeoutMs>: a direct connection. */
static void probe_direct(int out, const char *id, char *arg) {
  char *ip = arg ? strtok(arg, " ") : NULL, *port = ip ? strtok(NULL, " ") : NULL, *ms = port ? strtok(NULL, " ") : NULL;
  if (!port) {
    reply(out, id, "ERR usage: PROBE <ipv4> <port> <timeoutMs>");
    return;
  }
  int64_t deadline = probe_deadline(ms);
  char why[128];
  int fd = probe_connect(ip, port, deadline, why, sizeof why);
  if (fd < 0) {
    reply(out, id, "OK %s", why);
    return;
  }
  greet_and_reply(out, fd, id, "connected", deadline);
  close(fd);
}

/* PROBEVIA <proxy-ipv4> <proxy-port> <host:port> <timeoutMs>: an HTTP CONNECT through the egress proxy. */
static void probe_via(int out, const char *id, char *arg) {
  char *ip = arg ? strtok(arg, " ") : NULL, *port = ip ? strtok(NULL, " ") : NULL, *target = port ? strtok(NULL, " ") : NULL;
  char *ms = target ? strtok(NULL, " ") : NULL;
  if (!target || strlen(target) > 200) {
    reply(out, id, "ERR usage: PROBEVIA <proxy-ipv4> <proxy-port> <host:port> <timeoutMs>");
    return;
  }
  int64_t deadline = probe_deadline(ms);
  char why[128];
  int fd = probe_connect(ip, port, deadline, why, sizeof why);
  if (fd < 0) {
    reply(out, id, "OK proxy-%s", why);
    return;
  }
  char request[512];
  int len = snprintf(request, sizeof request, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target);
  char head[1024];
  size_t n = 0;
  if (send_all(fd, request, (size_t)len, deadline) == 0) n = read_until(fd, head, sizeof head - 1, "\r\n\r\n", deadline);
  head[n] = '\0';
  int status = 0;
  if (n == 0 || sscanf(head, "HTTP/1.%*d %d", &status) != 1) {
    reply(out, id, "OK proxy-silent");
  } else if (status != 200) {
    reply(out, id, "OK status %d -", status);
  } else {
    greet_and_reply(out, fd, id, "status 200", deadline);
  }
  close(fd);
}

static void handle_line(int fd, char *line) {
  size_t len = strlen(line);
  while (len > 0 && (line[len - 1] == '\r' || line[len - 1] == ' ')) line[--len] = '\0';
  char *space = strchr(line, ' ');
  if (!space) return; /* not a request: no id to answer to */
  *space = '\0';
  const char *id = line;
  for (const char *p = id; *p; p++)
    if (*p < '0' || *p > '9') return;
  char *command = space + 1;
  char *arg = strchr(command, ' ');
  if (arg) *arg++ = '\0';

  struct timespec ts;
  if (strcmp(command, "PING") == 0) {
    reply(fd, id, "OK pong");
  } else if (strcmp(command, "GETTIME") == 0) {
    clock_gettime(CLOCK_REALTIME, &ts);
    reply(fd, id, "OK %lld.%09ld", (long long)ts.tv_sec, ts.tv_nsec);
  } else if (strcmp(command, "SETTIME") == 0) {
    /* "SETTIME <time> same-net": the host side of the network is the one the guest last ran against (the same QEMU,
     * or one with the same forwarded addresses), so no neighbour can have become resolvable: the check, a read of
     * /proc/net/arp through code a restored guest has not run yet under TCG (~20 ms), is skipped. */
    int same_net = 0;
    char *flag = arg ? strchr(arg, ' ') : NULL;
    if (flag) {
      *flag++ = '\0';
      if (strcmp(flag, "same-net") != 0) {
        reply(fd, id, "ERR bad time");
        return;
      }
      same_net = 1;
    }
    int64_t sec, nsec;
    if (!arg || parse_time(arg, &sec, &nsec) != 0) {
      reply(fd, id, "ERR bad time");
      return;
    }
    if (sec < last_applied_sec || (sec == last_applied_sec && nsec < last_applied_nsec)) {
      clock_gettime(CLOCK_REALTIME, &ts);
      reply(fd, id, "OK stale %lld.%09ld", (long long)ts.tv_sec, ts.tv_nsec);
      return;
    }
    struct timespec target = {.tv_sec = (time_t)sec, .tv_nsec = (long)nsec};
    if (clock_settime(CLOCK_REALTIME, &target) != 0) {
      reply(fd, id, "ERR clock_settime: %s", strerror(errno));
      return;
    }
    last_applied_sec = sec;
    last_applied_nsec = nsec;
    if (!same_net) forget_unresolved_neighbours();
    clock_gettime(CLOCK_REALTIME, &ts);
    reply(fd, id, "OK %lld.%09ld", (long long)ts.tv_sec, ts.tv_nsec);
  } else if (strcmp(command, "LEASES") == 0) {
    reply(fd, id, "OK %d", count_leases());
  } else if (strcmp(command, "SYNC") == 0) {
    /* Before a hibernation: the agent's disk then holds everything written so far, so a cold boot from it alone
     * (the memory snapshot lost) finds the files. Blocks this loop while it runs; the host waits with a timeout. */
    sync();
    reply(fd, id, "OK synced");
  } else if (strcmp(command, "IDENTITY") == 0) {
    apply_identity(fd, id, arg);
  } else if (strcmp(command, "CHECKPOINTS") == 0) {
    checkpoint_requests(fd, id);
  } else if (strcmp(command, "PROBE") == 0) {
    /* Blocks this loop for at most PROBE_MAX_MS: a test's tool, the host waits with a timeout. */
    probe_direct(fd, id, arg);
  } else if (strcmp(command, "PROBEVIA") == 0) {
    probe_via(fd, id, arg);
  } else {
    reply(fd, id, "ERR unknown command");
  }
}

/* Reads what is available; answers every complete line. Returns 0 at end of stream. */
static int pump(struct channel *ch) {
  ssize_t n = read(ch->fd, ch->buf + ch->len, sizeof ch->buf - ch->len - 1);
  if (n < 0) return (errno == EINTR || errno == EAGAIN) ? 1 : 0;
  if (n == 0) return 0;
  ch->len += (size_t)n;
  ch->buf[ch->len] = '\0';
  char *start = ch->buf;
  char *nl;
  while ((nl = memchr(start, '\n', ch->len - (size_t)(start - ch->buf))) != NULL) {
    *nl = '\0';
    handle_line(ch->fd, start);
    start = nl + 1;
  }
  size_t rest = ch->len - (size_t)(start - ch->buf);
  if (rest == sizeof ch->buf - 1) rest = 0; /* an overlong line: drop it */
  memmove(ch->buf, start, rest);
  ch->len = rest;
  return 1;
}

/* /dev/virtio-ports/agent is made by init; fall back to finding the port by its name in sysfs. */
static int open_serial(void) {
  int fd = open("/dev/virtio-ports/agent", O_RDWR | O_CLOEXEC | O_NONBLOCK);
  if (fd >= 0) return fd;
  DIR *dir = opendir("/sys/class/virtio-ports");
  if (!dir) return -1;
  struct dirent *entry;
  while ((entry = readdir(dir)) != NULL) {
    if (entry->d_name[0] == '.') continue;
    char path[300], name[64] = {0};
    snprintf(path, sizeof path, "/sys/class/virtio-ports/%s/name", entry->d_name);
    int nfd = open(path, O_RDONLY | O_CLOEXEC);
    if (nfd < 0) continue;
    ssize_t n = read(nfd, name, sizeof name - 1);
    close(nfd);
    if (n > 0 && strncmp(name, "agent", 5) == 0 && (name[5] == '\n' || name[5] == '\0')) {
      snprintf(path, sizeof path, "/dev/%s", entry->d_name);
      fd = open(path, O_RDWR | O_CLOEXEC | O_NONBLOCK);
      break;
    }
  }
  closedir(dir);
  return fd;
}

static int open_vsock_listener(void) {
  int fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_vm addr = {.svm_family = AF_VSOCK, .svm_port = VSOCK_PORT, .svm_cid = VMADDR_CID_ANY};
  if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 4) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static void sleep_ms(long ms) {
  struct timespec ts = {.tv_sec = 0, .tv_nsec = ms * 1000000L};
  nanosleep(&ts, NULL);
}

int main(void) {
  struct channel serial = {.fd = -1};
  struct channel vconn = {.fd = -1};
  int vlisten = open_vsock_listener();
  log_line(vlisten >= 0 ? "listening on vsock port 1024" : "no vsock; virtio-serial only");
  mkdir(LEASE_DIR, 0777);
  mkdir(AGENT_DIR, 0755);
  mkdir(CHECKPOINT_DIR, 01777);
  chmod(CHECKPOINT_DIR, 01777); /* whatever the umask: a workload running as its own user makes requests here */

  for (;;) {
    if (serial.fd < 0) {
      serial.fd = open_serial();
      serial.len = 0;
      if (serial.fd >= 0) log_line("virtio-serial port agent open");
    }
    struct pollfd fds[3];
    int nfds = 0, serial_i = -1, listen_i = -1, conn_i = -1;
    if (serial.fd >= 0) { serial_i = nfds; fds[nfds++] = (struct pollfd){.fd = serial.fd, .events = POLLIN}; }
    if (vlisten >= 0) { listen_i = nfds; fds[nfds++] = (struct pollfd){.fd = vlisten, .events = POLLIN}; }
    if (vconn.fd >= 0) { conn_i = nfds; fds[nfds++] = (struct pollfd){.fd = vconn.fd, .events = POLLIN}; }

    /* A virtio-serial port reports POLLHUP without data while no host is connected and a read then
     * returns 0; there is nothing to wait on, so poll again on a short timer until the host connects. */
    int timeout = serial.fd < 0 ? 100 : -1;
    int ready = poll(fds, (nfds_t)nfds, timeout);
    if (ready < 0) {
      if (errno != EINTR) sleep_ms(10);
      continue;
    }
    int serial_idle = 0;
    if (serial_i >= 0 && fds[serial_i].revents) {
      if (fds[serial_i].revents & POLLIN) {
        if (!pump(&serial)) serial_idle = 1;
      } else {
        serial_idle = 1;
      }
    }
    if (listen_i >= 0 && (fds[listen_i].revents & POLLIN)) {
      int c = accept4(vlisten, NULL, NULL, SOCK_CLOEXEC);
      if (c >= 0) {
        if (vconn.fd >= 0) close(vconn.fd); /* newest connection wins: the old host side is gone */
        vconn.fd = c;
        vconn.len = 0;
      }
    } else if (conn_i >= 0 && fds[conn_i].revents) {
      if (!pump(&vconn)) {
        close(vconn.fd);
        vconn.fd = -1;
      }
    }
    if (serial_idle) sleep_ms(10);
  }
}
