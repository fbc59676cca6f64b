#!/usr/bin/env bash
# Creates (up) or removes (down) the tap device of one Firecracker VM, with default-deny networking (nftables).
#
#   setup-firecracker-net.sh up   --tap fcvm0 --host-ip 172.30.0.1 --guest-ip 172.30.0.2 [--prefix 30]
#                                 [--allow-egress [--allow ENTRY,ENTRY…] [--deny ENTRY,ENTRY…]] [--uplink eth0]
#                                 [--host-port 18080 [--guest-port 8080]] [--owner UID]
#   setup-firecracker-net.sh down --tap fcvm0
#
# What `up` sets (idempotent; the firecracker driver runs it before every boot and restore):
#   - tap device (`ip tuntap add … mode tap`), host side address host-ip/prefix, link up;
#   - nftables table `inet agentvm_<tap>`:
#       input:   from the tap only replies to connections the host opened (the guest reaches no host service),
#                and with --allow-egress the --allow entries (an allow entry may name one of the host's addresses);
#       forward: the guest reaches nothing beyond the host unless --allow-egress; then, from its own address only,
#                in this order: the --allow entries are accepted, the --deny entries dropped, the rest accepted and
#                masqueraded on --uplink (the driver passes the egress proxy's policy: fleet-agent/egress/direct-lists.ts);
#                nothing else is forwarded to the guest except --host-port;
#       anti-spoofing: packets from the tap with another IPv4 source address are dropped;
#   - --host-port P: DNAT tcp P on the host's addresses to guest-ip:guest-port (optional ingress mapping; the
#     fleet-agent itself reaches the guest directly at guest-ip:8080 over the tap route).
# An ENTRY is a CIDR with its prefix length, optionally with one port (TCP and UDP to that port only):
# `10.0.0.0/8`, `10.1.2.3/32:8080`; --deny also takes IPv6 (`fd00::/8`, `[fd00::5/128]:443`, `::/0`). --allow takes
# IPv4 only: the guest has no IPv6 address, so an IPv6 exception would accept packets from a source nobody checks.
# Both may be repeated; anything else is refused before a rule is written (this runs as root), as is an address,
# port, prefix, interface or owner that is not one.
# Needs root (CAP_NET_ADMIN), iproute2 and nftables (`apt-get install iproute2 nftables`).
# DRY_RUN=1 prints the commands and the ruleset instead of running them.
set -euo pipefail

die() { echo "setup-firecracker-net: $*" >&2; exit 1; }
run() { if [[ "${DRY_RUN:-}" == 1 ]]; then echo "+ $*"; else "$@"; fi; }

ACTION="${1:-}"; shift || true
[[ "$ACTION" == -h || "$ACTION" == --help ]] && set -- --help
TAP="" HOST_IP="" GUEST_IP="" PREFIX=30 ALLOW_EGRESS=0 ALLOW="" DENY="" UPLINK="" HOST_PORT="" GUEST_PORT=8080 OWNER=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tap) TAP="$2"; shift 2 ;;
    --host-ip) HOST_IP="$2"; shift 2 ;;
    --guest-ip) GUEST_IP="$2"; shift 2 ;;
    --prefix) PREFIX="$2"; shift 2 ;;
    --allow-egress) ALLOW_EGRESS=1; shift ;;
    --allow) ALLOW+="${ALLOW:+,}$2"; shift 2 ;;
    --deny) DENY+="${DENY:+,}$2"; shift 2 ;;
    --uplink) UPLINK="$2"; shift 2 ;;
    --host-port) HOST_PORT="$2"; shift 2 ;;
    --guest-port) GUEST_PORT="$2"; shift 2 ;;
    --owner) OWNER="$2"; shift 2 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) die "unknown argument $1" ;;
  esac
done

[[ "$TAP" =~ ^[A-Za-z0-9_-]{1,15}$ ]] || die "--tap must be 1-15 letters, digits, - or _"

# Entries of --allow / --deny, checked and split by family and by whether they name a port: nets go into one set per
# rule, a net with a port gets a rule of its own.
OCTET='(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])'
V4_CIDR="($OCTET\\.){3}$OCTET/(3[0-2]|[12]?[0-9])"
V6_CIDR='[0-9a-fA-F]{0,4}(:[0-9a-fA-F]{0,4}){2,7}/(12[0-8]|1[01][0-9]|[1-9]?[0-9])'
PORT='[1-9][0-9]{0,4}'
V4_ADDR="($OCTET\\.){3}$OCTET"
# Every other value lands in the ruleset or an ip command too.
[[ "$PREFIX" =~ ^(3[0-2]|[12]?[0-9])$ ]] || die "--prefix must be 0..32"
[[ -z "$UPLINK" || "$UPLINK" =~ ^[A-Za-z0-9_.-]{1,15}$ ]] || die "--uplink must be an interface name (1-15 letters, digits, ., - or _)"
for p in "$HOST_PORT" "$GUEST_PORT"; do
  [[ -z "$p" || ( "$p" =~ ^$PORT$ && "$p" -le 65535 ) ]] || die "--host-port and --guest-port must be 1..65535"
done
[[ -z "$OWNER" || "$OWNER" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]*$ ]] || die "--owner must be a user name or id"
ALLOW4=() ALLOW4_PORT=() DENY4=() DENY6=() DENY4_PORT=() DENY6_PORT=()
# One entry of --allow (v6=0) or --deny (v6=1) into the named arrays: "net" or "net port". Dies on anything else.
add_entry() {
  local flag="$1" entry="$2" v6="$3" net port=""
  local -n nets4="$4" ports4="$5" nets6="$6" ports6="$7"
  if [[ "$entry" =~ ^\[([^]]*)\]:(.*)$ ]]; then net="${BASH_REMATCH[1]}" port="${BASH_REMATCH[2]}"
  elif [[ "$entry" == *.*:* && "$entry" != *:*:* ]]; then net="${entry%:*}" port="${entry##*:}"
  else net="$entry"
  fi
  [[ -z "$port" || ( "$port" =~ ^$PORT$ && "$port" -le 65535 ) ]] || die "$flag \"$entry\": port must be 1..65535"
  if [[ "$net" =~ ^$V4_CIDR$ && "$entry" != \[* ]]; then
    if [[ -n "$port" ]]; then ports4+=("$net $port"); else nets4+=("$net"); fi
  elif [[ "$v6" == 1 && "$net" =~ ^$V6_CIDR$ && "$net" != *::*::* && ( -z "$port" || "$entry" == \[* ) ]]; then
    if [[ -n "$port" ]]; then ports6+=("$net $port"); else nets6+=("$net"); fi
  elif [[ "$v6" == 1 ]]; then
    die "$flag \"$entry\": not a CIDR (a.b.c.d/n or v6::/n, with an optional port as a.b.c.d/n:port or [v6::/n]:port)"
  else
    die "$flag \"$entry\": not an IPv4 CIDR (a.b.c.d/n or a.b.c.d/n:port; no IPv6: the guest has no IPv6 address)"
  fi
}
[[ "$ALLOW$DENY" != *$'\n'* ]] || die "--allow and --deny take one line each"
IFS=, read -r -a ALLOW_ENTRIES <<<"$ALLOW"
IFS=, read -r -a DENY_ENTRIES <<<"$DENY"
UNUSED6=() UNUSED6_PORT=()
for e in "${ALLOW_ENTRIES[@]}"; do add_entry --allow "$e" 0 ALLOW4 ALLOW4_PORT UNUSED6 UNUSED6_PORT; done
for e in "${DENY_ENTRIES[@]}"; do add_entry --deny "$e" 1 DENY4 DENY4_PORT DENY6 DENY6_PORT; done
TABLE="agentvm_${TAP//-/_}"

if [[ "${DRY_RUN:-}" != 1 ]]; then
  [[ $EUID -eq 0 ]] || die "must run as root (creates tap devices and nftables rules)"
  command -v ip >/dev/null || die "ip (iproute2) not found: apt-get install iproute2"
  command -v nft >/dev/null || die "nft not found: apt-get install nftables"
fi

case "$ACTION" in
  up)
    [[ "$HOST_IP" =~ ^$V4_ADDR$ && "$GUEST_IP" =~ ^$V4_ADDR$ ]] || die "--host-ip and --guest-ip are required IPv4 addresses"
    if [[ "${DRY_RUN:-}" == 1 ]] || ! ip link show dev "$TAP" >/dev/null 2>&1; then
      run ip tuntap add dev "$TAP" mode tap ${OWNER:+user "$OWNER"}
    fi
    run ip addr replace "$HOST_IP/$PREFIX" dev "$TAP"
    run ip link set dev "$TAP" up

    egress_out='oifname != "'"$TAP"'"'
    [[ -n "$UPLINK" ]] && egress_out='oifname "'"$UPLINK"'"'
    set_of() { local IFS=,; local list="$*"; echo "{ ${list//,/, } }"; }
    # The allow entries, accepted before anything is dropped (an allow entry wins over every refusal, as at the proxy).
    allow_rules=""
    if [[ ${#ALLOW4[@]} -gt 0 ]]; then
      allow_rules+="
    iifname \"$TAP\" ip daddr $(set_of "${ALLOW4[@]}") accept"
    fi
    for e in "${ALLOW4_PORT[@]}"; do
      allow_rules+="
    iifname \"$TAP\" ip daddr ${e% *} meta l4proto { tcp, udp } th dport ${e#* } accept"
    done
    # The deny entries (the operator's and the default refused ranges), dropped after the allows.
    deny_rules=""
    for e in "${DENY4_PORT[@]}"; do
      deny_rules+="
    iifname \"$TAP\" ip daddr ${e% *} meta l4proto { tcp, udp } th dport ${e#* } drop"
    done
    if [[ ${#DENY4[@]} -gt 0 ]]; then
      deny_rules+="
    iifname \"$TAP\" ip daddr $(set_of "${DENY4[@]}") drop"
    fi
    for e in "${DENY6_PORT[@]}"; do
      deny_rules+="
    iifname \"$TAP\" ip6 daddr ${e% *} meta l4proto { tcp, udp } th dport ${e#* } drop"
    done
    if [[ ${#DENY6[@]} -gt 0 ]]; then
      deny_rules+="
    iifname \"$TAP\" ip6 daddr $(set_of "${DENY6[@]}") drop"
    fi
    rules="table inet $TABLE {
  chain input {
    type filter hook input priority 0; policy accept;
    iifname \"$TAP\" ip saddr != $GUEST_IP drop
    iifname \"$TAP\" ct state established,related accept"
    if [[ "$ALLOW_EGRESS" == 1 ]]; then
      rules+="$allow_rules"
    fi
    rules+="
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
      rules+="$allow_rules$deny_rules
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
    ip saddr $GUEST_IP $egress_out masquerade"
      # An allowed destination may be routed out of another interface than the uplink (an internal network).
      allowed_nets=("${ALLOW4[@]}")
      for e in "${ALLOW4_PORT[@]}"; do allowed_nets+=("${e% *}"); done
      if [[ -n "$UPLINK" && ${#allowed_nets[@]} -gt 0 ]]; then
        rules+="
    ip saddr $GUEST_IP ip daddr $(set_of "${allowed_nets[@]}") oifname != \"$TAP\" masquerade"
      fi
      rules+="
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
