"""The SDK's HTTP core over urllib: the base URL and token, JSON in and out, the error envelope as AgentVMError."""

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, Iterator, Mapping, Optional, Union

from .errors import AgentVMError

Body = Union[bytes, bytearray, memoryview, Iterator[bytes], Any]


class Http:
    def __init__(self, base_url: str, token: Optional[str], timeout: Optional[float], headers: Optional[Mapping[str, str]] = None):
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.headers = dict(headers or {})

    def url(self, path: str, query: Optional[Mapping[str, Any]] = None) -> str:
        q = {k: _query_value(v) for k, v in (query or {}).items() if v is not None}
        return self.base_url + path + ("?" + urllib.parse.urlencode(q) if q else "")

    def auth_headers(self, extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        h = dict(self.headers)
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        h.update(extra or {})
        return h

    def open(
        self,
        method: str,
        path: str,
        *,
        query: Optional[Mapping[str, Any]] = None,
        json_body: Any = None,
        body: Optional[Body] = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
        url: Optional[str] = None,
        check: bool = True,
    ):
        """A call whose answer is checked: the open response (read it, close it) or AgentVMError for anything not 2xx
        (``check=False``: the response whatever its status)."""
        h = self.auth_headers(headers)
        data = body
        if json_body is not None:
            data = json.dumps(json_body).encode()
            h["Content-Type"] = "application/json"
        elif data is None and method in ("POST", "PUT", "PATCH"):
            data = b""
        request = urllib.request.Request(url or self.url(path, query), data=data, headers=h, method=method)
        try:
            return urllib.request.urlopen(request, timeout=timeout if timeout is not None else self.timeout)
        except urllib.error.HTTPError as e:
            if not check:
                return e
            with e:
                raise AgentVMError.from_body(e.code, e.read()) from None
        except urllib.error.URLError as e:
            raise AgentVMError("unreachable", f"cannot reach {self.base_url} ({e.reason})") from e
        except (ConnectionError, TimeoutError) as e:
            raise AgentVMError("unreachable", f"cannot reach {self.base_url} ({e})") from e

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        """A call answered with JSON (an empty answer is None)."""
        headers = {"Accept": "application/json", **(kwargs.pop("headers", None) or {})}
        with self.open(method, path, headers=headers, **kwargs) as response:
            raw = response.read()
        return json.loads(raw) if raw else None


def _query_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)
