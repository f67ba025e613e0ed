"""Prefix-state snapshots from Python against a real daemon (docs/prefix-store.md): publish
from one engine's connection, resume in another's slot bit for bit, keys as str or bytes,
list, pin, delete, misses and typed errors."""

from __future__ import annotations

import numpy as np
import pytest

import statepool

from conftest import small_layout


def test_a_second_engine_resumes_from_a_published_prefix(daemon):
    with daemon.connect() as first, daemon.connect() as second:
        info = first.register_layout(small_layout(statepool.CodecId.int6, name="pytest-snap"))
        arena = first.open_arena(info, 4)
        with first.open_staging(info.state_bytes_f32) as staging, first.allocate(arena)[0] as slot:
            rec = np.asarray(staging.view("float32", (info.state_bytes_f32 // 4,)))
            rec[:] = 0
            l = info.layout
            n = l.num_layers * l.num_heads * l.key_dim * l.value_dim
            rec[:n] = np.random.default_rng(3).standard_normal(n)
            del rec  # the view must go before the staging buffer closes
            first.compress(slot, staging)
            put = first.put_snapshot(slot, b"\x9f\x86prompt", 512)
            assert put.created and put.evicted == 0 and put.page_bytes == info.page_bytes
            assert not first.put_snapshot(slot, b"\x9f\x86prompt", 512).created
            published = np.asarray(arena.page(slot)).copy()

        info2 = second.register_layout(small_layout(statepool.CodecId.int6, name="other-name"))
        assert info2.id == info.id  # names are not identity: the same layout
        arena2 = second.open_arena(info2, 4)
        with second.allocate(arena2)[0] as mine:
            got = second.get_snapshot(b"\x9f\x86prompt", 512, mine)
            assert got and got.hit and got.tier == "pool"
            assert np.array_equal(np.asarray(arena2.page(mine)), published)
            miss = second.get_snapshot(b"\x9f\x86prompt", 513, mine)
            assert not miss and miss.other_layouts == 0

        listed = second.list_snapshots(b"\x9f")
        assert listed.snapshot_namespace == "team-a" and not listed.truncated
        [entry] = listed.snapshots
        assert entry.prefix == b"\x9f\x86prompt" and entry.position == 512
        assert entry.codec == statepool.CodecId.int6 and entry.hits == 1
        assert entry.tenant == "team-a" and not entry.pinned

        assert second.pin_snapshot(b"\x9f\x86prompt", 512) == 1
        assert second.list_snapshots().snapshots[0].pinned
        assert second.pin_snapshot(b"\x9f\x86prompt", 512, pinned=False) == 1
        tenant = [t for t in first.stats().tenants if t.tenant == "team-a"][0]
        assert tenant.snapshots == 1 and tenant.snapshot_hits == 1 and tenant.snapshot_misses == 1
        assert second.delete_snapshot(b"\x9f\x86prompt", 512) == 1
        assert second.list_snapshots().snapshots == []


def test_text_keys_are_their_utf8_bytes_and_bad_keys_are_typed(conn):
    info = conn.register_layout(small_layout(statepool.CodecId.int8, name="pytest-snap-text"))
    arena = conn.open_arena(info, 4)
    with conn.allocate(arena)[0] as slot:
        assert conn.put_snapshot(slot, "système/v1", 7).created
        assert conn.get_snapshot("système/v1".encode(), 7, slot).hit
        assert conn.list_snapshots("sys").snapshots[0].prefix == "système/v1".encode()
        with pytest.raises(statepool.InvalidArgument, match="prefix"):
            conn.put_snapshot(slot, b"", 7)
        with pytest.raises(statepool.InvalidArgument, match="256 bytes"):
            conn.get_snapshot(b"x" * 257, 7, slot)
        with pytest.raises(statepool.InvalidArgument, match="limit"):
            conn.list_snapshots(limit=10001)
        assert conn.delete_snapshot("système/v1", 7) == 1
        assert conn.healthy
