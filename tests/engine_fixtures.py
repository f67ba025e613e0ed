"""statepoold fixtures shared by the engine integrations' suites (tests/sglang, tests/vllm): each
conftest loads this file (it is not on their import path) and re-exports what its tests use.

``Daemon`` is tests/python/conftest.py's; ``start_daemon`` gives it a larger pool and arena cap,
``kill_daemon`` and ``stop_daemon_process`` take it down the hard ways, ``serve`` yields a
running daemon and fails unless it exited cleanly, ``daemon`` is one per test module and
``redis_server`` one redis-server per test module (skipped without it).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import time
from typing import Iterator, List, Optional

import pytest

SOURCE_DIR = pathlib.Path(os.environ.get("STATEPOOL_SOURCE_DIR",
                                         pathlib.Path(__file__).resolve().parents[1]))

# tests/python/conftest.py under another module name: its Daemon class, not its fixtures.
_spec = importlib.util.spec_from_file_location("statepool_python_conftest",
                                               SOURCE_DIR / "tests/python/conftest.py")
python_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(python_conftest)
Daemon = python_conftest.Daemon

POOL_CAPACITY = "512MiB"


def start_daemon(tmp: pathlib.Path, extra: Optional[List[str]] = None,
                 pool_capacity: str = POOL_CAPACITY) -> "Daemon":
    tmp.mkdir(parents=True, exist_ok=True)
    return Daemon(tmp, extra=(extra or []) + ["--max-arena-pages", "1048576"],
                  pool_capacity=pool_capacity)


def kill_daemon(d: "Daemon") -> None:
    """SIGKILL: no drain, the socket file stays behind."""
    d.process.send_signal(signal.SIGKILL)
    d.process.wait()
    d._log.close()


def stop_daemon_process(d: "Daemon", timeout: float = 10) -> None:
    """SIGSTOP, then wait until every thread of the daemon is really stopped (state T in
    /proc/PID/task/*/stat): a signal is delivered asynchronously, and a request sent before
    that would still be answered."""
    d.process.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    tasks = f"/proc/{d.process.pid}/task"
    while True:
        states = []
        for tid in os.listdir(tasks):
            try:
                with open(f"{tasks}/{tid}/stat") as f:
                    stat = f.read()
            except FileNotFoundError:  # a thread that ended meanwhile
                continue
            states.append(stat[stat.rindex(")") + 2])  # the field after "(comm)"
        if states and all(state in "Tt" for state in states):
            return
        assert time.monotonic() < deadline, f"statepoold did not stop: {states}"
        time.sleep(0.005)


def serve(d: "Daemon") -> Iterator["Daemon"]:
    """A fixture's body: yields the daemon, then stops it; one that did not exit cleanly fails
    the test that used it last."""
    yield d
    code = d.stop()
    assert code == 0, f"statepoold exited with {code}:\n{d.log()}"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    yield from serve(start_daemon(tmp_path_factory.mktemp("statepoold")))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    """A redis-server on a free local port (no persistence): its ``redis://`` URL."""
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not os.path.exists(binary):
        pytest.skip("redis-server is not installed (scripts/deps --test installs it)")
    port = free_port()
    tmp = tmp_path_factory.mktemp("redis")
    log = open(tmp / "redis.log", "w")
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp)],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("redis-server did not start:\n"
                                   + (tmp / "redis.log").read_text())
            time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=10)
    log.close()
