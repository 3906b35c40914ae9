"""Whether a given Ray address answers, found out within a bounded time before ``ray.init`` connects to it.

``ray.init(address=...)`` (Ray 2.60) retries its GCS connection for about five minutes, printing only
Ray's own "Failed to connect to GCS" lines, before it gives up. A dead or wrong address must fail in
seconds, with one message that names the address and what was tried, before anything of a sweep exists.
:func:`probe_ray_address` tries, within ``timeout_s`` in all:

1. a TCP connection to ``HOST:PORT`` (refused: nothing listens there; no answer: the host or a
   firewall drops it);
2. the HTTP/2 greeting every gRPC server answers (Ray's GCS and its client server are gRPC): the
   client preface and an empty SETTINGS frame, answered by the server's SETTINGS frame. An HTTP/1
   answer is another service (most often the dashboard's job server, ``http://HEAD:8265``, given where
   the GCS address ``HEAD:6379`` belongs); no answer is a stopped or hung process. Skipped under
   ``RAY_USE_TLS`` (the server then expects TLS first).

Only then does :func:`sweeps.launch.cluster.init_ray` call ``ray.init``, with one GCS attempt instead of
Ray's twenty (``RAY_gcs_server_port_wait_time_s=1`` for that call, unless set already): a gRPC server
that is not a GCS then fails in Ray's own per-attempt time (about 40 s with Ray's defaults), not in five
minutes.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from typing import NoReturn
from urllib.parse import urlsplit

from sweeps.errors import CritbatchError, InvalidInput
from sweeps.settings import Settings

__all__ = [
    "CONNECT_TIMEOUT_ENV",
    "DEFAULT_CONNECT_TIMEOUT_S",
    "RayUnreachable",
    "probe_ray_address",
    "ray_connect_timeout_s",
]

#: How long a given Ray address may take to answer when neither ``--connect-timeout-s`` nor
#: :data:`CONNECT_TIMEOUT_ENV` says otherwise (seconds).
DEFAULT_CONNECT_TIMEOUT_S = 30.0
#: The environment variable that sets the connect timeout (seconds) of every command that reaches Ray.
CONNECT_TIMEOUT_ENV = "CRITBATCH_RAY_CONNECT_TIMEOUT_S"

#: HTTP/2's client connection preface followed by an empty SETTINGS frame (RFC 9113, 3.4 and 6.5).
_H2_GREETING = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_H2_SETTINGS = 0x04
#: Ray Client's default port (``ray://HOST`` without one).
_RAY_CLIENT_PORT = 10001


class RayUnreachable(CritbatchError):
    """A given Ray address did not answer as a Ray cluster within the connect timeout; nothing was started.

    Attributes:
        address: the address as given.
    """

    def __init__(self, address: str, message: str):
        self.address = address
        super().__init__(message)


def ray_connect_timeout_s(given: float | None = None, settings: Settings | None = None) -> float:
    """The connect timeout in seconds: ``given`` (``--connect-timeout-s``), else :data:`CONNECT_TIMEOUT_ENV`
    (``settings.ray_connect_timeout_s``; default settings: from the environment), else
    :data:`DEFAULT_CONNECT_TIMEOUT_S`.

    Raises:
        InvalidInput: the value is not a positive, finite number (the message names the flag or the variable).
    """
    if given is None:  # the variable is checked by Settings.from_env, with the same messages
        from_env = (settings or Settings.from_env()).ray_connect_timeout_s
        return DEFAULT_CONNECT_TIMEOUT_S if from_env is None else from_env
    try:
        value = float(given)
    except ValueError:
        raise InvalidInput(f"--connect-timeout-s={given!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise InvalidInput(f"--connect-timeout-s must be a positive number of seconds, got {given!r}")
    return value


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``HOST:PORT``, ``ray://HOST[:PORT]`` or ``[IPv6]:PORT``; None for what Ray resolves
    itself (``auto``, ``local``) or cannot parse (Ray's own error then says so)."""
    scheme, _, rest = address.rpartition("://")
    try:
        parts = urlsplit("//" + rest)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if port is None and scheme == "ray":
        port = _RAY_CLIENT_PORT
    return (host, port) if host and port else None


def probe_ray_address(address: str, timeout_s: float) -> None:
    """Check, within ``timeout_s`` seconds in all, that ``address`` accepts a TCP connection and answers as a
    gRPC server (see the module's docstring); nothing is sent beyond HTTP/2's greeting. ``auto``, ``local``
    and addresses Ray must parse itself are not probed.

    Raises:
        RayUnreachable: the connection was refused, or did not open, or the other end did not answer, or
            answered as something other than gRPC; the message names the address and what was tried.
    """
    hp = _host_port(address)
    if hp is None:
        return
    host, port = hp
    deadline = time.monotonic() + timeout_s
    tried = f"TCP connect to {host}:{port}"
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except TimeoutError:
        _fail(
            address, f"{tried}: no answer within {timeout_s:g} s (a host that is down, or a firewall)", timed_out=True
        )
    except OSError as exc:
        refused = exc.errno == errno.ECONNREFUSED
        why = "refused (nothing listens there)" if refused else (exc.strerror or type(exc).__name__)
        _fail(address, f"{tried}: {why}")
    with sock:
        if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
            return  # a TLS cluster expects a TLS greeting: the TCP connection is all that is checked
        tried += ", then HTTP/2's greeting (Ray's GCS speaks gRPC)"
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.sendall(_H2_GREETING)
            answer = b""
            while len(answer) < 4:  # a frame header's first 4 bytes: its length and type
                chunk = sock.recv(9 - len(answer))
                if not chunk:
                    break
                answer += chunk
        except TimeoutError:
            _fail(
                address,
                f"{tried}: the connection opened but nothing answered within {timeout_s:g} s "
                "(a stopped or hung process)",
                timed_out=True,
            )
        except OSError as exc:
            _fail(address, f"{tried}: the connection broke ({exc.strerror or type(exc).__name__})")
    if len(answer) >= 4 and answer[3] == _H2_SETTINGS:
        return
    if answer.startswith((b"HTTP/", b"<")):  # a status line, or (to an HTTP/2.0 request line) an HTML page
        _fail(
            address,
            f"{tried}: an HTTP/1 server answered, not Ray's GCS (the dashboard's job server? "
            "`critbatch run --address` takes the GCS address, HEAD:6379 by default; `critbatch submit` "
            "takes the job server, http://HEAD:8265)",
        )
    what = f"it answered {answer[:16]!r}" if answer else "it closed the connection without answering"
    _fail(address, f"{tried}: {what}, which no gRPC server does")


def _fail(address: str, tried: str, *, timed_out: bool = False) -> NoReturn:
    """Raise :class:`RayUnreachable` for ``address`` with what was ``tried`` (and, after a wait, how to wait longer)."""
    wait = f"; wait longer with --connect-timeout-s or {CONNECT_TIMEOUT_ENV}" if timed_out else ""
    raise RayUnreachable(
        address,
        f"cannot reach a Ray cluster at {address}: {tried}. Nothing was started. Check "
        f"--address (or RAY_ADDRESS) and that the cluster is up (`ray status --address {address}`)" + wait,
    )
