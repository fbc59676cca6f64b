"""The Python SDK against a real gateway (AGENTVM_SDK_LIVE=1 with AGENTVM_URL and AGENTVM_TOKEN; npm test runs it through
test/e2e/sdk.test.ts): an agent of the demo image, exec, files both ways, tar, hibernate and exec waking it, a
checkpoint, a fork reset to it, a pool's acquire and release. Skipped without AGENTVM_SDK_LIVE."""

import io
import os
import tarfile
import time
import unittest

from agentvm import AgentVM, AgentVMError

LIVE = os.environ.get("AGENTVM_SDK_LIVE") == "1"


@unittest.skipUnless(LIVE, "set AGENTVM_SDK_LIVE=1, AGENTVM_URL and AGENTVM_TOKEN to run against a gateway")
class LiveTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.client = AgentVM()
        cls.agent = cls.client.agents.create(name="py-sdk", idle_timeout_ms=600_000)

    @classmethod
    def tearDownClass(cls):
        try:
            cls.agent.delete()
        except AgentVMError:
            pass

    def test_1_exec(self):
        r = self.agent.exec(["echo", "hello from python"])
        self.assertEqual((r.exit_code, r.stdout, r.ok), (0, "hello from python\n", True))
        r = self.agent.exec("echo out; echo err >&2; exit 3")
        self.assertEqual((r.exit_code, r.stdout, r.stderr, r.ok), (3, "out\n", "err\n", False))
        r = self.agent.exec(["cat"], stdin=b"bytes in\x00\xff")
        self.assertEqual(r.stdout.encode("utf-8", "surrogateescape")[:9], b"bytes in\x00")
        r = self.agent.exec("pwd; echo $GREETING", cwd="/tmp", env={"GREETING": "hi"})
        self.assertEqual(r.stdout, "/tmp\nhi\n")
        events = list(self.agent.exec_stream("echo one; echo two >&2; echo three; exit 5"))
        out = "".join(e.data for e in events if e.kind == "stdout")
        err = "".join(e.data for e in events if e.kind == "stderr")
        self.assertEqual((out, err), ("one\nthree\n", "two\n"))
        self.assertEqual(events[-1].kind, "exit")
        self.assertEqual(events[-1].exit.exit_code, 5)

    def test_1b_background(self):
        proc = self.agent.spawn("echo started; read line; echo got $line; sleep 600", stdin=True)
        self.assertEqual(proc.info["state"], "running")
        proc.write("hello\n")
        out = ""
        for _ in range(100):
            out = proc.text()
            if "got hello" in out:
                break
            time.sleep(0.1)
        self.assertEqual(out, "started\ngot hello\n")
        self.assertIn(proc.pid, [p.pid for p in self.agent.processes()])
        self.assertEqual(proc.wait(timeout_ms=100)["state"], "running")
        proc.kill("TERM")
        info = proc.wait(timeout_ms=10_000)
        self.assertEqual((info["state"], info["signal"]), ("exited", "TERM"))

    def test_2_files(self):
        files = self.agent.files
        data = bytes(range(256)) * 1000
        written = files.write("/tmp/py-sdk/deep/blob.bin", data, mode=0o640, mkdirs=True)
        self.assertEqual(written["size"], len(data))
        self.assertEqual(files.read("/tmp/py-sdk/deep/blob.bin"), data)
        names = {e["name"]: e for e in files.list("/tmp/py-sdk/deep")}
        self.assertEqual(names["blob.bin"]["size"], len(data))
        self.assertEqual(self.agent.exec("stat -c %a /tmp/py-sdk/deep/blob.bin").stdout.strip(), "640")
        # Streamed from a file object, chunked.
        files.write("/tmp/py-sdk/stream.txt", io.BytesIO(b"streamed\n"))
        self.assertEqual(files.read_text("/tmp/py-sdk/stream.txt"), "streamed\n")
        # A tree up as tar and down again.
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for name, body in (("a.txt", b"A"), ("sub/b.txt", b"BB")):
                info = tarfile.TarInfo(name)
                info.size = len(body)
                info.mode = 0o600
                tar.addfile(info, io.BytesIO(body))
        self.assertGreaterEqual(files.upload_tar("/tmp/py-sdk/tree", buf.getvalue())["entries"], 2)
        self.assertEqual(self.agent.exec("cat /tmp/py-sdk/tree/a.txt /tmp/py-sdk/tree/sub/b.txt").stdout, "ABB")
        with files.download_tar("/tmp/py-sdk/tree") as r, tarfile.open(fileobj=r, mode="r|") as tar:
            got = {m.name.lstrip("./"): tar.extractfile(m).read() for m in tar if m.isfile()}
        self.assertIn(b"BB", got.values())
        files.remove("/tmp/py-sdk", recursive=True)
        with self.assertRaises(AgentVMError) as caught:
            files.read("/tmp/py-sdk/stream.txt")
        self.assertEqual(caught.exception.code, "not_found")
        with self.assertRaises(AgentVMError) as caught:
            files.read("relative/path")
        self.assertEqual((caught.exception.code, caught.exception.status), ("bad_request", 400))
        self.assertTrue(caught.exception.request_id.startswith("req_"))

    def test_3_hibernate_then_exec_wakes_it(self):
        self.agent.exec("echo kept > /tmp/py-kept")
        self.assertEqual(self.agent.hibernate()["state"], "hibernated")
        self.assertEqual(self.agent.exec("cat /tmp/py-kept").stdout, "kept\n")
        self.assertEqual(self.agent.refresh()["state"], "running")
        with self.agent.fetch("/counter", method="POST") as r:
            self.assertEqual(r.status, 200)

    def test_4_checkpoint_fork_reset_and_a_pool(self):
        self.agent.exec("echo clean > /tmp/py-state")
        ckp = self.agent.checkpoint("py-clean")
        self.assertTrue(ckp["id"].startswith("ckp_"))
        fork = self.client.agents.create(from_checkpoint=ckp["id"], idle_timeout_ms=600_000)
        try:
            self.assertEqual(fork.exec("cat /tmp/py-state").stdout, "clean\n")
            fork.exec("echo dirty > /tmp/py-state; touch /tmp/py-episode")
            reset = fork.reset()
            self.assertEqual(reset["checkpointId"], ckp["id"])
            self.assertEqual(fork.exec("cat /tmp/py-state; ls /tmp/py-episode 2>/dev/null || echo gone").stdout, "clean\ngone\n")
        finally:
            fork.delete()
        pool = self.client.pools.create(from_checkpoint=ckp["id"], size=1, max_size=2, name="py-pool")
        try:
            first = pool.acquire()
            self.assertEqual(first.pool_id, pool.id)
            first.exec("touch /tmp/py-episode")
            second = pool.acquire(wait_ms=60_000)  # the top-up may be forking the second one
            self.assertNotEqual(first.id, second.id)
            self.assertGreaterEqual(first.release()["resetMs"], 0)
            pool.release(second)
            again = pool.acquire(wait_ms=60_000)
            self.assertEqual(again.exec("ls /tmp/py-episode 2>/dev/null || echo gone").stdout, "gone\n")
            pool.release(again)
        finally:
            pool.delete()

    def test_5_errors(self):
        with self.assertRaises(AgentVMError) as caught:
            self.client.agents.connect("agt_doesnotexist").exec(["true"])
        self.assertEqual((caught.exception.code, caught.exception.status), ("not_found", 404))


if __name__ == "__main__":
    unittest.main()
