#!/bin/sh
# PID 1 of the guest: mounts, loads virtio modules, brings up the network, starts the guest agent and the workload —
# the built-in demo, or a built image's entrypoint over the image's drives (see start_image below).
export PATH=/sbin:/bin:/usr/sbin:/usr/bin

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /run/leases /run/desktop
chmod 1777 /run/leases /run/desktop
# /run/agentvm is what the workload shares with the guest agent (identity, checkpoint-requests/): a built image's
# workload sees the same directory at the same path (bound into its root below). init's own files are in /run/init.
mkdir -p /run/agentvm

# Modules in dependency order (computed from the modules' own "depends=" at image build time).
while read -r module; do
  [ -n "$module" ] || continue
  insmod "/lib/modules/$module.ko" 2>/dev/null || echo "init: insmod $module failed" >&2
done < /etc/modules
# A virtio block device (id 2) means a built image's drives: only then are their modules loaded, so the demo boots as
# before (and shell builtins only here: every process costs under TCG).
image_mode=
for f in /sys/bus/virtio/devices/*/device; do
  [ -r "$f" ] && read -r id < "$f" && [ "$id" = 0x0002 ] && image_mode=1
done
if [ -n "$image_mode" ]; then
  while read -r module; do
    [ -n "$module" ] || continue
    insmod "/lib/modules/$module.ko" 2>/dev/null || echo "init: insmod $module failed" >&2
  done < /etc/modules.image
fi

hostname demo
ip link set lo up
# Network: QEMU user networking by default (guest 10.0.2.15/24, gateway 10.0.2.2). Other drivers (Firecracker
# with a tap) pass Linux's ip=<guest>::<gateway>:<netmask>::eth0:off; the kernel has no IP autoconfig, so we apply it.
addr=10.0.2.15
mask=255.255.255.0
gw=10.0.2.2
# agentvm.egress_proxy=<url>: the agent may reach out, only through the host's egress proxy (QEMU's guestfwd; see
# fleet-agent/egress/). Every other outbound packet is dropped by QEMU (restrict=on).
egress_proxy=
# agentvm.upstreams=<a,b,…>: the guest reaches the proxy, where its tenant's upstreams are (/u/<name>/…; the names
# are those it had at boot, [a-z0-9-]); absent: no proxy at all.
upstreams=
has_upstreams=
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    agentvm.egress_proxy=*)
      egress_proxy="${arg#agentvm.egress_proxy=}"
      ;;
    agentvm.upstreams=*)
      upstreams="${arg#agentvm.upstreams=}"
      has_upstreams=1
      ;;
    ip=*::*:*)
      spec="${arg#ip=}"
      addr="${spec%%:*}"
      rest="${spec#*::}"
      gw="${rest%%:*}"
      rest="${rest#*:}"
      mask="${rest%%:*}"
      ;;
  esac
done
n=0
while [ ! -e /sys/class/net/eth0 ] && [ $n -lt 200 ]; do usleep 10000; n=$((n + 1)); done
if [ -e /sys/class/net/eth0 ]; then
  ifconfig eth0 "$addr" netmask "$mask" up
  [ -n "$gw" ] && route add default gw "$gw"
  echo "nameserver 10.0.2.3" > /etc/resolv.conf
else
  echo "init: no eth0" >&2
fi
# The demo's processes learn the proxy the usual way (a built image's entrypoint gets the same from its launch spec;
# egress/guest-address.ts `egressProxyEnv` says why each variable, NODE_USE_ENV_PROXY for Node ≥ 24's fetch).
if [ -n "$egress_proxy" ]; then
  export HTTP_PROXY="$egress_proxy" HTTPS_PROXY="$egress_proxy" http_proxy="$egress_proxy" https_proxy="$egress_proxy"
  export NO_PROXY=localhost,127.0.0.1,10.0.2.100 no_proxy=localhost,127.0.0.1,10.0.2.100 NODE_USE_ENV_PROXY=1
fi
if [ -n "$has_upstreams" ]; then
  export AGENTVM_UPSTREAMS_URL=http://10.0.2.100:3128/u
  for name in $(echo "$upstreams" | tr ',' ' '); do
    var="AGENTVM_UPSTREAM_$(echo "$name" | tr 'a-z-' 'A-Z_')_URL"
    export "$var=$AGENTVM_UPSTREAMS_URL/$name"
  done
fi

# udev would name virtio-serial ports as /dev/virtio-ports/<name>; there is no udev here.
mkdir -p /dev/virtio-ports
for port in /sys/class/virtio-ports/*; do
  [ -e "$port/name" ] || continue
  name=$(cat "$port/name")
  [ -n "$name" ] && ln -sf "/dev/${port##*/}" "/dev/virtio-ports/$name"
done

respawn() {
  while true; do
    "$@"
    echo "init: $1 exited with $?, restarting" >&2
    sleep 1
  done
}

# Built images. The host gives three drives, found by label: the image (ext4, read-only, shared by every agent of
# the image), the agent's own disk (ext4, read-write, kept across hibernate and cold boots) and the launch drive
# (the launcher's spec file and the hostname, made per boot). The agent's root is an overlay: the image below, the
# disk's upper/ above, so everything it writes anywhere lands on its disk and the disk's size is its limit.
# Lines starting "agentvm: " are read by the host while it waits for the boot: a failure says why at once.
image_failed() {
  echo "agentvm: image setup failed: $*"
  sync
  # reboot, not poweroff: QEMU (-no-reboot) and Firecracker (reboot=k) both exit on it; Firecracker keeps running on a halt.
  reboot -f
  sleep 10
}

# drive <label> <variable>: sets the variable to the device of the filesystem labelled so. The host also gives each
# drive its label as its virtio serial: one grep reads them all from sysfs (findfs probes every device, ≈ 0.1 s a call
# under TCG, and the shell's read builtin reads byte by byte, each byte a request to the device); a drive without
# one (another hypervisor) is found by its filesystem label.
drive() {
  [ -n "$serials" ] || serials=$(grep -H . /sys/block/vd*/serial 2>/dev/null) || serials=none
  for line in $serials; do
    case "$line" in
      */serial:"$1")
        line=${line%/serial:*}
        eval "$2=/dev/${line##*/}"
        return 0
        ;;
    esac
  done
  n=0
  while [ $n -lt 100 ]; do
    found=$(findfs "LABEL=$1" 2>/dev/null) && { eval "$2=\$found"; return 0; }
    usleep 10000
    n=$((n + 1))
  done
  return 1
}

# A file the agent's root must have for a bind mount: created in the overlay (an image's symlink there is replaced).
bind_file() {
  target="/mnt/root$2"
  if [ -L "$target" ] || [ ! -f "$target" ]; then
    rm -rf "$target" && : > "$target" || return 1
  fi
  mount -o bind "$1" "$target"
}

start_image() {
  drive agentvm-launch launch_dev || { image_failed "no drive labelled agentvm-launch"; return; }
  drive agentvm-image image_dev || { image_failed "no drive labelled agentvm-image"; return; }
  drive agentvm-disk disk_dev || { image_failed "no drive labelled agentvm-disk"; return; }
  mkdir -p /mnt/launch /mnt/image /mnt/disk /mnt/root /run/init/etc
  mount -t ext4 -o ro "$launch_dev" /mnt/launch || { image_failed "cannot mount the launch drive $launch_dev"; return; }
  cp /mnt/launch/launch.spec /run/init/launch.spec || { image_failed "the launch drive has no launch.spec"; return; }
  name=agent
  [ -r /mnt/launch/hostname ] && read -r name < /mnt/launch/hostname
  umount /mnt/launch
  mount -t ext4 -o ro "$image_dev" /mnt/image || { image_failed "cannot mount the image $image_dev read-only"; return; }
  mount -t ext4 "$disk_dev" /mnt/disk || { image_failed "cannot mount the agent disk $disk_dev"; return; }
  mkdir -p /mnt/disk/upper /mnt/disk/work
  mount -t overlay overlay -o lowerdir=/mnt/image,upperdir=/mnt/disk/upper,workdir=/mnt/disk/work /mnt/root ||
    { image_failed "cannot mount the overlay (image under the agent disk)"; return; }
  r=/mnt/root
  mkdir -p $r/proc $r/sys $r/dev $r/tmp $r/etc $r/run/agentvm/leases
  mount -t proc proc $r/proc
  mount -t sysfs sysfs $r/sys
  mount -o rbind /dev $r/dev # devtmpfs with /dev/pts and /dev/shm
  mount -t tmpfs -o mode=1777 tmpfs $r/tmp
  # The shared directory as a whole (a file the guest agent replaces by rename shows through a directory bind only),
  # the lease directory on top of it, and the desktop's (a desktop base's viewer bridge says there who holds control,
  # docs/desktop.md): the workload sees /run/agentvm/{identity,checkpoint-requests,leases,desktop}.
  mkdir -p /run/agentvm/leases /run/agentvm/desktop
  mount -o bind /run/agentvm $r/run/agentvm || { image_failed "cannot bind /run/agentvm"; return; }
  mount -o bind /run/leases $r/run/agentvm/leases || { image_failed "cannot bind the lease directory"; return; }
  mount -o bind /run/desktop $r/run/agentvm/desktop || { image_failed "cannot bind the desktop directory"; return; }
  hostname "$name"
  echo "$name" > /run/init/etc/hostname
  printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n%s\t%s\n' "$addr" "$name" > /run/init/etc/hosts
  : > /run/init/etc/resolv.conf
  [ -r /etc/resolv.conf ] && while IFS= read -r line; do echo "$line"; done < /etc/resolv.conf > /run/init/etc/resolv.conf
  # Bound as files: the guest agent's IDENTITY rewrites hostname and hosts in place (fleet-agent/guest/guest-agent/identity.c).
  for f in hostname hosts resolv.conf; do
    bind_file /run/init/etc/$f /etc/$f || echo "init: cannot put /etc/$f in place" >&2
  done

  # The exec server (commands and files inside the agent's root, guest-exec/), on TCP and vsock port 1025; its key
  # and state are in /run/guest-exec, outside the root.
  respawn /sbin/guest-exec --listen 0.0.0.0:1025 --vsock 1025 --root /mnt/root --spec /run/init/launch.spec --key-file /run/guest-exec/key \
    > /dev/null &
  # The entrypoint, inside the root, as the image's user; its output is the console (the host's log of the agent).
  /sbin/launch /mnt/root /run/init/launch.spec < /dev/null > /dev/console 2>&1 &
  pid=$!
  echo "agentvm: entrypoint started"
  wait $pid
  status=$?
  # An entrypoint that ends ends the VM: during the boot the host fails the boot (this line says why); later QEMU's
  # exit is the crash the host records, and the next call boots the agent again. The disk is synced first.
  echo "agentvm: entrypoint exited with status $status"
  sync
  reboot -f
  sleep 10
}

respawn /sbin/guest-agent &
if [ -n "$image_mode" ]; then
  start_image
else
  respawn /usr/bin/demo-agent &
  # The exec server over the whole guest (the demo runs as root): the guest's own programs may not be replaced, and its
  # key and state are hidden from its own requests.
  respawn /sbin/guest-exec --listen 0.0.0.0:1025 --vsock 1025 --root / --key-file /run/guest-exec/key \
    --protect /init --protect /sbin/guest-agent --protect /sbin/guest-exec --protect /sbin/launch --protect /usr/bin/demo-agent \
    --protect /bin/busybox --protect /lib/modules --hide /run/guest-exec > /dev/null &
  echo "init: ready"
fi

# PID 1 reaps every orphan that gets re-parented to it.
while true; do
  wait
  sleep 1
done
