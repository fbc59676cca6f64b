#!/bin/bash
# The desktop API's entry in the VM (docs/desktop.md): hands one request (a JSON line on stdin) to the resident helper
# on 127.0.0.1:AGENTVM_DESKTOP_HELPER_PORT and prints its answer; runs the helper once itself when none answers.
# bash's /dev/tcp and one `cat`: a call starts no Python. Exit 2: refused (the reason on stderr); 1: failed.
port="${AGENTVM_DESKTOP_HELPER_PORT:-5999}"
# In braces: the failed connection's message is dropped without sending the script's own stderr to /dev/null.
if { exec 3<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null; then
  IFS= read -r request
  printf '%s\n' "$request" >&3
  IFS= read -r status <&3
  case "$status" in
    ok) exec cat <&3 ;;
    refused:*) printf '%s\n' "$status" >&2; exit 2 ;;
    *) printf '%s\n' "${status:-error: the desktop helper closed the connection}" >&2; exit 1 ;;
  esac
fi
exec /usr/lib/agentvm/desktop/helper request
