"""Joining a Ray cluster at an address within a bounded time (edgedeploy.vela.ray_connect), on real local sockets."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from edgedeploy.errors import ToolFailedError, UsageError
from edgedeploy.vela import ray_connect as rc

SETTINGS = bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # what a gRPC server answers the HTTP/2 preface with


class Listener:
    """A TCP server on 127.0.0.1 that answers each connection with ``answer`` (None: says nothing and keeps it
    open; b"": hangs up at once)."""

    def __init__(self, answer: bytes | None) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port, self.answer, self.stop, self.held = self.sock.getsockname()[1], answer, threading.Event(), []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.held.append(conn)
            if self.answer == b"":
                conn.close()
            elif self.answer is not None:
                conn.sendall(self.answer)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        for c in self.held:
            c.close()
        self.sock.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nobody listens once it is closed


@pytest.mark.parametrize(("address", "expected"), [
    ("127.0.0.1:6379", ("127.0.0.1", 6379)),
    ("ray://head.example:10001", ("head.example", 10001)),
    ("[::1]:6379", ("::1", 6379)),
    ("auto", None), ("LOCAL", None),
])  # fmt: skip
def test_split_address(address, expected):
    assert rc.split_address(address) == expected


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.1:", ":6379", "host:0", "host:70000", "host:port", "a b:1"])
def test_an_address_that_is_not_host_port_is_a_usage_error(address):
    with pytest.raises(UsageError, match="is not HOST:PORT, ray://HOST:PORT or auto"):
        rc.split_address(address)


@pytest.mark.parametrize(("answer", "timeout", "expected"), [
    (None, 0.25, "accepts a connection but gives no answer within 0.25 s (EDGEDEPLOY_RAY_CONNECT_TIMEOUT): it is not a Ray cluster"),
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", 5.0, "answers, but not as a Ray cluster (no gRPC server there)"),
    (b"", 5.0, "answers, but not as a Ray cluster (no gRPC server there)"),
])  # fmt: skip
def test_what_answers_at_the_address_is_checked(answer, timeout, expected):
    server = Listener(answer)
    port = server.port
    try:
        start = time.monotonic()
        with pytest.raises(ToolFailedError) as err:
            rc.probe_ray_address(f"127.0.0.1:{port}", "--ray-address", timeout)
        assert time.monotonic() - start < timeout + 2
        assert err.value.one_line().startswith(f"Ray address 127.0.0.1:{port} (--ray-address) {expected}")
    finally:
        server.close()


def test_a_closed_port_is_refused_at_once_and_a_grpc_server_passes():
    port = closed_port()
    start = time.monotonic()
    with pytest.raises(ToolFailedError) as err:
        rc.probe_ray_address(f"127.0.0.1:{port}", "RAY_ADDRESS")
    assert time.monotonic() - start < 2
    assert err.value.one_line().startswith(f"nothing answers at Ray address 127.0.0.1:{port} (RAY_ADDRESS): connection refused. ")
    server = Listener(SETTINGS)
    try:
        rc.probe_ray_address(f"127.0.0.1:{server.port}", "--ray-address", 2.0)  # a gRPC server: Ray's turn
        rc.probe_ray_address(f"ray://127.0.0.1:{server.port}", "--ray-address", 2.0)
    finally:
        server.close()
    rc.probe_ray_address("auto", "RAY_ADDRESS")  # Ray's own look-up on this machine: nothing to probe


@pytest.mark.parametrize(("value", "expected"), [("", 20.0), ("2.5", 2.5), (" 600 ", 600.0)])
def test_connect_timeout(monkeypatch, value, expected):
    monkeypatch.setenv(rc.TIMEOUT_ENV, value)
    assert rc.connect_timeout() == expected


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "601", "soon"])
def test_a_bad_connect_timeout_is_a_usage_error(monkeypatch, value):
    monkeypatch.setenv(rc.TIMEOUT_ENV, value)
    with pytest.raises(UsageError, match=r"EDGEDEPLOY_RAY_CONNECT_TIMEOUT=.* is not a number of seconds in \(0, 600\]"):
        rc.connect_timeout()


def test_bounded_join_gives_ray_one_attempt_and_the_users_settings_win(monkeypatch):
    monkeypatch.delenv("RAY_gcs_server_port_wait_time_s", raising=False)
    monkeypatch.setenv("RAY_gcs_rpc_server_connect_timeout_s", "9")
    with rc.bounded_join(20):
        assert os.environ["RAY_gcs_server_port_wait_time_s"] == "1"
        assert os.environ["RAY_gcs_rpc_server_connect_timeout_s"] == "9"
    assert "RAY_gcs_server_port_wait_time_s" not in os.environ
    assert os.environ["RAY_gcs_rpc_server_connect_timeout_s"] == "9"
    monkeypatch.delenv("RAY_gcs_rpc_server_connect_timeout_s")
    with rc.bounded_join(20):
        assert os.environ["RAY_gcs_rpc_server_connect_timeout_s"] == "5"
    assert "RAY_gcs_rpc_server_connect_timeout_s" not in os.environ
