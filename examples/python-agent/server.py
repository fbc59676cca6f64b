# The Python example agent: counter in memory, files on its disk, tokens over SSE, a background job holding a lease.
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

PORT = int(os.environ.get("PORT", "8080"))
AGENT_ID = os.environ.get("AGENT_ID", "local")
LEASE_DIR = os.environ.get("LEASE_DIR", "/run/agentvm/leases")
WORKSPACE = os.environ.get("WORKSPACE_DIR", "/workspace")
STARTED = time.time()
counter = 0  # in memory only: a woken VM still has it, a cold boot starts again at 0
lock = threading.Lock()


def hold_lease(name, seconds):
    """A keep-awake lease: a file in LEASE_DIR holding its expiry in unix seconds, removed when the job ends."""
    path = os.path.join(LEASE_DIR, name)
    with open(path, "w") as f:
        f.write(str(int(time.time() + seconds + 5)))
    try:
        time.sleep(seconds)
    finally:
        os.remove(path)


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
        global counter
        url = urlparse(self.path)
        q = parse_qs(url.query)
        if url.path == "/":
            return self.reply(200, {"agentId": AGENT_ID, "uptimeS": round(time.time() - STARTED, 1), "python": sys.version.split()[0]})
        if url.path == "/counter":
            with lock:
                counter += 1
                return self.reply(200, {"counter": counter})
        if url.path == "/tokens":
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("cache-control", "no-cache")
            self.end_headers()
            for i in range(int(q.get("n", ["20"])[0])):
                self.wfile.write(f"data: token-{i}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.05)
            self.wfile.write(b"event: done\ndata: {}\n\n")
            return
        if url.path.startswith("/files/"):
            path = os.path.join(WORKSPACE, os.path.basename(url.path))
            if not os.path.exists(path):
                return self.reply(404, {"error": "no such file"})
            with open(path, "rb") as f:
                data = f.read()
            self.send_response(200)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.reply(404, {"error": f"no route GET {url.path}"})

    def do_PUT(self):
        url = urlparse(self.path)
        if not url.path.startswith("/files/"):
            return self.reply(404, {"error": f"no route PUT {url.path}"})
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        path = os.path.join(WORKSPACE, os.path.basename(url.path))
        with open(path, "wb") as f:
            f.write(body)
            os.fsync(f.fileno())
        self.reply(201, {"name": os.path.basename(path), "bytes": len(body)})

    def do_POST(self):
        url = urlparse(self.path)
        if url.path == "/jobs":
            ms = int(parse_qs(url.query).get("ms", ["1000"])[0])
            name = f"job-{int(time.time() * 1000)}"
            threading.Thread(target=hold_lease, args=(name, ms / 1000), daemon=True).start()
            return self.reply(202, {"job": name, "ms": ms})
        self.reply(404, {"error": f"no route POST {url.path}"})


os.makedirs(WORKSPACE, exist_ok=True)
print(f"python agent {AGENT_ID} listening on {PORT}", flush=True)
ThreadingHTTPServer(("0.0.0.0", PORT), Agent).serve_forever()
