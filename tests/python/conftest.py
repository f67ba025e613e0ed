"""Fixtures of the Python binding's tests: a real statepoold per test module.

The daemon binary comes from $STATEPOOL_DAEMON (ctest sets it) or build/service/statepoold.
Each module gets its own daemon on a socket in a temporary directory, with two tenants (``small`` has a
4 MiB quota) and a short grace period; it is stopped with SIGTERM afterwards, and a daemon
that did not exit cleanly fails the test that used it last.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import time

import pytest

import statepool

SOURCE_DIR = pathlib.Path(os.environ.get("STATEPOOL_SOURCE_DIR",
                                         pathlib.Path(__file__).resolve().parents[2]))


class Daemon:
    """A statepoold process and how to reach it."""

    def __init__(self, tmp: pathlib.Path, extra: list[str] | None = None,
                 pool_capacity: str = "64MiB") -> None:
        binary = os.environ.get("STATEPOOL_DAEMON", str(SOURCE_DIR / "build/service/statepoold"))
        self.socket = str(tmp / "statepool.sock")
        self.log_path = tmp / "statepoold.log"
        args = [binary, "--socket", self.socket, "--metrics-address", "off",
                "--api-address", "off", "--pool-capacity", pool_capacity, "--arena-pages", "8",
                "--grace-period", "2s", "--workers", "2",
                "--tenant", "team-a", "--tenant", "small:4MiB"] + (extra or [])
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                statepool.connect(self.socket, tenant="team-a", timeout=2).close()
                return
            except statepool.TransportError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("statepoold did not start:\n" + self.log())
                time.sleep(0.05)

    def connect(self, tenant: str = "team-a", **kwargs) -> statepool.Connection:
        return statepool.connect(self.socket, tenant=tenant, **kwargs)

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode


def pytest_sessionfinish(session, exitstatus):
    """With $STATEPOOL_PYTEST_ALL_SKIPPED_EXIT set, a run whose tests all skipped exits with
    that code, so that ctest reports it as skipped rather than passed (the GPU tests)."""
    code = os.environ.get("STATEPOOL_PYTEST_ALL_SKIPPED_EXIT")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if code and exitstatus == 0 and reporter is not None:
        if reporter.stats.get("skipped") and not reporter.stats.get("passed"):
            session.exitstatus = int(code)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("statepoold"))
    yield d
    code = d.stop()
    assert code == 0, f"statepoold exited with {code}:\n{d.log()}"


@pytest.fixture
def conn(daemon):
    with daemon.connect() as c:
        yield c


def small_layout(codec=statepool.CodecId.int8, **overrides) -> statepool.StateLayout:
    """A small GDN layout: 2 layers x 3 heads of 16 x 24, conv 8 x 3 in bf16."""
    fields = dict(arch=statepool.Arch.gdn, num_layers=2, num_heads=3, key_dim=16,
                  value_dim=24, conv_channels=8, conv_width=3, codec=codec, name="pytest")
    fields.update(overrides)
    return statepool.StateLayout(**fields)


def uniform_plan(layout_fields: dict, budget_bits: int = 6, pivots: int = 1) -> statepool.Plan:
    """A valid STEPQuant plan: every unit at the budget, the first ``pivots`` units FP16."""
    arch = layout_fields.get("arch", statepool.Arch.gdn)
    layers, heads = layout_fields["num_layers"], layout_fields["num_heads"]
    k = layout_fields["key_dim"]
    units = layers * heads * (k if arch == statepool.Arch.kda else 1)
    widths = [16] * pivots + [budget_bits] * (units - pivots)
    impact = [1.0 + 0.01 * (i % 7) for i in range(layers * heads * k)]
    return statepool.Plan(arch=arch, num_layers=layers, num_heads=heads, key_dim=k,
                          value_dim=layout_fields["value_dim"], budget_bits=budget_bits,
                          widths=widths, impact=impact, source="pytest")
