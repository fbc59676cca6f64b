# The browser example agent: opens Chromium on a page of its own on the agent's display; answers what runs there.
import json
import os
import pwd
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(os.environ.get("PORT", "8080"))
AGENT_ID = os.environ.get("AGENT_ID", "local")
SIZE = os.environ.get("AGENTVM_DESKTOP_SIZE", "1024x768")
# A file, not this server: the one way measured to work. Under TCG the first page a starting Chromium was given never
# loaded, over http from 127.0.0.1 (this server never saw the request) as well as a file; given again (unstick below),
# a file loads. An http page given again was not tried (docs/desktop.md#browser-variant).
PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "page.html")
START_URL = os.environ.get("BROWSER_URL", f"file://{PAGE}")
STARTED = time.time()
browser = None
sandboxed = True

# Flags for a VM without a GPU, under TCG: software drawing without trying the GPU process first, and nothing that
# runs in the background on its own (update checks, sync, translation, field trials), which would cost CPU and keep
# the agent's network busy while it should sleep. No --disable-dev-shm-usage: Debian's wrapper adds it when /dev/shm
# (a tmpfs of half the VM's memory here) is under 3.8 GB, and its files then go to /tmp, also a tmpfs.
FLAGS = [
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-breakpad",
    "--disable-crash-reporter",
    "--disable-features=Translate,MediaRouter,OptimizationHints",
    "--metrics-recording-only",
    "--password-store=basic",
    "--noerrdialogs",
]


def open_browser(url):
    """Chromium full screen on `url` (the window manager gives its window the whole screen anyway)."""
    global browser, sandboxed
    width, height = SIZE.split("x")
    # The profile in the user's home from the password database: the image's environment may carry root's HOME, which
    # the user cannot write (Chromium then exits at once, its crash handler complaining that it has no --database).
    home = pwd.getpwuid(os.getuid()).pw_dir
    args = ["chromium", *FLAGS, f"--user-data-dir={home}/.config/chromium", f"--window-size={width},{height}", "--window-position=0,0"]
    if os.getuid() == 0:
        args.append("--no-sandbox")  # Chromium refuses to start as root with its sandbox.
        sandboxed = False
    log = open("/tmp/chromium.log", "ab")
    browser = subprocess.Popen([*args, url], env={**os.environ, "HOME": home}, stdout=subprocess.DEVNULL, stderr=log)
    try:
        # A Chromium that found no usable sandbox exits within seconds; started again without one, the page still shows.
        browser.wait(timeout=20)
    except subprocess.TimeoutExpired:
        return unstick([*args, url], {**os.environ, "HOME": home}, log)
    sandboxed = False
    print(f"chromium exited with {browser.returncode} (see /tmp/chromium.log); started again with --no-sandbox", flush=True)
    args.append("--no-sandbox")
    browser = subprocess.Popen([*args, url], env={**os.environ, "HOME": home}, stdout=subprocess.DEVNULL, stderr=log)
    unstick([*args, url], {**os.environ, "HOME": home}, log)


def window_names():
    found = subprocess.run(["xdotool", "search", "--name", " - Chromium$"], capture_output=True, text=True).stdout.split()
    return [subprocess.run(["xdotool", "getwindowname", w], capture_output=True, text=True).stdout.strip() for w in found]


def unstick(argv, env, log):
    """Gives Chromium its page again while its window still says "Untitled".

    Under TCG, Chromium's network service crashed as Chromium started (it is restarted) and the first page it was
    given never loaded, a file: page as well as one over http: the window stayed "Untitled - Chromium", black. The
    same URL given again to the running browser (a second `chromium`, which hands it over: a new tab) loads (seen with
    the file: page)."""
    stuck = 0
    reopened = False
    for _ in range(30):
        time.sleep(5)
        if browser.poll() is not None:
            return
        names = window_names()
        if any(n != "Untitled - Chromium" for n in names):
            if reopened:
                # The first tab would spin for ever (a redraw a frame: CPU, and a screen never still): closed.
                subprocess.run(["xdotool", "key", "ctrl+1", "ctrl+w"])
            return
        stuck = stuck + 5 if names else 0
        if stuck >= 15:
            print("chromium's page did not load: opening it again", flush=True)
            subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=log)
            reopened = True
            stuck = -30  # a minute before the next try


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
            running = browser is not None and browser.poll() is None
            return self.reply(200, {"agentId": AGENT_ID, "display": os.environ.get("DISPLAY"), "size": SIZE, "browser": browser.pid if running else None, "sandbox": sandboxed, "url": START_URL, "uptimeS": round(time.time() - STARTED, 1)})
        return self.reply(404, {"error": "not found"})


if __name__ == "__main__":
    server = ThreadingHTTPServer(("0.0.0.0", PORT), Agent)
    # In a thread: the server answers readiness while Chromium starts (a minute of CPU under TCG).
    threading.Thread(target=open_browser, args=(START_URL,), daemon=True).start()
    print(f"browser agent on :{PORT}, display {os.environ.get('DISPLAY')} at {SIZE}, chromium on {START_URL}", flush=True)
    server.serve_forever()
