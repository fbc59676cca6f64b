#!/bin/sh
# agentvm-desktop-session: the desktop base's entrypoint. Starts the agent's X display at its size, a window manager
# and the desktop API's helper, then runs the image's command (its CMD, or the arguments given; xterm without any).
#
# AGENTVM_DESKTOP_SIZE (`WIDTHxHEIGHT`) is set by the host from the agent's `desktop` size; DISPLAY is `:0` (the
# base's environment); AGENTVM_DESKTOP_HELPER_PORT (default 5999) is the loopback port of the resident helper. The
# VNC server is not started here: `vnc-bridge` starts it when a viewer first connects (nothing idles for nobody).
# Xvfb's messages go to the console (the agent's log).
set -eu
size="${AGENTVM_DESKTOP_SIZE:-1024x768}"
case "$size" in
  *[!0-9x]* | x* | *x | *x*x*) echo "agentvm-desktop-session: AGENTVM_DESKTOP_SIZE must be WIDTHxHEIGHT, got $size" >&2; exit 2 ;;
esac
export DISPLAY="${DISPLAY:-:0}"
screen="${DISPLAY#:}"
screen="${screen%%.*}"

# Xvfb makes its socket directory itself when it can; a non-root image user needs it made and open to all.
mkdir -p /tmp/.X11-unix 2>/dev/null && chmod 1777 /tmp/.X11-unix 2>/dev/null || true
rm -f "/tmp/.X$screen-lock" "/tmp/.X11-unix/X$screen"
# -noreset: the server stays as it is when its last client leaves (`call` connects per screenshot; without a window
# manager or helper connected, a reset between two calls dropped the second's connection).
Xvfb "$DISPLAY" -screen 0 "${size}x24" -nolisten tcp -ac -nocursor -noreset +extension XTEST &

# The display is up when a client can read its size (at most 30 s: TCG is slow to start an X server).
tries=0
until xdotool getdisplaygeometry >/dev/null 2>&1; do
  tries=$((tries + 1))
  if [ "$tries" -gt 300 ]; then
    echo "agentvm-desktop-session: the X server on $DISPLAY did not start" >&2
    exit 1
  fi
  sleep 0.1
done

matchbox-window-manager -use_titlebar no -use_cursor no >/dev/null 2>&1 &
# The resident helper the desktop API calls (through /usr/lib/agentvm/desktop/call): input actions (call takes screenshots itself).
/usr/lib/agentvm/desktop/helper serve --port "${AGENTVM_DESKTOP_HELPER_PORT:-5999}" >/dev/null 2>&1 &
if [ "$#" -eq 0 ]; then exec xterm; fi
exec "$@"
