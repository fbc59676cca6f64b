#!/bin/bash
# vnc-bridge view | control [holder]: joins stdin and stdout to the display's VNC server on the guest's loopback
# (x11vnc, started on first use): 127.0.0.1:5901 is view-only (x11vnc drops the viewer's keys and pointer itself),
# 5900 takes input. What a viewer's WebSocket is relayed to through the exec path (docs/desktop.md).
#
# While a human holds control, /run/agentvm/desktop/control exists (since=, by=): the agent can tell. x11vnc removes
# it when the controlling client goes (-gone), however the bridge ended. The directory is the VM's init's, writable
# by the image's user (sticky, like /tmp): it is a signal to the agent's own code, not a lock.
mode="${1:-view}"
flag=/run/agentvm/desktop/control
case "$mode" in
  view) port=5901; only=-viewonly ;;
  control) port=5900; only=; printf 'since=%s\nby=%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "${2:-}" > "$flag" ;;
  *) echo "refused: vnc-bridge view|control" >&2; exit 2 ;;
esac
connect() { { exec 3<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null; }
if ! connect; then
  # -bg returns once it listens; two bridges starting at once: the second's x11vnc fails to bind and it joins the first.
  gone=()
  [ "$mode" = control ] && gone=(-gone "rm -f $flag")
  x11vnc -display "${DISPLAY:-:0}" -localhost -rfbport "$port" $only "${gone[@]}" -forever -shared -nopw -quiet -noxdamage -bg -o "/tmp/x11vnc-$port.log" >/dev/null 2>&1
  tries=0
  until connect; do
    tries=$((tries + 1))
    if [ "$tries" -gt 50 ]; then echo "error: the VNC server on 127.0.0.1:$port did not start" >&2; exit 1; fi
    sleep 0.1
  done
fi
cat <&3 &
cat >&3
wait
