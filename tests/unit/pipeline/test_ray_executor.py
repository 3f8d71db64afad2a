"""Ray start-up: a generous wait for a new local head, and a one-line error when Ray will not start."""

from __future__ import annotations

import os

import pytest

from edgedeploy.errors import ToolFailedError

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'edgedeploy[ray]')")

from edgedeploy.vela.ray_pool import LOCAL_START_WAIT_S, RayExecutor  # noqa: E402

KEY = "RAY_gcs_server_port_wait_time_s"
GCS_TIMEOUT = "Timed out waiting for file /tmp/ray/session_x/gcs_server_port_abc"


def _failing_init(seen):
    def init(**kwargs):
        seen.append((os.environ.get(KEY), kwargs))
        raise RuntimeError(GCS_TIMEOUT)
    return init


def test_local_start_failure_is_one_clear_error(monkeypatch):
    seen = []
    monkeypatch.delenv(KEY, raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", _failing_init(seen))
    with pytest.raises(ToolFailedError) as info:
        RayExecutor(jobs=2)._start()
    err = info.value
    assert err.exit_code == 6
    assert "a local Ray instance" in str(err) and GCS_TIMEOUT in str(err) and "\n" not in str(err)
    assert "--executor local" in err.hint
    # the wait was raised for the start only, with the worker count as Ray's CPU count
    assert seen == [(str(LOCAL_START_WAIT_S), {"include_dashboard": False, "log_to_driver": False,
                                               "logging_level": "ERROR", "num_cpus": 2})]
    assert KEY not in os.environ


@pytest.fixture
def grpc_address():
    """127.0.0.1:PORT where a server answers as a gRPC server does (an HTTP/2 SETTINGS frame), so the address
    passes edgedeploy's check and the join is Ray's."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stop, held = threading.Event(), []

    def serve():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            held.append(conn)
            conn.sendall(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(10)
    for conn in held:
        conn.close()
    listener.close()


def test_users_wait_and_cluster_address_are_kept(monkeypatch, grpc_address):
    seen = []
    monkeypatch.setenv(KEY, "7")
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", _failing_init(seen))
    with pytest.raises(ToolFailedError, match=f"the Ray cluster at {grpc_address}"):
        RayExecutor(address=grpc_address, jobs=2)._start()
    assert seen[0][0] == "7" and seen[0][1]["address"] == grpc_address and "num_cpus" not in seen[0][1]
    assert os.environ[KEY] == "7"


def test_a_cluster_address_gets_one_attempt(monkeypatch, grpc_address):
    seen = []
    monkeypatch.delenv(KEY, raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", _failing_init(seen))
    monkeypatch.setenv("RAY_ADDRESS", grpc_address)
    with pytest.raises(ToolFailedError, match=f"the Ray cluster at {grpc_address}"):
        RayExecutor(jobs=2)._start()
    assert seen[0][0] == "1" and seen[0][1]["address"] == grpc_address  # Ray's 20 retries would take minutes
    assert KEY not in os.environ


def test_palette_sweep_starts_ray_the_same_way(monkeypatch, tmp_path):
    import numpy as np

    from edgedeploy.optimize.palette.sensitivity import run_items

    seen = []
    monkeypatch.delenv(KEY, raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", _failing_init(seen))
    with pytest.raises(ToolFailedError, match="a local Ray instance"):
        run_items([("dense", {"clusters": 4, "sparsity": 0.0})], tmp_path / "m.h5", np.zeros((1, 2)),
                  np.zeros(1), tmp_path, "ray", workers=2)
    assert seen[0][0] == str(LOCAL_START_WAIT_S) and seen[0][1]["num_cpus"] == 2
