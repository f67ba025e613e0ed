"""The binding against a real daemon: every request, every codec, leases and errors."""

from __future__ import annotations

import builtins
import json
import socket
import threading
import time

import numpy as np
import pytest
import torch

import statepool
from conftest import SOURCE_DIR, small_layout, uniform_plan

CODECS = [statepool.CodecId.fp32, statepool.CodecId.bf16, statepool.CodecId.fp16,
          statepool.CodecId.int8, statepool.CodecId.int6, statepool.CodecId.int4,
          statepool.CodecId.dsq6, statepool.CodecId.dsq4, statepool.CodecId.stepquant6,
          statepool.CodecId.stepquant4]
# Relative max-abs error after one round trip of a Gaussian state, per codec (loose upper
# bounds; the codecs' own tests pin them down).
BOUND = {"fp32": 0.0, "bf16": 8e-3, "fp16": 1e-3, "int8": 1e-2, "int6": 4e-2, "int4": 0.2,
         "dsq6": 4e-2, "dsq4": 0.2, "stepquant6": 4e-2, "stepquant4": 0.2}


def layout_for(codec: statepool.CodecId) -> statepool.StateLayout:
    fields = dict(num_layers=2, num_heads=3, key_dim=16, value_dim=24)
    plan = None
    if codec in (statepool.CodecId.stepquant6, statepool.CodecId.stepquant4):
        plan = uniform_plan(fields, 6 if codec == statepool.CodecId.stepquant6 else 4)
    return small_layout(codec, plan=plan, name=f"pytest-{codec.name}")


def recurrent(staging: statepool.Staging, info: statepool.LayoutInfo) -> np.ndarray:
    l = info.layout
    return np.asarray(staging.view("float32", (l.num_layers, l.num_heads, l.key_dim,
                                               l.value_dim)))


def test_hello_reports_the_daemon_and_the_lease(conn):
    assert conn.server.startswith("statepoold")
    assert len(conn.lease_token) >= 16
    assert conn.grace_period == pytest.approx(2.0)
    assert conn.healthy and not conn.lease_resumed
    assert conn.max_frame_bytes >= 4096
    assert 0 < conn.ping() < 5


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_park_and_resume_every_codec(conn, codec):
    info = conn.register_layout(layout_for(codec))
    codec_here = statepool.PageCodec(info.layout)
    assert info.page_bytes == codec_here.page_bytes
    assert info.state_bytes_f32 == codec_here.staged_bytes(statepool.DType.f32)
    arena = conn.open_arena(info, 4)
    with conn.open_staging(info.state_bytes_f32) as staging, conn.allocate(arena)[0] as slot:
        state = recurrent(staging, info)
        rng = np.random.default_rng(int(codec.value))
        state[:] = rng.standard_normal(state.shape, dtype=np.float32)
        conv = np.asarray(staging.view("uint8", offset=state.nbytes))
        conv[:] = rng.integers(0, 256, conv.shape, dtype=np.uint8)
        original = np.asarray(staging.view()).copy()
        expected_page = np.zeros(info.page_bytes, np.uint8)
        codec_here.encode(original, statepool.DType.f32, expected_page)

        assert conn.compress(slot, staging) == info.page_bytes
        # The daemon wrote exactly the bytes the same codec writes here.
        assert np.array_equal(np.asarray(arena.page(slot)), expected_page)

        np.asarray(staging.view())[:] = 0
        assert conn.decompress(slot, staging) == info.state_bytes_f32
        restored = np.asarray(staging.view()).copy()
        error = np.abs(recurrent(staging, info) - original[:state.nbytes].view(np.float32)
                       .reshape(state.shape)).max() / np.abs(state).max()
        assert error <= BOUND[codec.name]
        assert np.array_equal(restored[state.nbytes:], original[state.nbytes:])  # conv raw
        # Decoding the page locally gives the daemon's decompress, byte for byte.
        local = np.empty(info.state_bytes_f32, np.uint8)
        arena.decode(slot, local)
        assert np.array_equal(local, restored)
        del state, conv


def test_bfloat16_staging_through_torch(conn):
    info = conn.register_layout(small_layout(statepool.CodecId.int8))
    arena = conn.open_arena(info)
    l = info.layout
    shape = (l.num_layers, l.num_heads, l.key_dim, l.value_dim)
    with conn.open_staging(info.state_bytes_bf16) as staging, conn.allocate(arena)[0] as slot:
        state = torch.from_dlpack(staging.view("bfloat16", shape))
        assert state.dtype == torch.bfloat16
        state.copy_(torch.randn(shape))
        original = state.clone()
        conn.compress(slot, staging, dtype=statepool.DType.bf16)
        state.zero_()
        conn.decompress(slot, staging, dtype=statepool.DType.bf16)
        error = (state.float() - original.float()).abs().max() / original.float().abs().max()
        assert 0 < error < 2e-2
        with pytest.raises(BufferError, match="bfloat16"):
            memoryview(staging.view("bfloat16", shape))
        del state


def test_copy_forks_a_page(conn):
    info = conn.register_layout(small_layout(statepool.CodecId.int6))
    arena = conn.open_arena(info)
    with conn.open_staging(info.state_bytes_f32) as staging:
        src, dst = conn.allocate(arena, 2)
        recurrent(staging, info)[:] = np.random.default_rng(1).standard_normal(
            recurrent(staging, info).shape)
        conn.compress(src, staging)
        conn.copy(src, dst)
        assert np.array_equal(np.asarray(arena.page(src)), np.asarray(arena.page(dst)))
        assert conn.free([src, dst]) == 2
        assert not src.valid and not dst.valid


def test_slots_are_freed_by_with_free_and_garbage_collection(conn):
    info = conn.register_layout(small_layout(statepool.CodecId.int4))
    arena = conn.open_arena(info, 4)

    def used() -> int:
        return next(a.pages_used for a in conn.stats().arenas if a.arena_id == arena.id)

    base = used()
    with conn.allocate(arena)[0] as slot:
        assert used() == base + 1 and slot.valid
    assert used() == base and not slot.valid
    slots = conn.allocate(arena, 3)
    assert used() == base + 3
    slots[0].free()
    del slots  # garbage collection frees the other two
    assert used() == base
    with pytest.raises(statepool.PoolExhausted, match="requested"):
        conn.allocate(arena, arena.page_count + 1)
    assert used() == base  # all or none


def test_a_released_slot_comes_back_with_the_lease(daemon):
    info_state = None
    first = daemon.connect()
    token = first.lease_token
    info = first.register_layout(small_layout(statepool.CodecId.int8))
    arena = first.open_arena(info)
    staging = first.open_staging(info.state_bytes_f32)
    recurrent(staging, info)[:] = 0.5
    slot = first.allocate(arena)[0]
    first.compress(slot, staging)
    arena_id, slot_id = slot.arena_id, slot.release()
    info_state = np.asarray(arena.page(slot_id)).copy()
    del slot, staging
    first.close()
    with pytest.raises(statepool.TransportError) as closed:
        first.ping()
    assert closed.value.kind == "closed"

    with daemon.connect(lease_token=token) as second:
        assert second.lease_resumed and second.resumed_slots == 1
        again = second.adopt(arena_id, slot_id)
        arena2 = second.open_arena(info.id)
        assert np.array_equal(np.asarray(arena2.page(again)), info_state)
        again.free()


def test_connect_fd_takes_over_a_connected_socket(daemon):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(daemon.socket)
    with statepool.connect_fd(sock.detach(), tenant="team-a") as conn:
        assert conn.ping() > 0


def test_stats_fits_and_planning(conn):
    info = conn.register_layout(small_layout(statepool.CodecId.int8, num_heads=5))
    arena = conn.open_arena(info, 4)
    stats = conn.stats()
    entry = next(a for a in stats.arenas if a.arena_id == arena.id)
    assert entry.tenant == "team-a" and entry.codec == statepool.CodecId.int8
    assert entry.pages_total == 4 and entry.backend == "host"
    assert stats.pool_capacity_bytes == 64 << 20
    assert any(t.tenant == "team-a" and t.reserved_bytes >= entry.bytes_total
               for t in stats.tenants)

    fits = conn.fits_now(info, codecs=[statepool.CodecId.int8, statepool.CodecId.fp32])
    assert fits.tenant == "team-a" and fits.quota_free_bytes is None
    by_codec = {f.codec: f for f in fits.codecs}
    int8, fp32 = by_codec[statepool.CodecId.int8], by_codec[statepool.CodecId.fp32]
    assert (int8.arena_free_pages, int8.requests, int8.limited_by) == (4, 4, "arena")
    assert int8.page_stride < fp32.page_stride
    # No fp32 arena of this shape yet: what a new one could take from the free pool.
    assert fp32.limited_by == "pool"
    assert fp32.requests == fits.pool_free_bytes // fp32.page_stride

    config = (SOURCE_DIR / "docs/models/qwen3-next-80b-a3b-instruct.json").read_text()
    plan = conn.plan_capacity(config, context=4096, codecs=[statepool.CodecId.stepquant6])
    assert plan["model"]["linear_layers"] == 36
    assert [c["codec"] for c in plan["codecs"]] == ["stepquant6"]
    assert "fits_now" in plan
    with pytest.raises(statepool.InvalidArgument):
        conn.plan_capacity("{not json")


def test_daemon_refusals_are_typed(daemon, conn):
    with pytest.raises(statepool.UnknownTenant) as unknown:
        daemon.connect(tenant="nobody")
    assert unknown.value.status == statepool.Status.unknown_tenant
    assert isinstance(unknown.value, statepool.DaemonError)
    assert not isinstance(unknown.value, builtins.ConnectionError)

    big = statepool.StateLayout(num_layers=4, num_heads=8, key_dim=64, value_dim=64,
                                codec=statepool.CodecId.fp32, name="too-big-for-small")
    with daemon.connect(tenant="small") as small:
        info = small.register_layout(big)
        with pytest.raises(statepool.QuotaExceeded, match="quota"):
            small.open_arena(info, 64)

    with pytest.raises(statepool.NotFound):
        conn.open_arena(999999)
    with pytest.raises(statepool.InvalidArgument):
        conn.open_staging(0)


def test_not_finite_state_leaves_the_page_unchanged(conn):
    info = conn.register_layout(small_layout(statepool.CodecId.int8))
    arena = conn.open_arena(info)
    with conn.open_staging(info.state_bytes_f32) as staging, conn.allocate(arena)[0] as slot:
        state = recurrent(staging, info)
        state[:] = 1.0
        conn.compress(slot, staging)
        before = np.asarray(arena.page(slot)).copy()
        state[1, 2, 3, 4] = np.nan
        with pytest.raises(statepool.NotFinite, match="layer 1 head 2") as error:
            conn.compress(slot, staging)
        assert error.value.status == statepool.Status.not_finite
        assert np.array_equal(np.asarray(arena.page(slot)), before)
        # The same check runs when encoding here.
        with pytest.raises(statepool.NotFinite):
            statepool.PageCodec(info.layout).encode(np.asarray(staging.view()),
                                                    statepool.DType.f32,
                                                    np.zeros(info.page_bytes, np.uint8))
        del state


def test_transport_errors_are_distinct(tmp_path):
    with pytest.raises(statepool.TransportError) as error:
        statepool.connect(str(tmp_path / "nothing.sock"), timeout=1)
    assert error.value.kind == "connect_failed"
    assert isinstance(error.value, builtins.ConnectionError)
    assert not isinstance(error.value, statepool.DaemonError)


def test_blocking_calls_release_the_gil(tmp_path):
    """A connect that waits 1.5 s for a Hello reply lets other Python threads run."""
    path = str(tmp_path / "silent.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)  # accepts (in the kernel) and never answers
    outcome = {}

    def call():
        try:
            statepool.connect(path, timeout=1.5)
        except statepool.TransportError as e:
            outcome["kind"] = e.kind

    worker = threading.Thread(target=call)
    ticks = 0
    started = time.monotonic()
    worker.start()
    while worker.is_alive():
        ticks += 1
        time.sleep(0.001)
    elapsed = time.monotonic() - started
    worker.join()
    server.close()
    assert outcome["kind"] == "timed_out"
    assert elapsed >= 1.4
    # With the GIL held for the whole call this thread would not have run at all.
    assert ticks > 100


def test_threads_share_one_connection(conn):
    info = conn.register_layout(small_layout(statepool.CodecId.int8))
    arena = conn.open_arena(info, 8)
    threads, errors = 4, []
    staging = conn.open_staging(info.state_bytes_f32 * threads)
    slots = conn.allocate(arena, threads)
    floats = info.state_bytes_f32 // 4

    def work(i: int):
        try:
            view = np.asarray(staging.view("float32", floats, offset=i * info.state_bytes_f32))
            for round_ in range(20):
                view[: floats - info.layout.conv_channels] = i + round_ / 8
                conn.compress(slots[i], staging, offset=i * info.state_bytes_f32)
                view[:] = 0
                conn.decompress(slots[i], staging, offset=i * info.state_bytes_f32)
                recurrent_part = view[: (floats * 4 - 96) // 4]
                assert np.allclose(recurrent_part, i + round_ / 8, rtol=1e-2)
        except Exception as e:  # reported below
            errors.append(e)

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert errors == []
    conn.free(slots)


def test_nominal_plan_parks_stepquant_before_calibration(conn):
    base = small_layout(statepool.CodecId.fp32, num_heads=8, num_layers=9, name="nominal")
    plan = statepool.Plan.nominal(base, 6)  # 72 heads: one FP16 pivot (1.39%)
    assert (plan.budget_bits, plan.units, plan.pivots) == (6, 72, 1)
    assert plan.widths[0] == 16 and set(plan.widths[1:]) == {6}
    info = conn.register_layout(base.with_codec(statepool.CodecId.stepquant6, plan))
    assert info.layout.plan.digest == plan.digest
    assert info.page_bytes < statepool.PageCodec(base).page_bytes / 3
    with pytest.raises(ValueError, match="4 or 6"):
        statepool.Plan.nominal(base, 5)


def test_close_while_another_thread_waits_on_the_daemon(tmp_path):
    """close() drops the handle's reference only: the call in flight finishes."""
    import os
    import signal as signals

    from conftest import Daemon
    d = Daemon(tmp_path)
    try:
        conn = d.connect()
        outcome = {}

        def waiting_call():
            try:
                outcome["stats"] = conn.stats()
            except statepool.StatepoolError as e:
                outcome["error"] = e

        os.kill(d.process.pid, signals.SIGSTOP)
        worker = threading.Thread(target=waiting_call)
        worker.start()
        time.sleep(0.3)  # the request is sent; the reply cannot come
        conn.close()
        with pytest.raises(statepool.TransportError) as closed:
            conn.ping()
        assert closed.value.kind == "closed" and not conn.healthy
        os.kill(d.process.pid, signals.SIGCONT)
        worker.join(10)
        assert not worker.is_alive()
        assert "stats" in outcome, outcome  # answered on the connection it started on
    finally:
        os.kill(d.process.pid, signals.SIGCONT)
        assert d.stop() == 0, d.log()


def test_interpreter_exit_with_a_thread_inside_a_call(daemon):
    """A daemon thread in a GIL-released call while the program exits: a clean exit 0."""
    import subprocess
    import sys
    code = (
        "import threading, statepool\n"
        f"conn = statepool.connect({daemon.socket!r}, tenant='team-a')\n"
        "info = conn.register_layout(statepool.StateLayout(num_layers=1, num_heads=1,\n"
        "                                                  key_dim=8, value_dim=8))\n"
        "arena = conn.open_arena(info, 2)\n"
        "def loop():\n"
        "    while True:\n"
        "        conn.ping()\n"
        "        conn.allocate(arena, 1)  # dropped at once: a slot freed by its destructor\n"
        "threading.Thread(target=loop, daemon=True).start()\n"
        "import time; time.sleep(0.2)\n")
    for _ in range(5):
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0, result.stderr


def test_timeouts_in_seconds(tmp_path):
    with pytest.raises(ValueError, match="nan"):
        statepool.connect(str(tmp_path / "x.sock"), timeout=float("nan"))
    path = str(tmp_path / "silent.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    started = time.monotonic()
    with pytest.raises(statepool.TransportError) as error:
        statepool.connect(path, timeout=0.0009)  # rounds up to 1 ms, never to "forever"
    assert error.value.kind == "timed_out" and time.monotonic() - started < 5
    server.close()


def test_the_package_exports_every_error_class():
    import statepool.errors as errors
    classes = {name for name, value in vars(errors).items()
               if isinstance(value, type) and issubclass(value, errors.StatepoolError)}
    assert classes == set(errors.__all__)
    assert classes <= set(statepool.__all__)
    assert all(getattr(statepool, name) is getattr(errors, name) for name in classes)
