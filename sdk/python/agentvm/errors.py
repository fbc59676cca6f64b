"""The one error the SDK raises: the API's error envelope (code, message, request id), or what kept the call from an answer."""

import json
from typing import Any, Optional


class AgentVMError(Exception):
    """A failed call: the envelope's ``code`` (``not_found``, ``forbidden_path``, ``pool_exhausted``…), ``message``,
    ``request_id``, and the HTTP ``status`` (0: no answer)."""

    def __init__(self, code: str, message: str, request_id: Optional[str] = None, status: int = 0, details: Any = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id
        self.status = status
        self.details = details

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" + (f" (request {self.request_id})" if self.request_id else "")

    def __repr__(self) -> str:
        return f"AgentVMError({self.code!r}, {self.message!r}, request_id={self.request_id!r}, status={self.status})"

    @classmethod
    def from_body(cls, status: int, raw: bytes) -> "AgentVMError":
        """The error of an answer's body: the envelope when it is one, else ``http_<status>`` with the body's start."""
        text = raw.decode("utf-8", "replace")
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict) and isinstance(err.get("code"), str) and isinstance(err.get("message"), str):
            return cls(err["code"], err["message"], err.get("requestId"), status, err.get("details"))
        text = text.strip()
        return cls(f"http_{status}", (text[:300] + "…" if len(text) > 300 else text) or "(empty body)", None, status)
