"""Request bodies: a size limit on every request, and the sweep spec parsed from YAML or JSON.

Bodies are refused over ``CRITBATCH_MAX_BODY_BYTES`` (413) before a route sees them
(:class:`BodyLimitMiddleware`); a spec body is parsed by :func:`parse_body`, which the submit route
runs on a thread pool of its own (parsing a large body takes CPU seconds).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import yaml
from yaml.composer import ComposerError

from sweeps.errors import InvalidInput
from sweeps.spec import SpecError, SweepSpec, parse_spec

__all__ = ["C_YAML_MAX_BYTES", "JSON_TYPES", "YAML_TYPES", "BodyError", "BodyLimitMiddleware", "parse_body"]

JSON_TYPES = ("application/json",)
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
#: YAML bodies up to this size are parsed with libyaml (fast, but it holds the GIL while it builds
#: the whole document: ~1.8 s per MiB here, which would stall the event loop); larger ones with
#: the pure-Python parser, which yields the GIL every few milliseconds.
C_YAML_MAX_BYTES = 64 * 1024


class BodyLimitMiddleware:
    """Refuse request bodies over ``max_bytes`` with 413, by ``Content-Length`` or by counting
    (400 for a malformed ``Content-Length``); an ASGI middleware around ``app``."""

    def __init__(self, app: Callable[..., Awaitable[None]], max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await self._reply(send, 400, "malformed Content-Length")
                    return
                if declared > self.max_bytes:
                    await self._reply(send, 413, f"request body larger than {self.max_bytes} bytes")
                    return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                await self._reply(send, 413, f"request body larger than {self.max_bytes} bytes")
                return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _reply(send: Callable, status: int, detail: str) -> None:
        payload = json.dumps({"detail": detail}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})


class _NoAliasLoader(yaml.SafeLoader):
    """Safe YAML without anchors and aliases (which can expand a small body into a huge one)."""

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise ComposerError(None, None, "YAML aliases (*name) are not accepted", event.start_mark)
        return super().compose_node(parent, index)


def _load_yaml(text: str) -> Any:
    """Safe YAML without anchors and aliases (libyaml for small bodies, see :data:`C_YAML_MAX_BYTES`).

    Raises:
        yaml.YAMLError: not YAML, or an alias (``*name``).
    """
    if not getattr(yaml, "__with_libyaml__", False) or len(text) > C_YAML_MAX_BYTES:
        return yaml.load(text, Loader=_NoAliasLoader)
    for event in yaml.parse(text, Loader=yaml.CSafeLoader):
        if isinstance(event, yaml.AliasEvent):
            raise ComposerError(None, None, "YAML aliases (*name) are not accepted", event.start_mark)
    return yaml.load(text, Loader=yaml.CSafeLoader)


class BodyError(InvalidInput):
    """A body the service does not read at all; ``status`` is the HTTP status to answer (415)."""

    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(message)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_body(content_type: str | None, body: bytes) -> SweepSpec:
    """The spec in a request body (YAML or JSON by ``Content-Type``).

    Raises:
        BodyError: 415 for another media type.
        SpecError: not parseable, or invalid fields (each named by its path).
    """
    media = (content_type or "").split(";", 1)[0].strip().lower()
    is_json = media in JSON_TYPES or media.endswith("+json")
    if not is_json and media not in YAML_TYPES:
        raise BodyError(415, "send the spec as application/yaml or application/json")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError([("<root>", "the body is not UTF-8 text")]) from None
    if not text.strip():
        raise SpecError([("<root>", "the body is empty: send a sweep spec")])
    try:
        data = json.loads(text, parse_constant=_reject_constant) if is_json else _load_yaml(text)
    except (ValueError, yaml.YAMLError, RecursionError) as exc:
        kind = "JSON" if is_json else "YAML"
        raise SpecError([("<root>", f"not valid {kind}: {str(exc)[:500]}")]) from None
    try:
        return parse_spec(data)
    except RecursionError:
        raise SpecError([("<root>", "the spec is nested too deeply")]) from None
