/* Guest agent: answers the host's line protocol (PING, SETTIME, GETTIME, LEASES, SYNC, IDENTITY, CHECKPOINTS, EXECKEY,
 * PROBE, PROBEVIA) on the virtio-serial port named "agent" and, when the kernel has AF_VSOCK, on vsock port 1024.
 * The protocol is documented at the top of fleet-agent/drivers/common/guest-agent.ts.
 * Single-threaded poll loop; one vsock connection at a time. This file: the channels and the loop; agent.h: the parts. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <linux/vm_sockets.h>
#include "agent.h"

#define VSOCK_PORT 1024

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
