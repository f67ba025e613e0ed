"""The calls of the C++ client the other modules leave out, against a real daemon:
install_plan, the *_async calls and Pending (on the host backend: replies when the work is
done, no event), the by-id overloads of allocate, put_snapshot and get_snapshot, and what the
CUDA names do without a device arena (in every build, with or without CUDA)."""

from __future__ import annotations

import numpy as np
import pytest

import statepool
from conftest import small_layout, uniform_plan

FIELDS = dict(num_layers=2, num_heads=3, key_dim=16, value_dim=24)


def random_state(info: statepool.LayoutInfo, seed: int) -> np.ndarray:
    """A staged float32 state: a Gaussian recurrent part and a bf16 conv part of 0.5s."""
    l = info.layout
    state = np.zeros(info.state_bytes_f32 // 4, np.float32)
    n = l.num_layers * l.num_heads * l.key_dim * l.value_dim
    state[:n] = np.random.default_rng(seed).standard_normal(n)
    state.view(np.uint16)[2 * n:] = 0x3F00  # bf16 0.5
    return state


def test_install_plan_is_idempotent_and_names_the_plan(conn):
    plan = uniform_plan(FIELDS, budget_bits=6, pivots=1)
    first = conn.install_plan(plan)
    assert first.created and first.digest == plan.digest
    assert (first.units, first.pivots) == (plan.units, plan.pivots) == (6, 1)
    assert first.average_bits == pytest.approx(plan.average_width) == pytest.approx(46 / 6)
    again = conn.install_plan(plan)
    assert not again.created and again.digest == first.digest

    # The daemon has it: a layout naming it registers, and its pages park with it.
    layout = small_layout(statepool.CodecId.stepquant6, plan=plan, name="pytest-installed")
    info = conn.register_layout(layout)
    assert info.layout.plan.digest == plan.digest
    assert info.page_bytes == statepool.PageCodec(layout).page_bytes
    other = conn.install_plan(uniform_plan(FIELDS, budget_bits=4, pivots=0))
    assert other.created and other.digest != plan.digest and other.pivots == 0
    assert other.average_bits == pytest.approx(4)


def test_async_calls_on_the_host_backend(conn):
    info = conn.register_layout(small_layout(statepool.CodecId.int8, name="pytest-async"))
    arena = conn.open_arena(info, 4)
    codec = arena.codec
    stride = -(-info.state_bytes_f32 // 64) * 64
    state = random_state(info, 5)
    with conn.open_staging(2 * stride) as staging:
        src, dst = conn.allocate(arena, 2)
        staged = np.asarray(staging.view("float32", state.size))
        staged[:] = state

        pending = conn.compress_async(arena.id, src.id, staging.id, 0)
        assert pending.bytes == info.page_bytes and pending.event is None  # done at the reply
        pending.synchronize()  # no event: nothing to wait for, in every build
        pending.wait(0)
        expected_page = np.zeros(info.page_bytes, np.uint8)
        codec.encode(state, statepool.DType.f32, expected_page)
        assert np.array_equal(np.asarray(arena.page(src)), expected_page)

        back = conn.decompress_async(arena.id, src.id, staging.id, stride)
        assert back.bytes == info.state_bytes_f32 and back.event is None
        expected = np.zeros_like(state)
        codec.decode(expected_page, statepool.DType.f32, expected)
        assert np.array_equal(np.asarray(staging.view("float32", state.size, stride)), expected)
        half = conn.decompress_async(arena.id, src.id, staging.id, stride, statepool.DType.bf16)
        assert half.bytes == info.state_bytes_bf16

        copied = conn.copy_async(arena.id, src.id, dst.id)
        assert copied.bytes == 0 and copied.event is None
        assert np.array_equal(np.asarray(arena.page(dst)), expected_page)
        assert "Pending" in repr(type(copied))

        # Errors are the synchronous calls' on the host backend: typed, the page unchanged.
        staged[0] = np.nan
        with pytest.raises(statepool.NotFinite):
            conn.compress_async(arena.id, dst.id, staging.id, 0)
        assert np.array_equal(np.asarray(arena.page(dst)), expected_page)
        with pytest.raises(statepool.InvalidArgument, match="out of range"):
            conn.copy_async(arena.id, src.id, arena.page_count)
        del staged
        conn.free([src, dst])


def test_after_events_on_the_host_backend(conn):
    """`after` orders device work after an engine's stream; the host backend has none, so it
    refuses the request (nothing written), and bytes of the wrong size never leave Python."""
    info = conn.register_layout(small_layout(statepool.CodecId.int8, name="pytest-after"))
    arena = conn.open_arena(info, 2)
    state = random_state(info, 6)
    with conn.open_staging(info.state_bytes_f32) as staging:
        src, dst = conn.allocate(arena, 2)
        staged = np.asarray(staging.view("float32", state.size))
        staged[:] = state
        conn.compress(src, staging, 0)
        before = np.array(arena.page(dst))
        event = b"\xa5" * 64
        calls = [
            lambda: conn.compress(dst, staging, 0, after=event),
            lambda: conn.compress(arena.id, dst.id, staging.id, 0, after=bytearray(event)),
            lambda: conn.decompress(dst, staging, 0, after=event),
            lambda: conn.copy(src, dst, after=event),
            lambda: conn.compress_async(arena.id, dst.id, staging.id, 0, after=event),
            lambda: conn.decompress_async(arena.id, dst.id, staging.id, 0, after=event),
            lambda: conn.copy_async(arena.id, src.id, dst.id, after=event),
        ]
        for call in calls:
            with pytest.raises(statepool.InvalidArgument, match="host backend has no device stream"):
                call()
        assert np.array_equal(np.asarray(arena.page(dst)), before)
        assert np.array_equal(staged, state)
        with pytest.raises(ValueError, match="64-byte IPC handle"):
            conn.compress(dst, staging, 0, after=b"short")
        with pytest.raises(TypeError):
            conn.copy(src, dst, after=64)
        conn.compress(dst, staging, 0, after=None)  # None: no ordering asked for
        del staged
        conn.free([src, dst])


def test_allocate_by_arena_id(conn):
    info = conn.register_layout(small_layout(statepool.CodecId.int4, name="pytest-by-id"))
    arena = conn.open_arena(info, 4)

    def used() -> int:
        return next(a.pages_used for a in conn.stats().arenas if a.arena_id == arena.id)

    base = used()
    slots = conn.allocate(arena.id, 3)  # an arena this process need not have mapped
    assert [s.arena_id for s in slots] == [arena.id] * 3 and all(s.valid for s in slots)
    assert len({s.id for s in slots}) == 3 and used() == base + 3
    with pytest.raises(statepool.PoolExhausted):
        conn.allocate(arena.id, 2)  # one page left: all or none
    assert used() == base + 3
    with pytest.raises(statepool.NotFound, match="arena"):
        conn.allocate(arena.id + 1000)
    assert conn.free(slots) == 3 and used() == base
    [one] = conn.allocate(arena.id)  # count defaults to 1
    one.free()


def test_snapshots_by_slot_ids(daemon):
    with daemon.connect() as engine_a, daemon.connect() as engine_b:
        info = engine_a.register_layout(small_layout(statepool.CodecId.int6, name="pytest-snap-id"))
        arena = engine_a.open_arena(info, 6)
        with engine_a.open_staging(info.state_bytes_f32) as staging:
            np.asarray(staging.view("float32"))[: info.state_bytes_f32 // 4] = random_state(info, 9)
            [slot] = engine_a.allocate(arena)
            engine_a.compress(slot, staging)
            slot_id = slot.release()  # a slot used by id from here on
        published = np.asarray(arena.page(slot_id)).copy()
        put = engine_a.put_snapshot(arena.id, slot_id, "by-id", 64)
        assert put.created and put.page_bytes == info.page_bytes and put.kv is None
        assert not engine_a.put_snapshot(arena.id, slot_id, b"by-id", 64).created
        with pytest.raises(ValueError, match="kv_staging without kv"):
            engine_a.put_snapshot(arena.id, slot_id, "by-id", 65,
                                  kv_staging=engine_a.open_staging(64))
        engine_a.free(arena.id, [slot_id])

        arena_b = engine_b.open_arena(engine_b.register_layout(info.layout), 6)
        [mine] = engine_b.allocate(arena_b)
        got = engine_b.get_snapshot(b"by-id", 64, arena_b.id, mine.id)
        assert got.hit and got.tier == "pool" and not got.kv_delivered
        assert np.array_equal(np.asarray(arena_b.page(mine)), published)
        assert not engine_b.get_snapshot("by-id", 63, arena_b.id, mine.id)  # a miss
        with pytest.raises(statepool.InvalidArgument, match="out of range"):
            engine_b.get_snapshot("by-id", 64, arena_b.id, arena_b.page_count)
        mine.free()

        # A hybrid entry by ids: KV blocks from one staging buffer into another.
        kv = statepool.KvBlocks(codec=statepool.KvCodec.bf16, layers=1, key_channels=8,
                                value_channels=8, tokens=4)
        f32 = statepool.DType.f32
        with engine_a.open_staging(kv.plain_bytes(f32)) as kv_in, \
                engine_b.open_staging(kv.plain_bytes(f32)) as kv_out:
            values = np.asarray(kv_in.view("float32", kv.plain_bytes(f32) // 4))
            values[:] = np.arange(values.size, dtype=np.float32) / 4  # exact in bf16
            [slot] = engine_a.allocate(arena)
            hybrid = engine_a.put_snapshot(arena.id, slot.id, "by-id-kv", 4, kv, kv_in,
                                           kv_dtype=f32)
            assert hybrid.created and hybrid.kv == kv and hybrid.pages == 2
            [mine] = engine_b.allocate(arena_b)
            got = engine_b.get_snapshot("by-id-kv", 4, arena_b.id, mine.id, kv_staging=kv_out,
                                        kv_dtype=f32)
            assert got.hit and got.kv_delivered and got.kv == kv
            assert np.array_equal(np.asarray(kv_out.view("float32", values.size)), values)
            del values
            slot.free()
            mine.free()
        assert engine_a.delete_snapshot("by-id", 64) == 1
        assert engine_a.delete_snapshot("by-id-kv", 4) == 1


def test_cuda_names_without_a_device_arena(conn):
    """The CUDA side exists in every build; on a host arena it says what it needs."""
    assert isinstance(statepool.HAVE_CUDA, bool)
    info = conn.register_layout(small_layout(statepool.CodecId.int8, name="pytest-no-device"))
    arena = conn.open_arena(info, 2)
    with pytest.raises(ValueError, match="device memory mapped in this process"):
        statepool.DeviceDecoder(arena)
    with pytest.raises(ValueError, match="host memory: use Arena.decode"):
        statepool.DeviceDecodeStep(arena)
    arena.close()  # the refused constructors hold nothing
