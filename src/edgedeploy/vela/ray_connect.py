"""Joining a Ray cluster at an address, within a bounded time.

Ray's own ``ray.init(address=...)`` retries a dead address for minutes. Before it is called,
:func:`probe_ray_address` opens a TCP connection to the address (no Ray import) and checks that a gRPC server
answers there (the HTTP/2 connection preface: a Ray cluster's GCS, or a Ray Client server at ``ray://``, answers
it at once with its SETTINGS frame), each step within :func:`connect_timeout` seconds
(``EDGEDEPLOY_RAY_CONNECT_TIMEOUT``, default :data:`DEFAULT_CONNECT_TIMEOUT_S`). Nothing there, or something that
is not a gRPC server, is one :class:`~edgedeploy.errors.ToolFailedError` line naming the address. :func:`bounded_join`
then gives Ray one connection attempt (not Ray's 20 retries), with its gRPC connect timeout a quarter of ours.
"""

from __future__ import annotations

import math
import os
import socket
from contextlib import contextmanager
from typing import Iterator

from edgedeploy.errors import ToolFailedError, UsageError

TIMEOUT_ENV = "EDGEDEPLOY_RAY_CONNECT_TIMEOUT"
DEFAULT_CONNECT_TIMEOUT_S = 20.0
MAX_CONNECT_TIMEOUT_S = 600.0
CLIENT_PREFIX = "ray://"
_SPECIAL = ("auto", "local")  # Ray finds (or starts) a cluster on this machine itself
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + an empty SETTINGS frame
_H2_SETTINGS = 4
_HINT = ("start the cluster there (`ray start --head --port=PORT`) or give the address of a running one "
         "(--ray-address or RAY_ADDRESS), or run with --executor local")  # fmt: skip


def connect_timeout() -> float:
    """Seconds one step of joining a Ray cluster may take: ``EDGEDEPLOY_RAY_CONNECT_TIMEOUT`` (default 20)."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_CONNECT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_CONNECT_TIMEOUT_S:
        raise UsageError(f"{TIMEOUT_ENV}={raw[:40]!r} is not a number of seconds in (0, {MAX_CONNECT_TIMEOUT_S:g}]",
                         f"set it to e.g. {DEFAULT_CONNECT_TIMEOUT_S:g}, or unset it")  # fmt: skip
    return value


def split_address(address: str) -> tuple[str, int] | None:
    """``HOST:PORT``, ``[V6]:PORT`` or ``ray://HOST:PORT`` -> (host, port); None for ``auto``/``local`` (Ray looks
    on this machine itself). Anything else is a :class:`~edgedeploy.errors.UsageError`."""
    text = address.strip()
    if text.lower() in _SPECIAL:
        return None
    rest = text[len(CLIENT_PREFIX) :] if text.lower().startswith(CLIENT_PREFIX) else text
    host, sep, port = rest.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if (not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or len(host) > 253
            or any(c.isspace() or c in "[]/" for c in host)):  # (253: the longest DNS name)
        raise UsageError(f"Ray address {address[:80]!r} is not HOST:PORT, ray://HOST:PORT or auto",
                         "e.g. --ray-address 10.0.0.5:6379 (the head's GCS port)")  # fmt: skip
    return host, int(port)


def probe_ray_address(address: str, source: str, timeout: float | None = None) -> None:
    """Raise :class:`~edgedeploy.errors.ToolFailedError` naming ``address`` (given by ``source``) when nothing
    accepts a connection there, or what does is not a gRPC server, within ``timeout`` seconds a step."""
    where = split_address(address)
    if where is None:
        return
    timeout = connect_timeout() if timeout is None else timeout
    host, port = where
    try:
        conn = socket.create_connection((host, port), timeout=timeout)
    except (socket.gaierror, UnicodeError) as exc:  # (UnicodeError: a name the IDNA codec refuses, e.g. a long label)
        reason = exc.strerror if isinstance(exc, socket.gaierror) else "not a valid host name"
        raise ToolFailedError(f"Ray address {address} ({source}): unknown host {host!r} ({reason})", _HINT) from None
    except TimeoutError:
        raise ToolFailedError(f"nothing answers at Ray address {address} ({source}) within {timeout:g} s "
                              f"({TIMEOUT_ENV})", _HINT) from None  # fmt: skip
    except OSError as exc:
        reason = (exc.strerror or type(exc).__name__).lower()
        raise ToolFailedError(f"nothing answers at Ray address {address} ({source}): {reason}", _HINT) from None
    if os.environ.get("RAY_USE_TLS", "").strip().lower() in ("1", "true"):  # a TLS handshake comes first there
        conn.close()
        return
    with conn:
        try:
            conn.sendall(_H2_PREFACE)
            head = b""
            while len(head) < 9:
                chunk = conn.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
        except TimeoutError:
            raise ToolFailedError(f"Ray address {address} ({source}) accepts a connection but gives no answer within "
                                  f"{timeout:g} s ({TIMEOUT_ENV}): it is not a Ray cluster", _HINT) from None  # fmt: skip
        except OSError as exc:
            head = b""
            if not isinstance(exc, ConnectionResetError):
                raise ToolFailedError(f"Ray address {address} ({source}): {(exc.strerror or str(exc)).lower()}", _HINT) from None
    if len(head) < 9 or head[3] != _H2_SETTINGS:
        raise ToolFailedError(f"Ray address {address} ({source}) answers, but not as a Ray cluster (no gRPC server "
                              "there)", _HINT)  # fmt: skip


_ONE_ATTEMPT = {"RAY_gcs_server_port_wait_time_s": "1"}  # one GCS connection attempt, not 20


@contextmanager
def bounded_join(timeout: float | None = None) -> Iterator[None]:
    """Around ``ray.init(address=...)``: one attempt, a gRPC connect timeout of a quarter of ``timeout`` (at least
    1 s); the user's own settings of these variables win. Ray then gives up after about that twice plus 30 s."""
    timeout = connect_timeout() if timeout is None else timeout
    values = {**_ONE_ATTEMPT, "RAY_gcs_rpc_server_connect_timeout_s": str(max(1, int(timeout // 4)))}
    set_here = [k for k in values if k not in os.environ]
    for key in set_here:
        os.environ[key] = values[key]
    try:
        yield
    finally:
        for key in set_here:
            os.environ.pop(key, None)
