"""Connection.close_arena() against a real daemon: refused (InUse) while the arena is in use,
then its memory given back and its id retired; BufferError while views of it are alive."""

from __future__ import annotations

import gc
import time

import pytest

import statepool
from conftest import small_layout


def arena_stats(conn: statepool.Connection, arena_id: int) -> list[statepool.ArenaStats]:
    return [a for a in conn.stats().arenas if a.arena_id == arena_id]


def test_a_held_slot_refuses_then_the_arena_is_given_back(conn):
    info = conn.register_layout(small_layout(num_heads=1, name="close-held"))
    arena = conn.open_arena(info, 4)
    arena_id = arena.id
    [before] = arena_stats(conn, arena_id)
    slot = conn.allocate(arena)[0]

    with pytest.raises(statepool.InUse) as refused:
        conn.close_arena(arena)
    assert refused.value.status == statepool.Status.in_use
    assert isinstance(refused.value, statepool.DaemonError)
    assert not arena.mapped  # unmapped here whatever the daemon answered
    assert arena_stats(conn, arena_id)  # the daemon kept it

    slot.free()
    closed = conn.close_arena(arena_id)
    assert isinstance(closed, statepool.ArenaClose)
    assert closed.bytes > 0 and closed.bytes == before.bytes_total
    assert closed.snapshots_dropped == 0
    assert repr(closed) == f"ArenaClose(bytes={closed.bytes}, snapshots_dropped=0)"
    assert arena_stats(conn, arena_id) == []

    with pytest.raises(statepool.NotFound):  # the id is never used again
        conn.allocate(arena_id, 1)
    with pytest.raises(statepool.NotFound):
        conn.close_arena(arena_id)


def test_unpinned_snapshots_are_dropped_and_pinned_ones_refuse(conn):
    info = conn.register_layout(small_layout(num_heads=2, name="close-snapshots"))
    arena = conn.open_arena(info, 4)
    arena_id = arena.id
    with conn.allocate(arena)[0] as slot:
        assert conn.put_snapshot(slot, b"close-pinned", 1).created
        assert conn.put_snapshot(slot, b"close-unpinned", 1).created
    assert conn.pin_snapshot(b"close-pinned", 1) == 1

    with pytest.raises(statepool.InUse):
        conn.close_arena(arena)
    assert conn.pin_snapshot(b"close-pinned", 1, pinned=False) == 1
    closed = conn.close_arena(arena_id)
    assert closed.snapshots_dropped == 2 and closed.bytes > 0
    assert conn.list_snapshots(b"close-").snapshots == []


def test_live_views_refuse_before_anything_is_sent(conn):
    info = conn.register_layout(small_layout(num_heads=3, name="close-views"))
    arena = conn.open_arena(info, 4)
    view = arena.pages()
    with pytest.raises(BufferError, match="view"):
        conn.close_arena(arena)
    step = statepool.DecodeStep(arena, threads=1)
    del view
    gc.collect()
    with pytest.raises(BufferError):
        conn.close_arena(arena)
    assert arena.mapped and arena_stats(conn, arena.id)  # nothing was unmapped or sent
    del step
    gc.collect()
    arena_id = arena.id
    assert conn.close_arena(arena).bytes > 0
    assert not arena.mapped and arena_stats(conn, arena_id) == []
    with pytest.raises(statepool.InvalidArgument, match="empty"):
        conn.close_arena(arena)  # the Arena object no longer names one


def test_another_connection_that_opened_it_refuses(daemon, conn):
    info = conn.register_layout(small_layout(num_heads=4, name="close-shared"))
    arena = conn.open_arena(info, 4)
    arena_id = arena.id
    other = daemon.connect()
    assert other.open_arena(info.id).id == arena_id
    with pytest.raises(statepool.InUse):
        conn.close_arena(arena_id)
    other.close()
    deadline = time.monotonic() + 10
    while True:  # the daemon sees the other connection go when it reads its end of file
        try:
            assert conn.close_arena(arena_id).bytes > 0
            break
        except statepool.InUse:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_a_closed_connection_keeps_the_mapping(daemon):
    conn = daemon.connect()
    arena = conn.open_arena(conn.register_layout(small_layout(num_heads=5, name="close-conn")), 4)
    conn.close()
    with pytest.raises(statepool.TransportError):
        conn.close_arena(arena)
    assert arena.mapped
