"""Prefix-state snapshots from Python against a real daemon (docs/prefix-store.md): publish
from one engine's connection, resume in another's slot bit for bit, keys as str or bytes,
list, pin, delete, misses and typed errors; hybrid entries with KV blocks."""

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


# --- hybrid entries: the attention layers' KV blocks beside the state --------------------------
# (docs/prefix-store.md, "Hybrid entries")

KIVI2 = dict(codec=statepool.KvCodec.kivi2, layers=2, key_channels=64, value_channels=64,
             tokens=200)


def _hybrid_layout(name: str) -> statepool.StateLayout:
    # int4 pages are small (about 1.3 KiB), so the KV blocks need many pages of the arena.
    return small_layout(statepool.CodecId.int4, name=name)


def _align(n: int, to: int = 64) -> int:
    return (n + to - 1) // to * to


def _bf16(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 values truncated to bfloat16: (their bits as uint16, their values as float32)."""
    bits = (np.ascontiguousarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32)


def _f16_down(x: np.ndarray) -> np.ndarray:
    """The largest fp16 value <= x, as float32 (kv_math.hpp's offset rule; no saturation)."""
    h = x.astype(np.float16)
    h = np.where(h.astype(np.float32) > x, np.nextafter(h, np.float16(-np.inf)), h)
    return h.astype(np.float32)


def _groups(values: np.ndarray, levels: int) -> np.ndarray:
    """Asymmetric groups along the last axis, reconstructed as kernels/kv_math.hpp does."""
    lo = values.min(axis=-1, keepdims=True)
    hi = values.max(axis=-1, keepdims=True)
    a = _f16_down(lo)
    t = (hi - a) / np.float32(levels)
    s = np.where(t > 0, t.astype(np.float16).astype(np.float32), np.float32(0))
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(s > 0, np.clip(np.rint((values - a) / s), 0, levels), 0).astype(np.float32)
    return q * s + a


def _kivi_reference(stream: np.ndarray, keys: bool, bits: int = 2) -> np.ndarray:
    """KIVI's decode of its encode of one [tokens][channels] float32 stream (kv.hpp): groups of
    32 tokens per channel (keys) or 32 channels per token (values) over the oldest tokens, the
    newest min(tokens, 128) kept in fp16."""
    levels = (1 << bits) - 1
    tokens, channels = stream.shape
    quantized = tokens - min(tokens, 128)
    out = np.empty_like(stream)
    out[quantized:] = stream[quantized:].astype(np.float16).astype(np.float32)
    for start in range(0, quantized if keys else channels, 32):
        if keys:
            block = stream[start:min(start + 32, quantized)]
            out[start:start + len(block)] = _groups(block.T, levels).T
        else:
            out[:quantized, start:start + 32] = _groups(stream[:quantized, start:start + 32],
                                                        levels)
    return out


def _streams(flat: np.ndarray, kv: statepool.KvBlocks) -> list[tuple[bool, np.ndarray]]:
    """(keys?, [tokens][channels] array) of each stream, in the staging order."""
    out, at = [], 0
    for _ in range(kv.layers):
        for keys, channels in ((True, kv.key_channels), (False, kv.value_channels)):
            if channels == 0:
                continue
            n = kv.tokens * channels
            out.append((keys, flat[at:at + n].reshape(kv.tokens, channels)))
            at += n
    assert at == flat.size
    return out


def _stage_state(conn, info, staging, slot, seed: int) -> None:
    rec = np.asarray(staging.view("float32", (info.state_bytes_f32 // 4,)))
    rec[:] = 0
    l = info.layout
    n = l.num_layers * l.num_heads * l.key_dim * l.value_dim
    rec[:n] = np.random.default_rng(seed).standard_normal(n)
    del rec
    conn.compress(slot, staging)


def test_a_hybrid_entry_delivers_kivi2_kv_blocks_to_a_second_engine(daemon):
    kv = statepool.KvBlocks(**KIVI2)
    assert kv.plain_bytes(statepool.DType.bf16) == 2 * 200 * 128 * 2
    assert kv.plain_bytes(statepool.DType.f32) == 2 * 200 * 128 * 4
    values = np.random.default_rng(5).standard_normal(2 * 200 * 128).astype(np.float32)
    bits, staged = _bf16(values)  # what the daemon reads: bfloat16 values
    with daemon.connect() as first, daemon.connect() as second:
        info = first.register_layout(_hybrid_layout("pytest-hybrid"))
        arena = first.open_arena(info, 128)
        at = _align(info.state_bytes_f32)
        with first.open_staging(at + kv.plain_bytes(statepool.DType.bf16)) as staging, \
                first.allocate(arena)[0] as slot:
            _stage_state(first, info, staging, slot, seed=3)
            raw = np.asarray(staging.view("uint8", (bits.nbytes,), offset=at))
            raw[:] = bits.view(np.uint8)  # the engine's bf16 KV tensor, byte for byte
            del raw
            put = first.put_snapshot(slot, "hybrid/kivi2", 200, kv, staging, at)
            assert put.created and put.kv == kv and put.kv_bytes == kv.encoded_bytes
            assert put.pages == 1 + -(-put.kv_bytes // put.page_bytes) and put.pages > 1
            assert f"kv={kv!r}" in repr(put) and f"pages={put.pages}" in repr(put)
            again = first.put_snapshot(slot, "hybrid/kivi2", 200, kv_staging=staging,
                                       kv=statepool.KvBlocks(**dict(KIVI2, tokens=100)),
                                       kv_offset=at)
            assert not again.created and again.kv == kv  # the standing entry's blocks
            published = np.asarray(arena.page(slot)).copy()

        info2 = second.register_layout(_hybrid_layout("pytest-hybrid-b"))
        arena2 = second.open_arena(info2, 128)
        off = 128  # anywhere in the reader's buffer, in the reader's dtype
        want = kv.plain_bytes(statepool.DType.f32)
        with second.open_staging(off + want) as mine_kv, second.allocate(arena2)[0] as mine:
            got = second.get_snapshot("hybrid/kivi2", 200, mine, kv_staging=mine_kv,
                                      kv_offset=off, kv_dtype=statepool.DType.f32)
            assert got.hit and got.kv_delivered and got.kv == kv and got.kv_bytes == put.kv_bytes
            assert np.array_equal(np.asarray(arena2.page(mine)), published)
            out = np.asarray(mine_kv.view("float32", (want // 4,), offset=off)).copy()

            for (keys, src), (_, dec) in zip(_streams(staged, kv), _streams(out, kv)):
                # Exactly the CPU reference's decode (kernels::kv_encode_blocks / decode).
                np.testing.assert_array_equal(dec, _kivi_reference(src, keys))
                # The documented bounds: half a 2-bit step of the group at most, and the
                # residual window (the newest 128 tokens) fp16-exact.
                err = np.abs(dec - src)
                assert err.max() <= 0.5 * (src.max() - src.min())
                window = slice(kv.tokens - 128, kv.tokens)
                assert np.all(err[window] <= 1e-3 * np.abs(src[window]) + 1e-3)
                assert err[:kv.tokens - 128].max() > 1e-2  # the old tokens are quantized

            # Without a KV range: the state only; the blocks are named, not delivered.
            np.asarray(mine_kv.view("uint8"))[:] = 0
            state_only = second.get_snapshot("hybrid/kivi2", 200, mine)
            assert state_only.hit and state_only.kv == kv and not state_only.kv_delivered
            assert state_only.kv_bytes == put.kv_bytes
            assert "kv_delivered=False" in repr(state_only)
            assert not np.asarray(mine_kv.view("uint8")).any()

        assert second.delete_snapshot("hybrid/kivi2", 200) == 1


def test_a_non_finite_kv_value_publishes_nothing(conn):
    kv = statepool.KvBlocks(codec=statepool.KvCodec.kivi4, layers=1, key_channels=32,
                            value_channels=32, tokens=40)
    info = conn.register_layout(_hybrid_layout("pytest-hybrid-nan"))
    arena = conn.open_arena(info, 128)
    at = _align(info.state_bytes_f32)
    with conn.open_staging(at + kv.plain_bytes(statepool.DType.f32)) as staging, \
            conn.allocate(arena)[0] as slot:
        _stage_state(conn, info, staging, slot, seed=4)
        vals = np.asarray(staging.view("float32", (kv.plain_bytes(statepool.DType.f32) // 4,),
                                       offset=at))
        vals[:] = np.random.default_rng(6).standard_normal(vals.size)
        vals[40 * 32 + 17] = np.nan  # a value of layer 0's values stream
        del vals
        pages_before = [a for a in conn.stats().arenas if a.arena_id == arena.id][0].snapshot_pages
        with pytest.raises(statepool.NotFinite):
            conn.put_snapshot(slot, "hybrid/nan", 40, kv, staging, at, statepool.DType.f32)
        assert conn.list_snapshots("hybrid/nan").snapshots == []
        assert not conn.get_snapshot("hybrid/nan", 40, slot)
        after = [a for a in conn.stats().arenas if a.arena_id == arena.id][0]
        assert after.snapshot_pages == pages_before
        assert conn.healthy


def test_list_snapshots_shows_the_kv_blocks_and_pages(conn):
    # Keys only (an MLA latent), f32 values.
    kv = statepool.KvBlocks(codec=statepool.KvCodec.flexgen4, layers=3, key_channels=96,
                            tokens=64)
    assert kv.value_channels == 0
    info = conn.register_layout(_hybrid_layout("pytest-hybrid-list"))
    arena = conn.open_arena(info, 128)
    plain = kv.plain_bytes(statepool.DType.f32)
    with conn.open_staging(plain) as staging, conn.allocate(arena)[0] as slot:
        vals = np.asarray(staging.view("float32", (plain // 4,)))
        vals[:] = np.random.default_rng(7).standard_normal(vals.size)
        del vals
        put = conn.put_snapshot(slot, "hybrid/list", 64, kv=kv, kv_staging=staging,
                                kv_dtype=statepool.DType.f32)
        plain_put = conn.put_snapshot(slot, "hybrid/plain", 64)
        assert plain_put.kv is None and plain_put.kv_bytes == 0 and plain_put.pages == 1
        assert repr(plain_put) == "SnapshotPut(created=True, evicted=0)"
    entries = {e.prefix: e for e in conn.list_snapshots("hybrid/").snapshots}
    hybrid, plain_entry = entries[b"hybrid/list"], entries[b"hybrid/plain"]
    assert hybrid.kv == kv and hybrid.kv_bytes == put.kv_bytes == kv.encoded_bytes
    assert hybrid.pages == put.pages > 1
    assert plain_entry.kv is None and plain_entry.kv_bytes == 0 and plain_entry.pages == 1
    stats = [a for a in conn.stats().arenas if a.arena_id == arena.id][0]
    assert stats.snapshot_pages >= hybrid.pages + 1
    assert conn.delete_snapshot("hybrid/list", 64) == 1
    assert conn.delete_snapshot("hybrid/plain", 64) == 1


def test_kv_arguments_are_checked_before_anything_is_sent(conn):
    kv = statepool.KvBlocks(**KIVI2)
    info = conn.register_layout(_hybrid_layout("pytest-hybrid-args"))
    arena = conn.open_arena(info, 128)
    with conn.open_staging(kv.plain_bytes(statepool.DType.bf16)) as staging, \
            conn.allocate(arena)[0] as slot:
        with pytest.raises(ValueError, match="kv_staging"):
            conn.put_snapshot(slot, "hybrid/args", 1, kv)
        with pytest.raises(ValueError, match="kv_staging without kv"):
            conn.put_snapshot(slot, "hybrid/args", 1, kv_staging=staging)
        with pytest.raises(ValueError, match="kv_offset"):
            conn.get_snapshot("hybrid/args", 1, slot, kv_offset=64)
        assert conn.list_snapshots("hybrid/args").snapshots == []

        # Ill-formed blocks can be built; plain_bytes names the problem, the daemon refuses.
        empty = statepool.KvBlocks(codec=statepool.KvCodec.bf16, layers=2, key_channels=64,
                                   tokens=0)
        with pytest.raises(ValueError, match="at least 1 token"):
            empty.plain_bytes(statepool.DType.bf16)
        with pytest.raises(ValueError, match="at least 1 token"):
            empty.encoded_bytes
        with pytest.raises(statepool.InvalidArgument, match="at least 1 token"):
            conn.put_snapshot(slot, "hybrid/args", 1, empty, staging)
        # A range that does not hold the blocks is refused too.
        with pytest.raises(statepool.InvalidArgument, match="staging range"):
            conn.put_snapshot(slot, "hybrid/args", 1, kv, staging, 64)
        assert conn.list_snapshots("hybrid/args").snapshots == []
        assert conn.healthy

    blocks = statepool.KvBlocks(codec=statepool.KvCodec.fp8, layers=1, key_channels=8, tokens=2)
    blocks.tokens = 3
    blocks.value_channels = 8
    assert blocks == statepool.KvBlocks(codec=statepool.KvCodec.fp8, layers=1, key_channels=8,
                                        value_channels=8, tokens=3)
    assert blocks != kv and blocks.encoded_bytes == 2 * 3 * 8
    assert repr(blocks) == ("KvBlocks(codec=KvCodec.fp8, layers=1, key_channels=8, "
                            "value_channels=8, tokens=3)")


# --- moving snapshots: one self-checking value out and back (docs/prefix-store.md) ------------

def _is_digest(text: str) -> bool:
    return len(text) == 16 and all(ch in "0123456789abcdef" for ch in text.lower())


def test_a_hybrid_snapshot_leaves_as_bytes_and_comes_back(daemon):
    kv = statepool.KvBlocks(codec=statepool.KvCodec.kivi4, layers=1, key_channels=32,
                            value_channels=32, tokens=40)
    f32 = statepool.DType.f32
    want = kv.plain_bytes(f32)
    with daemon.connect() as conn:
        info = conn.register_layout(_hybrid_layout("pytest-move-hybrid"))
        arena = conn.open_arena(info, 128)
        at = _align(info.state_bytes_f32)
        with conn.open_staging(at + want) as staging, conn.allocate(arena)[0] as slot:
            _stage_state(conn, info, staging, slot, seed=8)
            vals = np.asarray(staging.view("float32", (want // 4,), offset=at))
            vals[:] = np.random.default_rng(9).standard_normal(vals.size)
            del vals
            put = conn.put_snapshot(slot, "move/hybrid", 40, kv, staging, at, f32)
            assert put.created and put.pages > 1
            published = np.asarray(arena.page(slot)).copy()
            got = conn.get_snapshot("move/hybrid", 40, slot, kv_staging=staging, kv_offset=at,
                                    kv_dtype=f32)
            assert got.kv_delivered
            decoded = np.asarray(staging.view("uint8", (want,), offset=at)).copy()

        [entry] = conn.list_snapshots("move/hybrid").snapshots
        assert _is_digest(entry.layout_digest)

        # The size first (nothing written), then the value itself.
        size = conn.export_snapshot("move/hybrid", 40)
        assert size and size.found and size.kv == kv
        assert size.layout_digest == entry.layout_digest
        assert size.value_bytes > put.page_bytes + put.kv_bytes
        assert repr(size) == (f"SnapshotExport(found=True, value_bytes={size.value_bytes}, "
                              f"layout_digest='{entry.layout_digest}', kv={kv!r})")
        data = conn.export_snapshot_bytes("move/hybrid", 40)
        assert isinstance(data, bytes) and len(data) == size.value_bytes
        assert conn.export_snapshot_bytes(b"move/hybrid", 40, entry.layout_digest) == data
        # Into a staging buffer of the caller's, at an offset: the same bytes.
        with conn.open_staging(64 + size.value_bytes) as out:
            written = conn.export_snapshot("move/hybrid", 40, out, 64, entry.layout_digest)
            assert written.found and written.value_bytes == size.value_bytes
            assert bytes(np.asarray(out.view("uint8", (len(data),), offset=64))) == data

        assert conn.delete_snapshot("move/hybrid", 40) == 1
        assert conn.export_snapshot_bytes("move/hybrid", 40) is None
        imported = conn.import_snapshot_bytes(data)
        assert imported.created and imported.evicted == 0 and imported.arena_id == arena.id
        assert imported.prefix == b"move/hybrid" and imported.position == 40
        assert imported.kv == kv and imported.pages == put.pages
        assert repr(imported) == (f"SnapshotImport(created=True, evicted=0, "
                                  f"arena_id={arena.id}, prefix=b'move/hybrid', position=40, "
                                  f"kv={kv!r}, pages={put.pages})")
        [back] = conn.list_snapshots("move/hybrid").snapshots
        assert back.layout_digest == entry.layout_digest and back.kv_bytes == put.kv_bytes

        # The state and the KV blocks, bit for bit, in another slot.
        with conn.open_staging(want) as mine_kv, conn.allocate(arena)[0] as mine:
            hit = conn.get_snapshot("move/hybrid", 40, mine, kv_staging=mine_kv, kv_dtype=f32)
            assert hit and hit.kv_delivered and hit.kv == kv
            assert np.array_equal(np.asarray(arena.page(mine)), published)
            assert np.array_equal(np.asarray(mine_kv.view("uint8", (want,))), decoded)

        # Idempotent; and import_snapshot() from a staging buffer at an offset.
        with conn.open_staging(128 + len(data)) as src:
            np.asarray(src.view("uint8", (len(data),), offset=128))[:] = np.frombuffer(data,
                                                                                      np.uint8)
            again = conn.import_snapshot(src, 128, len(data))
            assert not again.created and again.kv == kv and again.prefix == b"move/hybrid"
        assert conn.delete_snapshot("move/hybrid", 40) == 1


def test_a_plain_snapshot_moves_to_another_tenant(daemon):
    layout = small_layout(statepool.CodecId.int8, name="pytest-move-plain")
    with daemon.connect() as conn, daemon.connect("small") as other:
        info = conn.register_layout(layout)
        arena = conn.open_arena(info, 4)
        with conn.open_staging(info.state_bytes_f32) as staging, conn.allocate(arena)[0] as slot:
            _stage_state(conn, info, staging, slot, seed=10)
            assert conn.put_snapshot(slot, b"\x00move\xff", 9).created
            published = np.asarray(arena.page(slot)).copy()
        data = conn.export_snapshot_bytes(b"\x00move\xff", 9)
        assert data is not None
        size = conn.export_snapshot(b"\x00move\xff", 9)
        assert size.kv is None and size.value_bytes == len(data) and "kv=" not in repr(size)

        # Another tenant's namespace: it needs an arena of the layout first.
        with pytest.raises(statepool.NotFound):
            other.import_snapshot_bytes(data)
        arena2 = other.open_arena(other.register_layout(layout), 2)
        put = other.import_snapshot_bytes(data)
        assert put.created and put.arena_id == arena2.id and put.kv is None and put.pages == 1
        assert put.prefix == b"\x00move\xff" and put.position == 9
        assert repr(put).endswith("prefix=b'\\x00move\\xff', position=9, pages=1)")
        with other.allocate(arena2)[0] as mine:
            assert other.get_snapshot(b"\x00move\xff", 9, mine).hit
            assert np.array_equal(np.asarray(arena2.page(mine)), published)
        assert other.delete_snapshot(b"\x00move\xff", 9) == 1
        assert conn.delete_snapshot(b"\x00move\xff", 9) == 1


def test_a_corrupted_value_is_refused_and_publishes_nothing(conn):
    info = conn.register_layout(small_layout(statepool.CodecId.int8, name="pytest-move-bad"))
    arena = conn.open_arena(info, 4)
    with conn.open_staging(info.state_bytes_f32) as staging, conn.allocate(arena)[0] as slot:
        _stage_state(conn, info, staging, slot, seed=11)
        assert conn.put_snapshot(slot, "move/bad", 3).created
    data = conn.export_snapshot_bytes("move/bad", 3)
    assert conn.delete_snapshot("move/bad", 3) == 1

    flipped = bytearray(data)
    flipped[-10] ^= 0x01  # a byte of the page
    with pytest.raises(statepool.InvalidArgument, match="checksum mismatch"):
        conn.import_snapshot_bytes(bytes(flipped))
    with pytest.raises(statepool.InvalidArgument, match="truncated"):
        conn.import_snapshot_bytes(data[:-1])
    with pytest.raises(statepool.InvalidArgument, match="not a snapshot value"):
        conn.import_snapshot_bytes(b"not a snapshot at all")
    with pytest.raises(ValueError, match="empty"):
        conn.import_snapshot_bytes(b"")
    assert conn.list_snapshots("move/bad").snapshots == []
    assert conn.healthy


def test_export_of_a_missing_key_is_no_error(conn):
    assert conn.export_snapshot_bytes("move/missing", 1) is None
    missing = conn.export_snapshot("move/missing", 1)
    assert not missing and not missing.found and missing.value_bytes == 0
    assert missing.kv is None and repr(missing) == "SnapshotExport(found=False)"
    with conn.open_staging(4096) as staging:
        assert not conn.export_snapshot("move/missing", 1, staging)
    with pytest.raises(ValueError, match="offset without staging"):
        conn.export_snapshot("move/missing", 1, offset=64)
    info = conn.register_layout(small_layout(statepool.CodecId.int8, name="pytest-move-digest"))
    arena = conn.open_arena(info, 4)
    with conn.allocate(arena)[0] as slot:
        assert conn.put_snapshot(slot, "move/digest", 5).created
    [entry] = conn.list_snapshots("move/digest").snapshots
    assert _is_digest(entry.layout_digest)
    other = "0" * 16 if entry.layout_digest != "0" * 16 else "1" * 16
    assert conn.export_snapshot_bytes("move/digest", 5, other) is None  # another layout's
    assert conn.delete_snapshot("move/digest", 5) == 1
