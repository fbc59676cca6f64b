"""The AgentVM client: agents (exec, files, fetch, hibernate, checkpoint, reset), background processes and warm pools."""

import base64
import json
import os
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, BinaryIO, Dict, Iterator, List, Mapping, Optional, Sequence, Union

from .errors import AgentVMError
from .http import Http

DEFAULT_BASE_URL = "http://127.0.0.1:8080"

Command = Union[str, Sequence[str]]


@dataclass
class ExecResult:
    """A finished command; ``ok`` is an exit code of 0. Each stream is capped at 1 MiB (``truncated``); ``stdout`` and
    ``stderr`` are text, or base64 when the call asked ``encoding="base64"``."""

    exit_code: Optional[int]
    signal: Optional[str]
    timed_out: bool
    stdout: str
    stderr: str
    truncated: bool
    duration_ms: float
    error: Optional[str] = None
    """Why the command could not start (exit code 127), or None."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass
class ExecExit:
    """How a streamed command ended."""

    exit_code: Optional[int]
    signal: Optional[str]
    timed_out: bool
    duration_ms: float


@dataclass
class ExecEvent:
    """One event of ``exec_stream``: ``kind`` is ``stdout``, ``stderr``, ``error`` (it could not start: an exit 127
    follows) or ``exit``; ``data`` the text (or base64) of an output event or the error, ``exit`` the end on the last one."""

    kind: str
    data: str = ""
    exit: Optional[ExecExit] = None


def _exit_of(d: Mapping[str, Any]) -> ExecExit:
    return ExecExit(d.get("exitCode"), d.get("signal"), bool(d.get("timedOut")), d.get("durationMs", 0))


def _exec_body(cmd: Command, cwd, env, user, stdin, timeout_ms, encoding, **extra) -> Dict[str, Any]:
    body: Dict[str, Any] = {"cmd": cmd if isinstance(cmd, str) else list(cmd), **extra}
    if cwd is not None:
        body["cwd"] = cwd
    if env is not None:
        body["env"] = dict(env)
    if user is not None:
        body["user"] = str(user)
    if timeout_ms is not None:
        body["timeoutMs"] = int(timeout_ms)
    if encoding is not None:
        body["encoding"] = encoding
    if stdin is not None:
        if isinstance(stdin, str):
            body["stdin"] = stdin
        else:
            body["stdin"] = base64.b64encode(bytes(stdin)).decode()
            body["stdinEncoding"] = "base64"
    return body


def _q(s: Union[str, int]) -> str:
    return urllib.parse.quote(str(s), safe="")


class Process:
    """A process started with ``spawn``: it runs on in the agent (through hibernation) until it exits."""

    def __init__(self, http: Http, agent_id: str, info: Dict[str, Any]):
        self._http = http
        self.agent_id = agent_id
        self.pid: int = info["pid"]
        self.info = info

    def _path(self, tail: str = "") -> str:
        return f"/v1/agents/{_q(self.agent_id)}/processes/{self.pid}{tail}"

    def refresh(self) -> Dict[str, Any]:
        self.info = self._http.json("GET", self._path())
        return self.info

    def wait(self, timeout_ms: Optional[int] = None) -> Dict[str, Any]:
        """Waits until it exits, or ``timeout_ms`` passed (then its state as it is: check ``state``)."""
        body = {"timeoutMs": timeout_ms} if timeout_ms is not None else {}
        timeout = None if timeout_ms is None else timeout_ms / 1000 + 30
        self.info = self._http.json("POST", self._path("/wait"), json_body=body, timeout=timeout)
        return self.info

    def write(self, data: Union[str, bytes], eof: bool = False) -> None:
        """Writes to its standard input; ``eof`` closes it after."""
        body: Dict[str, Any] = {"data": data} if isinstance(data, str) else {"data": base64.b64encode(data).decode(), "encoding": "base64"}
        if eof:
            body["eof"] = True
        self._http.json("POST", self._path("/stdin"), json_body=body)

    def close_stdin(self) -> None:
        self.write("", eof=True)

    def kill(self, signal: Union[str, int] = "TERM") -> None:
        self._http.json("POST", self._path("/signal"), json_body={"signal": signal})

    def output(self, stream: str = "stdout", offset: int = 0, limit: Optional[int] = None) -> Dict[str, Any]:
        """A page of its output from ``offset``: ``{data, encoding, offset, nextOffset, dropped, eof}``."""
        return self._http.json("GET", self._path("/output"), query={"stream": stream, "offset": offset, "limit": limit})

    def text(self, stream: str = "stdout") -> str:
        """All of a stream's output so far as text (pages followed)."""
        offset, parts = 0, []
        while True:
            page = self.output(stream, offset)
            data = page["data"]
            parts.append(base64.b64decode(data).decode("utf-8", "replace") if page.get("encoding") == "base64" else data)
            if page.get("eof") or page["nextOffset"] == offset:
                return "".join(parts)
            offset = page["nextOffset"]


class Files:
    """An agent's files: paths are absolute inside its root (the image's filesystem)."""

    def __init__(self, http: Http, agent_id: str):
        self._http = http
        self._path = f"/v1/agents/{_q(agent_id)}/files"

    def open(self, path: str):
        """A file's bytes as an open response (``read()`` it in pieces, close it); mode and owner in its headers."""
        return self._http.open("GET", self._path, query={"path": path}, headers={"Accept": "application/octet-stream"})

    def read(self, path: str) -> bytes:
        with self.open(path) as r:
            if r.headers.get("content-type", "").startswith("application/json") and "x-file-mode" not in r.headers:
                raise AgentVMError("bad_request", f"{path} is a directory: use files.list", None, 400)
            return r.read()

    def read_text(self, path: str) -> str:
        return self.read(path).decode("utf-8")

    def write(
        self,
        path: str,
        data: Union[str, bytes, BinaryIO, Iterator[bytes]],
        mode: Optional[int] = None,
        uid: Optional[int] = None,
        gid: Optional[int] = None,
        mkdirs: bool = False,
    ) -> Dict[str, Any]:
        """Writes a file whole (a reader never sees half of it); ``data`` may be a file object or an iterator of bytes,
        sent as read (chunked), never held whole."""
        body = data.encode() if isinstance(data, str) else data
        query = {"path": path, "mode": None if mode is None else format(mode, "04o"), "uid": uid, "gid": gid, "mkdirs": True if mkdirs else None}
        return self._http.json("PUT", self._path, query=query, body=body, headers={"Content-Type": "application/octet-stream"})

    def list(self, path: str) -> List[Dict[str, Any]]:
        """A directory's entries: ``[{name, type, size, mode, uid, gid, modifiedAt}]``."""
        with self._http.open("GET", self._path, query={"path": path}, headers={"Accept": "application/json"}) as r:
            if not r.headers.get("content-type", "").startswith("application/json"):
                raise AgentVMError("bad_request", f"{path} is not a directory", None, 400)
            return json.loads(r.read())["entries"]

    def remove(self, path: str, recursive: bool = False) -> None:
        self._http.open("DELETE", self._path, query={"path": path, "recursive": True if recursive else None}).close()

    def download_tar(self, path: str):
        """A file or tree as a tar (ustar), an open response to read (``tarfile.open(fileobj=r, mode="r|")``)."""
        return self._http.open("GET", self._path, query={"path": path}, headers={"Accept": "application/x-tar"})

    def upload_tar(self, path: str, tar: Union[bytes, BinaryIO, Iterator[bytes]]) -> Dict[str, Any]:
        """A tar extracted under the directory ``path`` (made); answers ``{path, entries}``."""
        return self._http.json("PUT", self._path, query={"path": path}, body=tar, headers={"Content-Type": "application/x-tar"})


class Agent:
    """An agent: its ``id`` and what the API last said of it (``info``; ``refresh()`` asks again)."""

    def __init__(self, http: Http, agent_id: str, info: Optional[Dict[str, Any]] = None, pool_id: Optional[str] = None):
        self._http = http
        self.id = agent_id
        self.info = info
        self.pool_id = pool_id
        self.files = Files(http, agent_id)

    def __repr__(self) -> str:
        return f"Agent({self.id!r})"

    def _path(self, tail: str = "") -> str:
        return f"/v1/agents/{_q(self.id)}{tail}"

    @property
    def url(self) -> str:
        """Where the agent's own server is called."""
        return f"{self._http.base_url}/a/{_q(self.id)}/"

    def refresh(self) -> Dict[str, Any]:
        self.info = self._http.json("GET", self._path())
        return self.info

    def exec(
        self,
        cmd: Command,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: Optional[Union[str, int]] = None,
        stdin: Optional[Union[str, bytes]] = None,
        timeout_ms: Optional[int] = None,
        encoding: Optional[str] = None,
    ) -> ExecResult:
        """Runs a command to its end (waking the agent if it sleeps). A string runs under ``/bin/sh -c``."""
        body = _exec_body(cmd, cwd, env, user, stdin, timeout_ms, encoding)
        r = self._http.json("POST", self._path("/exec"), json_body=body, timeout=self._call_timeout(timeout_ms))
        return ExecResult(
            r["exitCode"], r.get("signal"), bool(r.get("timedOut")), r["stdout"], r["stderr"], bool(r.get("truncated")), r.get("durationMs", 0), r.get("error")
        )

    def exec_stream(
        self,
        cmd: Command,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: Optional[Union[str, int]] = None,
        stdin: Optional[Union[str, bytes]] = None,
        timeout_ms: Optional[int] = None,
        encoding: Optional[str] = None,
    ) -> Iterator[ExecEvent]:
        """Runs a command and yields its output as it happens (``stdout``, ``stderr`` events), the ``exit`` last.
        Leaving the loop early (or ``close()`` on the generator) closes the connection, and the command with it."""
        body = _exec_body(cmd, cwd, env, user, stdin, timeout_ms, encoding)
        response = self._http.open("POST", self._path("/exec"), json_body=body, headers={"Accept": "application/x-ndjson"}, timeout=self._call_timeout(timeout_ms))
        with response:
            for line in response:
                if not line.strip():
                    continue
                event = json.loads(line)
                if isinstance(event.get("error"), dict):
                    raise AgentVMError.from_body(502, line)
                if "error" in event:
                    yield ExecEvent("error", event["error"])
                    continue
                if "exit" in event:
                    yield ExecEvent("exit", exit=_exit_of(event["exit"]))
                    return
                for kind in ("stdout", "stderr"):
                    if kind in event:
                        yield ExecEvent(kind, event[kind])
        raise AgentVMError("stream_ended", "the exec stream ended before the command's exit", None, 502)

    def spawn(
        self,
        cmd: Command,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: Optional[Union[str, int]] = None,
        stdin: Optional[Union[str, bytes, bool]] = None,
        timeout_ms: Optional[int] = None,
    ) -> Process:
        """Starts a command in the background: it runs on (through hibernation and wake) until it exits. Its stdin
        stays open for ``Process.write`` when ``stdin`` is given (``True``: open, nothing written yet); without it
        stdin is /dev/null."""
        if isinstance(stdin, bool):
            stdin = "" if stdin else None
        body = _exec_body(cmd, cwd, env, user, stdin, timeout_ms, None, background=True)
        return Process(self._http, self.id, self._http.json("POST", self._path("/exec"), json_body=body))

    def processes(self) -> List[Process]:
        return [Process(self._http, self.id, p) for p in self._http.json("GET", self._path("/processes"))["processes"]]

    def process(self, pid: int) -> Process:
        return Process(self._http, self.id, self._http.json("GET", self._path(f"/processes/{int(pid)}")))

    def fetch(self, path: str = "/", method: str = "GET", body: Optional[bytes] = None, headers: Optional[Mapping[str, str]] = None):
        """A call to the agent's own server (``path`` under its URL), with the token; it wakes the agent like any call.
        Answers the open response whatever its status (``status``, ``headers``, ``read()``; close it, or use ``with``)."""
        url = f"{self._http.base_url}/a/{_q(self.id)}/{path.lstrip('/')}"
        return self._http.open(method, "", url=url, body=body, headers=headers, check=False)

    def screenshot(self, scale: Optional[float] = None) -> bytes:
        """A desktop agent's screen as PNG bytes (waking it), ``scale`` 0.1..1 of the display's size."""
        query = {"scale": scale} if scale is not None else None
        with self._http.open("GET", self._path("/desktop/screenshot"), query=query, headers={"Accept": "image/png"}) as r:
            return r.read()

    def act(self, actions: List[Dict[str, Any]], screenshot: Optional[bool] = None, scale: Optional[float] = None) -> Dict[str, Any]:
        """Runs input actions on a desktop agent's screen, in order (at most 50): ``{cursor, display, screenshot, durationMs}``,
        ``screenshot`` the screen after them as base64 PNG (None with ``screenshot=False``)."""
        body: Dict[str, Any] = {"actions": list(actions)}
        if screenshot is not None:
            body["screenshot"] = screenshot
        if scale is not None:
            body["scale"] = scale
        return self._http.json("POST", self._path("/desktop/actions"), json_body=body)

    def viewers(self) -> List[Dict[str, Any]]:
        """Who is watching a desktop agent's screen through the viewer, and who holds control: ``[{id, mode, actor, since}]``."""
        return self._http.json("GET", self._path("/desktop/viewers"))["viewers"]

    def wake(self) -> Dict[str, Any]:
        return self._http.json("POST", self._path("/wake"))

    def hibernate(self) -> Dict[str, Any]:
        """Snapshots it now; it wakes on its next call or exec."""
        return self._http.json("POST", self._path("/hibernate"))

    def lease(self, ttl_ms: int) -> Dict[str, Any]:
        return self._http.json("POST", self._path("/leases"), json_body={"ttlMs": ttl_ms})

    def checkpoint(self, name: Optional[str] = None) -> Dict[str, Any]:
        """A checkpoint of it as it is now (forks and pools start from one): ``{id: "ckp_…", …}``."""
        return self._http.json("POST", self._path("/checkpoints"), json_body={"name": name} if name is not None else {})

    def reset(self) -> Dict[str, Any]:
        """Rolls it back to the checkpoint it was forked from: ``{agent, checkpointId, resetMs}``."""
        r = self._http.json("POST", self._path("/reset"))
        self.info = r["agent"]
        return r

    def release(self) -> Dict[str, Any]:
        """Gives it back to the pool it was acquired from (reset there first): ``{agent, resetMs}``."""
        pool_id = self.pool_id or ((self.info or {}).get("pool") or {}).get("id")
        if not pool_id:
            raise AgentVMError("bad_request", f"agent {self.id} is in no pool", None, 400)
        r = self._http.json("POST", f"/v1/pools/{_q(pool_id)}/release", json_body={"agentId": self.id})
        self.info = r["agent"]
        return r

    def delete(self) -> None:
        self._http.json("DELETE", self._path())

    def _call_timeout(self, timeout_ms: Optional[int]) -> Optional[float]:
        """The socket's timeout for a call that lasts as long as its command (a wake first, then the command)."""
        if self._http.timeout is None:
            return None
        return max(self._http.timeout, (timeout_ms or 60_000) / 1000 + self._http.timeout)


class Pool:
    """A warm pool: forks of one checkpoint kept ready."""

    def __init__(self, http: Http, info: Dict[str, Any]):
        self._http = http
        self.id: str = info["id"]
        self.info = info

    def __repr__(self) -> str:
        return f"Pool({self.id!r})"

    def acquire(self, wait_ms: Optional[int] = None) -> Agent:
        """An agent for you alone; the pool tops itself up behind it. At its maxSize with none ready but some being made
        ready, the API waits for one (``wait_ms``, else its default of 10 s, at most 60 s per call); with every agent
        handed out it answers 409 ``pool_exhausted`` at once. With ``wait_ms`` the call asks again (every 50–500 ms)
        until one is ready (a release, a top-up's fork) or the time is up, then raises that error."""
        deadline = time.monotonic() + (wait_ms or 0) / 1000
        pause = 0.05
        while True:
            server_wait_ms = 10_000 if wait_ms is None else min(60_000, max(0, int((deadline - time.monotonic()) * 1000)))
            query = None if wait_ms is None else {"waitMs": server_wait_ms}
            # The call lasts as long as the gateway waits: the client's timeout is stretched to cover it.
            timeout = None if self._http.timeout is None else max(self._http.timeout, server_wait_ms / 1000 + 30)
            try:
                r = self._http.json("POST", f"/v1/pools/{_q(self.id)}/acquire", query=query, timeout=timeout)
                return Agent(self._http, r["agent"]["id"], r["agent"], self.id)
            except AgentVMError as e:
                if e.code != "pool_exhausted" or time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 0.5)

    def resize(self, size: Optional[int] = None, max_size: Optional[int] = None) -> Dict[str, Any]:
        """Changes how many ready agents the pool keeps (more: forked now; fewer: the surplus ready ones deleted, never
        handed-out ones) and how many it may hold in all; answers the pool, as ``info`` now is."""
        body: Dict[str, Any] = {}
        if size is not None:
            body["size"] = size
        if max_size is not None:
            body["maxSize"] = max_size
        self.info = self._http.json("PATCH", f"/v1/pools/{_q(self.id)}", json_body=body)
        return self.info

    def release(self, agent: Union[Agent, str]) -> Dict[str, Any]:
        """Gives an agent back: it is reset to the pool's checkpoint and ready for the next acquire: ``{agent, resetMs}``."""
        agent_id = agent.id if isinstance(agent, Agent) else agent
        return self._http.json("POST", f"/v1/pools/{_q(self.id)}/release", json_body={"agentId": agent_id})

    def refresh(self) -> Dict[str, Any]:
        self.info = self._http.json("GET", f"/v1/pools/{_q(self.id)}")
        return self.info

    def delete(self) -> Dict[str, Any]:
        """Deletes the pool and its ready agents (handed-out ones are left to their holders)."""
        return self._http.json("DELETE", f"/v1/pools/{_q(self.id)}")


class Pools:
    def __init__(self, http: Http):
        self._http = http

    def create(self, size: int, from_checkpoint: Optional[str] = None, image: Optional[str] = None, max_size: Optional[int] = None, name: Optional[str] = None) -> Pool:
        body: Dict[str, Any] = {"size": size}
        for key, value in (("fromCheckpoint", from_checkpoint), ("image", image), ("maxSize", max_size), ("name", name)):
            if value is not None:
                body[key] = value
        return Pool(self._http, self._http.json("POST", "/v1/pools", json_body=body))

    def get(self, pool_id: str) -> Pool:
        return Pool(self._http, self._http.json("GET", f"/v1/pools/{_q(pool_id)}"))

    def list(self) -> List[Pool]:
        return [Pool(self._http, p) for p in self._http.json("GET", "/v1/pools")["pools"]]


class Agents:
    def __init__(self, http: Http):
        self._http = http

    def create(self, **fields: Any) -> Agent:
        """Creates an agent (it sleeps until its first call or exec). Fields as the API names them, in snake_case or
        camelCase: ``name``, ``image``, ``vcpus``, ``mem_mib``, ``disk_mib``, ``idle_timeout_ms``, ``public``,
        ``allow_egress``, ``from_checkpoint`` (a fork)…"""
        info = self._http.json("POST", "/v1/agents", json_body={_camel(k): v for k, v in fields.items() if v is not None})
        return Agent(self._http, info["id"], info)

    def get(self, agent_id: str) -> Agent:
        agent = Agent(self._http, agent_id)
        agent.refresh()
        return agent

    def connect(self, agent_id: str) -> Agent:
        """A handle on an agent by id, without a call."""
        return Agent(self._http, agent_id)

    def list(self, name_prefix: Optional[str] = None, image: Optional[str] = None, state: Optional[str] = None) -> Iterator[Agent]:
        """Every agent (pages followed), oldest first."""
        cursor = None
        while True:
            page = self._http.json("GET", "/v1/agents", query={"namePrefix": name_prefix, "image": image, "state": state, "limit": 200, "cursor": cursor})
            for a in page["agents"]:
                yield Agent(self._http, a["id"], a)
            cursor = page.get("nextCursor")
            if not cursor:
                return


_special = {"mem_mib": "memMiB", "disk_mib": "diskMiB"}


def _camel(name: str) -> str:
    if name in _special:
        return _special[name]
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


class AgentVM:
    """A client of one gateway: ``AgentVM(base_url, token)``, each defaulting to ``AGENTVM_URL`` / ``AGENTVM_TOKEN``
    (the URL then to ``http://127.0.0.1:8080``). ``timeout`` is each call's socket timeout in seconds (an exec's
    grows with its command's)."""

    def __init__(self, base_url: Optional[str] = None, token: Optional[str] = None, timeout: Optional[float] = 300.0, headers: Optional[Mapping[str, str]] = None):
        self.http = Http(base_url or os.environ.get("AGENTVM_URL") or DEFAULT_BASE_URL, token or os.environ.get("AGENTVM_TOKEN") or None, timeout, headers)
        self.base_url = self.http.base_url
        self.agents = Agents(self.http)
        self.pools = Pools(self.http)

    @classmethod
    def create(cls, base_url: Optional[str] = None, token: Optional[str] = None, **fields: Any) -> Agent:
        """Creates an agent with a client from the arguments (or the environment): ``AgentVM.create(image="demo")``."""
        return cls(base_url, token).agents.create(**fields)


__all__ = ["AgentVM", "Agent", "Agents", "Files", "Process", "Pool", "Pools", "ExecResult", "ExecEvent", "ExecExit", "DEFAULT_BASE_URL"]
