# The desktop example agent: opens xterm on the agent's display, answers what runs there, and opens another on demand.
import json
import os
import subprocess
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(os.environ.get("PORT", "8080"))
AGENT_ID = os.environ.get("AGENT_ID", "local")
SIZE = os.environ.get("AGENTVM_DESKTOP_SIZE", "1024x768")
STARTED = time.time()
terminals = []


def open_terminal(title):
    """An xterm running a login shell; the window manager gives it the whole screen."""
    terminals.append(subprocess.Popen(["xterm", "-title", title, "-fa", "DejaVu Sans Mono", "-fs", "13", "-bg", "white", "-fg", "black", "-e", "bash", "-l"]))


class Agent(BaseHTTPRequestHandler):
    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, fmt, *args):
        print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {self.command} {self.path} {fmt % args}", flush=True)

    def do_GET(self):
        if self.path == "/":
            running = [t.pid for t in terminals if t.poll() is None]
            return self.reply(200, {"agentId": AGENT_ID, "display": os.environ.get("DISPLAY"), "size": SIZE, "terminals": running, "uptimeS": round(time.time() - STARTED, 1)})
        return self.reply(404, {"error": "not found"})

    def do_POST(self):
        if self.path == "/terminals":
            open_terminal(f"terminal {len(terminals) + 1}")
            return self.reply(201, {"terminals": len(terminals)})
        return self.reply(404, {"error": "not found"})


if __name__ == "__main__":
    open_terminal("terminal 1")
    print(f"desktop agent on :{PORT}, display {os.environ.get('DISPLAY')} at {SIZE}", flush=True)
    ThreadingHTTPServer(("0.0.0.0", PORT), Agent).serve_forever()
