#!/bin/sh
# PID 1 of the demo guest: mounts, loads virtio modules, brings up the network, starts the guest agent and the workload.
export PATH=/sbin:/bin:/usr/sbin:/usr/bin

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /run/leases
chmod 1777 /run/leases

# Modules in dependency order (computed from the modules' own "depends=" at image build time).
while read -r module; do
  [ -n "$module" ] || continue
  insmod "/lib/modules/$module.ko" 2>/dev/null || echo "init: insmod $module failed" >&2
done < /etc/modules

hostname demo
ip link set lo up
# Network: QEMU user networking by default (guest 10.0.2.15/24, gateway 10.0.2.2). Other drivers (Firecracker
# with a tap) pass Linux's ip=<guest>::<gateway>:<netmask>::eth0:off; the kernel has no IP autoconfig, so we apply it.
addr=10.0.2.15
mask=255.255.255.0
gw=10.0.2.2
for arg in $(cat /proc/cmdline); do
  case "$arg" in
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

respawn /sbin/guest-agent &
respawn /usr/bin/demo-agent &
echo "init: ready"

# PID 1 reaps every orphan that gets re-parented to it.
while true; do
  wait
  sleep 1
done
