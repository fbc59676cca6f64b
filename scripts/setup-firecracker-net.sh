#!/usr/bin/env bash
# Creates (up) or removes (down) the tap device of one Firecracker VM, with default-deny networking (nftables).
#
#   setup-firecracker-net.sh up   --tap fcvm0 --host-ip 172.30.0.1 --guest-ip 172.30.0.2 [--prefix 30]
#                                 [--allow-egress [--deny CIDR,CIDR…]] [--uplink eth0] [--host-port 18080 [--guest-port 8080]] [--owner UID]
#   setup-firecracker-net.sh down --tap fcvm0
#
# What `up` sets (idempotent; the firecracker driver runs it before every boot and restore):
#   - tap device (`ip tuntap add … mode tap`), host side address host-ip/prefix, link up;
#   - nftables table `inet agentvm_<tap>`:
#       input:   from the tap only replies to connections the host opened (the guest reaches no host service);
#       forward: the guest reaches nothing beyond the host unless --allow-egress (then only from its own
#                address, masqueraded on --uplink, and none of the --deny ranges: the driver passes the
#                private, loopback, link-local, metadata and reserved ranges the QEMU VMs' proxy refuses);
#                nothing else is forwarded to the guest except --host-port;
#       anti-spoofing: packets from the tap with another source address are dropped;
#   - --host-port P: DNAT tcp P on the host's addresses to guest-ip:guest-port (optional ingress mapping; the
#     fleet-agent itself reaches the guest directly at guest-ip:8080 over the tap route).
# Needs root (CAP_NET_ADMIN), iproute2 and nftables (`apt-get install iproute2 nftables`).
# DRY_RUN=1 prints the commands and the ruleset instead of running them.
set -euo pipefail

die() { echo "setup-firecracker-net: $*" >&2; exit 1; }
run() { if [[ "${DRY_RUN:-}" == 1 ]]; then echo "+ $*"; else "$@"; fi; }

ACTION="${1:-}"; shift || true
TAP="" HOST_IP="" GUEST_IP="" PREFIX=30 ALLOW_EGRESS=0 DENY="" UPLINK="" HOST_PORT="" GUEST_PORT=8080 OWNER=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tap) TAP="$2"; shift 2 ;;
    --host-ip) HOST_IP="$2"; shift 2 ;;
    --guest-ip) GUEST_IP="$2"; shift 2 ;;
    --prefix) PREFIX="$2"; shift 2 ;;
    --allow-egress) ALLOW_EGRESS=1; shift ;;
    --deny) DENY="$2"; shift 2 ;;
    --uplink) UPLINK="$2"; shift 2 ;;
    --host-port) HOST_PORT="$2"; shift 2 ;;
    --guest-port) GUEST_PORT="$2"; shift 2 ;;
    --owner) OWNER="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) die "unknown argument $1" ;;
  esac
done

[[ "$TAP" =~ ^[A-Za-z0-9_-]{1,15}$ ]] || die "--tap must be 1-15 letters, digits, - or _"
[[ -z "$DENY" || "$DENY" =~ ^[0-9./,]+$ ]] || die "--deny takes IPv4 CIDRs separated by commas"
TABLE="agentvm_${TAP//-/_}"

if [[ "${DRY_RUN:-}" != 1 ]]; then
  [[ $EUID -eq 0 ]] || die "must run as root (creates tap devices and nftables rules)"
  command -v ip >/dev/null || die "ip (iproute2) not found: apt-get install iproute2"
  command -v nft >/dev/null || die "nft not found: apt-get install nftables"
fi

case "$ACTION" in
  up)
    [[ "$HOST_IP" =~ ^[0-9.]+$ && "$GUEST_IP" =~ ^[0-9.]+$ ]] || die "--host-ip and --guest-ip are required IPv4 addresses"
    if [[ "${DRY_RUN:-}" == 1 ]] || ! ip link show dev "$TAP" >/dev/null 2>&1; then
      run ip tuntap add dev "$TAP" mode tap ${OWNER:+user "$OWNER"}
    fi
    run ip addr replace "$HOST_IP/$PREFIX" dev "$TAP"
    run ip link set dev "$TAP" up

    egress_out='oifname != "'"$TAP"'"'
    [[ -n "$UPLINK" ]] && egress_out='oifname "'"$UPLINK"'"'
    rules="table inet $TABLE {
  chain input {
    type filter hook input priority 0; policy accept;
    iifname \"$TAP\" ip saddr != $GUEST_IP drop
    iifname \"$TAP\" ct state established,related accept
    iifname \"$TAP\" drop
  }
  chain forward {
    type filter hook forward priority 0; policy accept;
    iifname \"$TAP\" ip saddr != $GUEST_IP drop
    iifname \"$TAP\" ct state established,related accept
    oifname \"$TAP\" ct state established,related accept"
    if [[ -n "$HOST_PORT" ]]; then
      rules+="
    oifname \"$TAP\" ip daddr $GUEST_IP tcp dport $GUEST_PORT ct status dnat accept"
    fi
    if [[ "$ALLOW_EGRESS" == 1 ]]; then
      if [[ -n "$DENY" ]]; then
        rules+="
    iifname \"$TAP\" ip daddr { ${DENY//,/, } } drop"
      fi
      rules+="
    iifname \"$TAP\" $egress_out accept"
    fi
    rules+="
    iifname \"$TAP\" drop
    oifname \"$TAP\" drop
  }"
    if [[ "$ALLOW_EGRESS" == 1 ]]; then
      rules+="
  chain postrouting {
    type nat hook postrouting priority 100; policy accept;
    ip saddr $GUEST_IP $egress_out masquerade
  }"
    fi
    if [[ -n "$HOST_PORT" ]]; then
      rules+="
  chain prerouting {
    type nat hook prerouting priority -100; policy accept;
    iifname != \"$TAP\" tcp dport $HOST_PORT dnat ip to $GUEST_IP:$GUEST_PORT
  }"
    fi
    rules+="
}"
    # Replace the VM's table atomically: delete (if present) and add in one nft transaction.
    if [[ "${DRY_RUN:-}" == 1 ]]; then
      echo "+ nft -f - <<EOF"; echo "$rules"; echo "EOF"
    else
      { nft list table inet "$TABLE" >/dev/null 2>&1 && echo "delete table inet $TABLE"; echo "$rules"; } | nft -f -
    fi
    if [[ "$ALLOW_EGRESS" == 1 || -n "$HOST_PORT" ]]; then
      run sysctl -q -w net.ipv4.ip_forward=1
    fi
    ;;
  down)
    if [[ "${DRY_RUN:-}" == 1 ]]; then
      echo "+ nft delete table inet $TABLE"; echo "+ ip link del dev $TAP"
    else
      nft delete table inet "$TABLE" 2>/dev/null || true
      ip link del dev "$TAP" 2>/dev/null || true
    fi
    ;;
  *) die "usage: $0 up|down --tap NAME [...] (see --help)" ;;
esac
