"""The Python SDK against a small fake gateway over a real socket: the requests it sends, the answers it reads, errors."""

import json
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from agentvm import AgentVM, AgentVMError

seen = []


class Fake(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _json(self, status, value):
        raw = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _handle(self):
        body = self._body()
        url = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        seen.append({"method": self.command, "path": url.path, "query": q, "headers": dict(self.headers), "body": body})
        p = url.path
        if self.headers.get("Authorization") != "Bearer tok":
            return self._json(401, {"error": {"code": "unauthorized", "message": "no valid token", "requestId": "req_1"}})
        if p == "/v1/agents" and self.command == "POST":
            return self._json(201, {"id": "agt_new", "state": "creating"})
        if p == "/v1/agents/agt_gone":
            return self._json(404, {"error": {"code": "not_found", "message": "agent agt_gone not found", "requestId": "req_2"}})
        if p == "/v1/agents/agt_1/exec":
            spec = json.loads(body)
            if spec.get("background"):
                return self._json(201, {"pid": 7, "cmd": ["sleep", "1"], "state": "running"})
            if self.headers.get("Accept") == "application/x-ndjson":
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson")
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(b'{"stdout":"a"}\n')
                self.wfile.flush()
                time.sleep(0.02)
                self.wfile.write(b'{"stderr":"b"}\n{"exit":{"exitCode":null,"signal":"KILL","timedOut":true,"durationMs":9}}\n')
                self.close_connection = True
                return None
            return self._json(200, {"exitCode": 2, "signal": None, "timedOut": False, "stdout": "o", "stderr": "e", "truncated": False, "durationMs": 4})
        if p == "/v1/agents/agt_1/files" and self.command == "PUT":
            return self._json(201, {"path": q["path"], "size": len(body), "mode": q.get("mode"), "uid": 0, "gid": 0})
        if p == "/v1/agents/agt_1/files" and self.command == "GET":
            if q["path"] == "/dir":
                return self._json(200, {"path": "/dir", "entries": [{"name": "f", "type": "file", "size": 1}]})
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("x-file-mode", "0644")
            self.send_header("Content-Length", "3")
            self.end_headers()
            self.wfile.write(b"\x00\x01\xff")
            return None
        if p == "/v1/agents/agt_1/files" and self.command == "DELETE":
            self.send_response(204)
            self.end_headers()
            return None
        if p == "/a/agt_1/missing":
            return self._json(404, {"nope": True})
        if p == "/v1/pools/pol_1/acquire":
            return self._json(200, {"agent": {"id": "agt_p"}, "pool": "pol_1"})
        if p == "/v1/pools/pol_1" and self.command == "PATCH":
            return self._json(200, {"id": "pol_1", **json.loads(body)})
        if p == "/v1/pools/pol_1/release":
            return self._json(200, {"agent": {"id": json.loads(body)["agentId"]}})
        return self._json(502, "upstream gone")

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = ThreadingHTTPServer(("127.0.0.1", 0), Fake)
        threading.Thread(target=cls.server.serve_forever, daemon=True).start()
        cls.base = f"http://127.0.0.1:{cls.server.server_address[1]}"

    @classmethod
    def tearDownClass(cls):
        cls.server.shutdown()
        cls.server.server_close()

    def client(self):
        return AgentVM(self.base + "/", "tok")

    def test_create_sends_camel_case_json_with_the_token(self):
        agent = self.client().agents.create(name="x", mem_mib=256, idle_timeout_ms=1000)
        self.assertEqual(agent.id, "agt_new")
        self.assertEqual(json.loads(seen[-1]["body"]), {"name": "x", "memMiB": 256, "idleTimeoutMs": 1000})
        self.assertEqual(agent.url, f"{self.base}/a/agt_new/")

    def test_errors_carry_the_envelope(self):
        with self.assertRaises(AgentVMError) as caught:
            self.client().agents.get("agt_gone")
        e = caught.exception
        self.assertEqual((e.code, e.message, e.request_id, e.status), ("not_found", "agent agt_gone not found", "req_2", 404))
        self.assertEqual(str(e), "not_found: agent agt_gone not found (request req_2)")
        with self.assertRaises(AgentVMError) as caught:
            AgentVM(self.base, "").agents.create()
        self.assertEqual(caught.exception.code, "unauthorized")
        with self.assertRaises(AgentVMError) as caught:
            self.client().pools.list()
        self.assertEqual(caught.exception.code, "http_502")
        with self.assertRaises(AgentVMError) as caught:
            AgentVM("http://127.0.0.1:1", "tok").agents.create()
        self.assertEqual(caught.exception.code, "unreachable")

    def test_exec_answers_a_result(self):
        r = self.client().agents.connect("agt_1").exec(["ls", "-l"], cwd="/tmp", env={"A": "1"}, user=1000, stdin=b"\x01\x02", timeout_ms=500)
        self.assertEqual((r.exit_code, r.stdout, r.stderr, r.ok), (2, "o", "e", False))
        self.assertEqual(
            json.loads(seen[-1]["body"]),
            {"cmd": ["ls", "-l"], "cwd": "/tmp", "env": {"A": "1"}, "user": "1000", "timeoutMs": 500, "stdin": "AQI=", "stdinEncoding": "base64"},
        )

    def test_exec_stream_is_an_iterator_of_events(self):
        events = list(self.client().agents.connect("agt_1").exec_stream("echo a; echo b >&2"))
        self.assertEqual([(e.kind, e.data) for e in events[:2]], [("stdout", "a"), ("stderr", "b")])
        self.assertEqual(events[2].kind, "exit")
        self.assertEqual((events[2].exit.signal, events[2].exit.timed_out), ("KILL", True))
        self.assertEqual(seen[-1]["headers"]["Accept"], "application/x-ndjson")

    def test_spawn(self):
        proc = self.client().agents.connect("agt_1").spawn(["sleep", "1"])
        self.assertEqual(proc.pid, 7)
        self.assertTrue(json.loads(seen[-1]["body"])["background"])

    def test_files(self):
        files = self.client().agents.connect("agt_1").files
        written = files.write("/a/b", iter([b"ab", b"c"]), mode=0o600, mkdirs=True)
        self.assertEqual((written["size"], seen[-1]["query"]), (3, {"path": "/a/b", "mode": "0600", "mkdirs": "true"}))
        self.assertEqual(files.write("/t", "héllo")["size"], len("héllo".encode()))
        self.assertEqual(files.read("/f"), b"\x00\x01\xff")
        self.assertEqual(files.list("/dir")[0]["name"], "f")
        files.remove("/dir", recursive=True)
        self.assertEqual((seen[-1]["method"], seen[-1]["query"]), ("DELETE", {"path": "/dir", "recursive": "true"}))

    def test_fetch_answers_any_status(self):
        with self.client().agents.connect("agt_1").fetch("/missing") as r:
            self.assertEqual(r.status, 404)
            self.assertEqual(json.loads(r.read()), {"nope": True})

    def test_pools(self):
        from agentvm.client import Pool

        pool = Pool(self.client().http, {"id": "pol_1"})
        agent = pool.acquire()
        self.assertEqual((agent.id, agent.pool_id), ("agt_p", "pol_1"))
        self.assertEqual(seen[-1]["query"], {})
        pool.acquire(wait_ms=2500)
        self.assertLessEqual(int(seen[-1]["query"]["waitMs"]), 2500)
        self.assertGreater(int(seen[-1]["query"]["waitMs"]), 2000)
        self.assertEqual(agent.release()["agent"]["id"], "agt_p")
        self.assertEqual(pool.resize(size=3, max_size=5), {"id": "pol_1", "size": 3, "maxSize": 5})
        self.assertEqual((seen[-1]["method"], json.loads(seen[-1]["body"])), ("PATCH", {"size": 3, "maxSize": 5}))
        self.assertEqual(pool.info["size"], 3)


if __name__ == "__main__":
    unittest.main()
