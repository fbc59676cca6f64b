/* The guest agent's parts (fleet-agent/guest/guest-agent/, compiled together by build-image.ts): the paths it serves,
 * answering a request, and each command's handler. main.c opens the channels and runs the poll loop, protocol.c reads
 * lines and dispatches them, the other files each answer one concern. */
#ifndef GUEST_AGENT_H
#define GUEST_AGENT_H

#include <stddef.h>

#define LINE_MAX_LEN 512
#define LEASE_DIR "/run/leases"
/* What the workload reads and writes besides leases. A built image's workload sees the same directory at the same
 * path: init binds it into the agent's root (init.sh, start_image). */
#define AGENT_DIR "/run/agentvm"
#define CHECKPOINT_DIR AGENT_DIR "/checkpoint-requests"
/* The exec server's directory (guest-exec/): outside the workload's root, root-only. */
#define EXEC_DIR "/run/guest-exec"
#define EXEC_KEY_FILE EXEC_DIR "/key"

/* reply.c: writing to the host */
void log_line(const char *msg);
void write_all(int fd, const char *data, size_t len);
__attribute__((format(printf, 3, 4))) void reply(int fd, const char *id, const char *fmt, ...);

/* protocol.c: one channel to the host (virtio-serial or a vsock connection) and its partial line */
struct channel {
  int fd;
  char buf[LINE_MAX_LEN];
  size_t len;
};
int pump(struct channel *ch);

/* clock.c: GETTIME, SETTIME */
void get_time(int out, const char *id);
void set_time(int out, const char *id, char *arg);

/* leases.c: LEASES */
int count_leases(void);

/* identity.c: IDENTITY; its name check, shared with checkpoints.c */
int valid_chars(const char *s, const char *extra, size_t max);
void apply_identity(int out, const char *id, char *arg);

/* checkpoints.c: CHECKPOINTS */
void checkpoint_requests(int out, const char *id);

/* execkey.c: EXECKEY */
void set_exec_key(int out, const char *id, const char *arg);

/* listening.c: LISTENING */
void listening(int out, const char *id, const char *arg);

/* probe.c: PROBE, PROBEVIA */
void probe_direct(int out, const char *id, char *arg);
void probe_via(int out, const char *id, char *arg);

#endif
