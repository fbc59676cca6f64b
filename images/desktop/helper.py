#!/usr/bin/python3
# The desktop helper (docs/desktop.md): screenshots of the agent's X display as PNG and input actions, speaking the
# X protocol itself (GetImage, XTEST, QueryPointer) over the display's socket. Python's standard library only.
#
#   helper serve [--port P]   the resident server the session starts: one JSON request a connection on 127.0.0.1:P
#   helper request            one request as a JSON line on stdin, answered on stdout (what `call` falls back to)
#
# A request is {"cmd": "screenshot", "scale"?} (answer: a PNG) or {"cmd": "actions", "actions": [...],
# "screenshot"?: bool, "scale"?} (answer: {"cursor": {x, y}, "screenshot": base64 PNG | null}, the screenshot taken
# once nothing was drawn for 50 ms, at most 1 s after the last action) or {"cmd": "size"}.
# The base's `call` (call.c, compiled) takes screenshots itself; it marks an actions request `"screenshotBy": "call"`,
# and the resident server then answers `shot <scale>` and {"cursor"} after the stillness wait, the screenshot left to it.
# The API checks what it sends; this checks again what it can and refuses the rest (exit 2, or a `refused:` line).
# Resident, it answers a screenshot without starting a process: Python's start alone is ~0.3 s under TCG.
import base64
import json
import os
import socket
import socketserver
import struct
import sys
import time
import zlib
from array import array

DEFAULT_PORT = 5999


class Refused(Exception):
    pass


class XError(Exception):
    pass


# Keysyms of the names the API sends (gateway/desktop/keys.ts); a single character is its own keysym (Latin-1) or
# 0x01000000 + its code point.
KEYSYMS = {
    "Return": 0xFF0D, "Escape": 0xFF1B, "Tab": 0xFF09, "BackSpace": 0xFF08, "Delete": 0xFFFF, "Insert": 0xFF63,
    "Home": 0xFF50, "End": 0xFF57, "Page_Up": 0xFF55, "Page_Down": 0xFF56, "Up": 0xFF52, "Down": 0xFF54,
    "Left": 0xFF51, "Right": 0xFF53, "space": 0x20, "Menu": 0xFF67, "Print": 0xFF61, "Pause": 0xFF13,
    "Caps_Lock": 0xFFE5, "Num_Lock": 0xFF7F, "Scroll_Lock": 0xFF14, "minus": 0x2D, "equal": 0x3D, "plus": 0x2B,
    "comma": 0x2C, "period": 0x2E, "slash": 0x2F, "backslash": 0x5C, "semicolon": 0x3B, "apostrophe": 0x27,
    "grave": 0x60, "bracketleft": 0x5B, "bracketright": 0x5D,
    "ctrl": 0xFFE3, "alt": 0xFFE9, "shift": 0xFFE1, "super": 0xFFEB,
}
for _n in range(1, 25):
    KEYSYMS[f"F{_n}"] = 0xFFBE + _n - 1
SHIFT = 0xFFE1
BUTTONS = {"left": 1, "middle": 2, "right": 3}
SCROLL = {"up": 4, "down": 5, "left": 6, "right": 7}


def char_keysym(ch):
    if ch == "\n":
        return 0xFF0D
    if ch == "\t":
        return 0xFF09
    code = ord(ch)
    return code if 0x20 <= code <= 0x7E or 0xA0 <= code <= 0xFF else 0x01000000 + code


class Display:
    """One connection to the X server: the few requests the helper needs, replies read in order, events skipped."""

    def __init__(self, name=None):
        name = name or os.environ.get("DISPLAY") or ":0"
        number = name.split(":", 1)[1].split(".", 1)[0] if ":" in name else "0"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(f"/tmp/.X11-unix/X{number}")
        self.buf = bytearray()
        self.sock.sendall(struct.pack("<BxHHHHxx", 0x6C, 11, 0, 0, 0))
        head = self.read(8)
        extra = self.read(struct.unpack_from("<H", head, 6)[0] * 4)
        if head[0] != 1:
            raise XError(f"the X server refused the connection: {bytes(extra[: head[1]]).decode(errors='replace')}")
        vendor_len, _max_req, screens, formats = struct.unpack_from("<HHBB", extra, 16)
        self.min_keycode, self.max_keycode = extra[26], extra[27]
        at = 32 + (vendor_len + 3) // 4 * 4 + 8 * formats
        self.root = struct.unpack_from("<I", extra, at)[0]
        self.width, self.height = struct.unpack_from("<HH", extra, at + 20)
        self.depth = extra[at + 38]
        self.id_base = struct.unpack_from("<I", extra, 4)[0]
        self.seq = 0
        self.xtest = self.extension(b"XTEST")
        if self.xtest is None:
            raise XError("the X server has no XTEST extension")
        self.load_keymap()
        # No key autorepeat: a key is pressed once however long the VM stalls between its press and its release
        # (under load a stall past the server's 660 ms delay typed the key again and again).
        self.send(struct.pack("<BxHII", 102, 3, 0x80, 0))  # ChangeKeyboardControl: auto-repeat-mode Off
        self.damaged = False
        self.damage = None
        self.damage = self.track_damage()

    def read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(max(65536, n - len(self.buf)))
            if not chunk:
                raise XError("the X server closed the connection")
            self.buf += chunk
        out = self.buf[:n]
        del self.buf[:n]
        return out

    def send(self, data):
        self.sock.sendall(data)
        self.seq = (self.seq + 1) & 0xFFFF
        return self.seq

    def reply(self, seq):
        """The reply to request `seq` (events and replies to nothing of ours are skipped; an error raises)."""
        while True:
            head = self.read(32)
            kind = head[0]
            if kind == 0:
                code, bad_seq = head[1], struct.unpack_from("<H", head, 2)[0]
                if bad_seq == seq:
                    raise XError(f"X error {code} on request {seq}")
                continue
            if kind != 1:
                if self.damage and (kind & 0x7F) == self.damage[1]:
                    self.damaged = True
                continue  # an event: DamageNotify, MappingNotify after a keymap change
            more = struct.unpack_from("<I", head, 4)[0] * 4
            body = self.read(more) if more else bytearray()
            if struct.unpack_from("<H", head, 2)[0] == seq:
                return head, body

    def sync(self):
        """A round trip: everything sent before it has been processed by the server."""
        self.reply(self.send(struct.pack("<BxH", 43, 1)))  # GetInputFocus

    def extension(self, name, event=False):
        pad = (4 - len(name) % 4) % 4
        head, _ = self.reply(self.send(struct.pack("<BxHHxx", 98, 2 + (len(name) + pad) // 4, len(name)) + name + b"\0" * pad))
        if not head[8]:
            return None
        return (head[9], head[10]) if event else head[9]

    def track_damage(self):
        """(major opcode, DamageNotify's code, damage id) watching the root window (level NonEmpty), or None without DAMAGE."""
        ext = self.extension(b"DAMAGE", event=True)
        if ext is None:
            return None
        major, first_event = ext
        self.reply(self.send(struct.pack("<BBHII", major, 0, 3, 1, 1)))  # QueryVersion 1.1: required before any other
        damage = self.id_base | 1
        self.send(struct.pack("<BBHIIBxxx", major, 1, 4, damage, self.root, 3))  # Create, NonEmpty
        self.sync()
        return (major, first_event, damage)

    def settle(self, quiet_ms=50, max_ms=1000):
        """Waits until nothing was drawn for `quiet_ms` (at most `max_ms`): the screenshot after actions shows their result."""
        if not self.damage:
            time.sleep(quiet_ms / 1000)
            return
        major, _, damage = self.damage
        deadline = time.monotonic() + max_ms / 1000
        while True:
            self.damaged = False
            self.send(struct.pack("<BBHIII", major, 3, 4, damage, 0, 0))  # Subtract all: the next drawing notifies again
            self.sync()
            time.sleep(quiet_ms / 1000)
            self.sync()  # reads the DamageNotify of anything drawn meanwhile
            if not self.damaged or time.monotonic() >= deadline:
                return

    def load_keymap(self):
        count = self.max_keycode - self.min_keycode + 1
        head, body = self.reply(self.send(struct.pack("<BxHBBxx", 101, 2, self.min_keycode, count)))
        per = head[1]
        syms = struct.unpack(f"<{count * per}I", bytes(body[: count * per * 4]))
        self.per_keycode = per
        self.keycodes = {}
        self.spare = None
        for i in range(count):
            row = syms[i * per : (i + 1) * per]
            code = self.min_keycode + i
            if not any(row):
                self.spare = code  # the last keycode with nothing on it: where a missing keysym is put
            for level, sym in enumerate(row[:2]):
                if sym and (sym, level) not in self.keycodes.values():
                    self.keycodes.setdefault(sym, (code, level))

    def keycode(self, sym):
        """(keycode, needs shift) for a keysym, binding it to the spare keycode when the keymap has it nowhere."""
        hit = self.keycodes.get(sym)
        if hit:
            return hit[0], hit[1] == 1
        if self.spare is None:
            raise Refused(f"keysym 0x{sym:x} is on no key and no keycode is free")
        per = self.per_keycode
        self.send(struct.pack(f"<BBHBBxx{per}I", 100, 1, 2 + per, self.spare, per, *([sym, sym] + [0] * (per - 2))))
        self.sync()
        time.sleep(0.02)  # clients fetch the new mapping on MappingNotify before the key comes
        for s, v in list(self.keycodes.items()):
            if v[0] == self.spare:
                del self.keycodes[s]
        self.keycodes[sym] = (self.spare, 0)
        return self.spare, False

    def fake(self, kind, detail, x=0, y=0):
        self.send(struct.pack("<BBHBBxxIIIIhhIHBB", self.xtest, 2, 9, kind, detail, 0, self.root if kind == 6 else 0, 0, 0, x, y, 0, 0, 0, 0))

    def move(self, x, y):
        self.fake(6, 0, x, y)

    def button(self, number, down):
        self.fake(4 if down else 5, number)

    def key(self, code, down):
        self.fake(2 if down else 3, code)

    def pointer(self):
        head, _ = self.reply(self.send(struct.pack("<BxHI", 38, 2, self.root)))
        x, y = struct.unpack_from("<hh", head, 16)
        return {"x": x, "y": y}

    def image(self):
        """The root window as BGRX bytes, 4 a pixel, rows of width*4."""
        head, body = self.reply(self.send(struct.pack("<BBHIhhHHI", 73, 2, 5, self.root, 0, 0, self.width, self.height, 0xFFFFFFFF)))
        if len(body) < self.width * self.height * 4:
            raise XError(f"unsupported display format (depth {head[1]}, {len(body)} bytes for {self.width}x{self.height})")
        return body


def png(width, height, rows):
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + row for row in rows)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 1)) + chunk(b"IEND", b"")


def to_rgb(bgrx):
    rgb = bytearray(len(bgrx) // 4 * 3)
    rgb[0::3] = bgrx[2::4]
    rgb[1::3] = bgrx[1::4]
    rgb[2::3] = bgrx[0::4]
    return rgb


def screenshot(d, scale=1.0):
    width, height = d.width, d.height
    pixels = d.image()
    stride = width * 4
    if scale >= 1.0:
        rgb = to_rgb(memoryview(pixels)[: stride * height])
        return png(width, height, [rgb[y * width * 3 : (y + 1) * width * 3] for y in range(height)])
    # Nearest pixel: enough for an overview; the full size is there for detail.
    w, h = max(1, round(width * scale)), max(1, round(height * scale))
    words = memoryview(pixels)[: stride * height].cast("I")
    picks = [min(width - 1, int((x + 0.5) * width / w)) for x in range(w)]
    rows = []
    for y in range(h):
        sy = min(height - 1, int((y + 0.5) * height / h))
        row = words[sy * width : (sy + 1) * width]
        rows.append(to_rgb(array("I", [row[i] for i in picks]).tobytes()))
    return png(w, h, rows)


def point(d, a, i, prefix=""):
    kx, ky = (prefix + "X", prefix + "Y") if prefix else ("x", "y")
    x, y = a.get(kx), a.get(ky)
    if not isinstance(x, int) or not isinstance(y, int) or not (0 <= x < d.width and 0 <= y < d.height):
        raise Refused(f"actions[{i}]: {a.get('type')} at ({x}, {y}) is off the {d.width}x{d.height} screen")
    return x, y


def press(d, syms):
    """Presses keysyms together (modifiers first), releasing them in reverse order."""
    codes = []
    for sym in syms:
        code, shifted = d.keycode(sym)
        if shifted and SHIFT not in syms:
            codes.append(d.keycode(SHIFT)[0])
        codes.append(code)
    for c in codes:
        d.key(c, True)
    for c in reversed(codes):
        d.key(c, False)
    d.sync()


def combination(text, i):
    syms = []
    for part in text.split("+") if text != "+" else ["plus"]:
        sym = KEYSYMS.get(part)
        if sym is None and len(part) == 1:
            sym = char_keysym(part)
        if sym is None:
            raise Refused(f"actions[{i}]: unknown key {part!r}")
        syms.append(sym)
    return syms


def act(d, actions):
    for i, a in enumerate(actions):
        kind = a.get("type")
        button = BUTTONS.get(a.get("button", "left"))
        if button is None:
            raise Refused(f"actions[{i}]: unknown button {a.get('button')!r}")
        if kind == "move":
            d.move(*point(d, a, i))
        elif kind in ("click", "double_click"):
            if "x" in a or "y" in a:
                d.move(*point(d, a, i))
            for n in range(2 if kind == "double_click" else 1):
                if n:
                    d.sync()
                    time.sleep(0.05)
                d.button(button, True)
                d.button(button, False)
        elif kind == "drag":
            start, end = point(d, a, i, "start"), point(d, a, i)
            d.move(*start)
            d.button(button, True)
            d.sync()
            time.sleep(0.03)
            steps = 5  # a few moves between: applications that follow motion see a drag, not a jump
            for s in range(1, steps + 1):
                d.move(start[0] + (end[0] - start[0]) * s // steps, start[1] + (end[1] - start[1]) * s // steps)
            d.sync()
            time.sleep(0.03)
            d.button(button, False)
        elif kind == "scroll":
            direction = SCROLL.get(a.get("direction", "down"))
            amount = a.get("amount", 1)
            if direction is None or not isinstance(amount, int) or not 1 <= amount <= 50:
                raise Refused(f"actions[{i}]: scroll needs a direction (up, down, left, right) and an amount of 1..50")
            if "x" in a or "y" in a:
                d.move(*point(d, a, i))
            for _ in range(amount):
                d.button(direction, True)
                d.button(direction, False)
        elif kind == "type":
            text = a.get("text")
            if not isinstance(text, str):
                raise Refused(f"actions[{i}]: type needs text")
            for ch in text:
                press(d, [char_keysym(ch)])
        elif kind == "key":
            keys = a.get("keys")
            if not isinstance(keys, str) or not keys:
                raise Refused(f"actions[{i}]: key needs keys (a combination such as ctrl+c)")
            press(d, combination(keys, i))
        elif kind == "wait":
            ms = a.get("ms", 0)
            if not isinstance(ms, int) or not 0 <= ms <= 10000:
                raise Refused(f"actions[{i}]: wait needs ms of 0..10000")
            d.sync()
            time.sleep(ms / 1000)
        else:
            raise Refused(f"actions[{i}]: unknown type {kind!r}")
        d.sync()


def answer(d, req, caller_shoots=False):
    """The answer's status line and bytes for one request (`shot <scale>`: the caller adds the screenshot)."""
    if not isinstance(req, dict):
        raise Refused("a request is a JSON object")
    scale = req.get("scale", 1)
    if not isinstance(scale, (int, float)) or not 0.05 <= scale <= 1:
        raise Refused("scale must be within 0.05..1")
    cmd = req.get("cmd")
    if cmd == "screenshot":
        return b"ok", screenshot(d, scale)
    if cmd == "size":
        return b"ok", json.dumps({"width": d.width, "height": d.height}).encode()
    if cmd == "actions":
        actions = req.get("actions")
        if not isinstance(actions, list):
            raise Refused("actions: a list")
        act(d, actions)
        out = {"cursor": d.pointer(), "screenshot": None}
        if req.get("screenshot", True):
            d.settle()
            if caller_shoots:
                return f"shot {scale}".encode(), json.dumps({"cursor": out["cursor"]}).encode()
            out["screenshot"] = base64.b64encode(screenshot(d, scale)).decode()
        return b"ok", json.dumps(out).encode()
    raise Refused(f"unknown cmd {cmd!r}")


class Server(socketserver.TCPServer):
    allow_reuse_address = True
    display = None


class Handler(socketserver.StreamRequestHandler):
    """One request a connection: a JSON line in; `ok` and the answer, or `refused: …` / `error: …`, out."""

    def handle(self):
        line = self.rfile.readline(1 << 24)
        if not line.strip():
            return
        try:
            if self.server.display is None:
                self.server.display = Display()
            req = json.loads(line)
            status, body = answer(self.server.display, req, isinstance(req, dict) and req.get("screenshotBy") == "call")
            self.wfile.write(status + b"\n" + body)
        except Refused as e:
            self.wfile.write(f"refused: {e}\n".encode())
        except (XError, OSError, ValueError, struct.error) as e:
            self.server.display = None  # a broken connection is made again by the next request
            self.wfile.write(f"error: {e}\n".encode())


def main(argv):
    if argv[:1] == ["serve"]:
        port = int(argv[argv.index("--port") + 1]) if "--port" in argv else DEFAULT_PORT
        with Server(("127.0.0.1", port), Handler) as server:
            try:
                server.display = Display()  # now: the display's settings (no autorepeat) hold from the start
            except (XError, OSError) as e:
                print(f"helper: the display is not there yet ({e}); the first request connects", file=sys.stderr)
            server.serve_forever()
        return
    if argv[:1] != ["request"]:
        raise Refused("usage: helper serve [--port P] | helper request < request.json")
    req = json.loads(sys.stdin.buffer.readline() or b"null")
    sys.stdout.buffer.write(answer(Display(), req)[1])


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except Refused as e:
        print(f"refused: {e}", file=sys.stderr)
        sys.exit(2)
    except (XError, OSError, ValueError, struct.error) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
