"""statepool.sglang's batched requests, its two data paths, its metrics and its threads, against
the real SGLang 0.5.23 package and live statepoold processes.

- batches: one SGLang call is one daemon round trip (or a few where the daemon's caps split it:
  --max-batch-keys, --max-batch-bytes, the staging cap of the one-copy path); partial presence,
  keys offered twice, other codecs and geometries under the same SGLang keys;
- zero copy: host pools made by SGLang's shm allocator are lent to the daemon (its log says
  so) and read and written in place, bit-exact, from two threads at once; the one-copy
  fallback otherwise, said at registration, and copying only what must move;
- metrics: get_stats() is SGLang's StorageMetrics with one sample per batch that moved pages,
  drained per call; stats() counts a hit only for a page read;
- threads: a call blocked in a round trip holds no other thread up;
- refusals: pools the backend cannot store are refused at registration, with the reason.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
import torch
from conftest import (
    PAGE,
    fill,
    kv_pool,
    make_backend,
    mamba_pool,
    mamba_transfer,
    normalized,
    page_keys,
    start_daemon,
    statepool_extra,
    token_indices,
)
from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo
from sglang.srt.mem_cache.hicache_storage import PoolName
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
from sglang.srt.observability.metrics_collector import StorageMetrics

import statepool


def trips(backend) -> int:
    return backend.stats()["round_trips"]


def same_kv(kv, src: list[int], dst: list[int]) -> bool:
    return all(torch.equal(kv.get_data_page(s * PAGE), kv.get_data_page(d * PAGE))
               for s, d in zip(src, dst))


def same_states(mamba, src: list[int], dst: list[int]) -> bool:
    return all(torch.equal(mamba.temporal_buffer[s], mamba.temporal_buffer[d])
               and torch.equal(mamba.conv_buffer[0][s], mamba.conv_buffer[0][d])
               for s, d in zip(src, dst))


@pytest.fixture(scope="module")
def capped_daemon(tmp_path_factory):
    """A daemon that takes at most 8 keys per batched request."""
    d = start_daemon(tmp_path_factory.mktemp("statepoold-8keys"), ["--max-batch-keys", "8"])
    yield d
    assert d.stop() == 0, d.log()


@pytest.mark.parametrize("allocator", ["default", "shm"])
def test_batches_over_the_key_cap_partial_and_duplicate(capped_daemon, allocator):
    kv = kv_pool(pages=48, allocator=allocator)
    mamba = mamba_pool(slots=32, allocator=allocator)
    fill(kv, mamba, 3)
    ours = make_backend("dynamic", statepool_extra(capped_daemon, namespace=f"cap-{allocator}"),
                        kv, mamba)
    keys = page_keys(f"cap-{allocator}", 20)
    # 18 pages in one call (pages 10 and 11 missing): 3 requests of at most 8 keys.
    stored = [p for p in range(20) if p not in (10, 11)]
    before = trips(ours)
    assert ours.batch_set_v1([keys[p] for p in stored], token_indices(stored)) == [True] * 18
    # 18 keys in requests of at most 8: 3 puts, after a lookup of 3 on the one-copy path
    assert trips(ours) - before == (3 if allocator == "shm" else 6)
    # A key offered twice in one call: stored once, True for both.
    assert ours.batch_set_v1([keys[0], keys[1], keys[0]], token_indices([0, 1, 0])) == [True] * 3
    assert ours.stats()["kv_puts"] == 18
    assert ours.batch_exists(keys) == 10
    kv.kv_buffer[:, 24 * PAGE:44 * PAGE] = 0
    assert ours.batch_get_v1(keys, token_indices(range(24, 44))) == [True] * 10 + [False] * 10
    assert same_kv(kv, list(range(10)), list(range(24, 34)))
    assert not kv.kv_buffer[:, 34 * PAGE:44 * PAGE].any()  # nothing past the miss was written
    # Duplicates on the way back: both read.
    assert ours.batch_get_v1([keys[2], keys[2]], token_indices([44, 45])) == [True, True]
    assert same_kv(kv, [2, 2], [44, 45])

    # 12 states in one call: 2 requests; read back into other slots, exact (fp32).
    slots = list(range(12))
    assert ours.batch_set_v2([mamba_transfer(keys[:12], slots)])[PoolName.MAMBA] == [True] * 12
    got = ours.batch_get_v2([mamba_transfer(keys[:12], [s + 16 for s in slots])])
    assert got[PoolName.MAMBA] == [True] * 12
    assert same_states(mamba, slots, [s + 16 for s in slots])
    # Hit query over 20 keys: KV leading run 10; states at pages 1..10 (keys[:12] stored).
    r = ours.batch_exists_v2(keys, [mamba_transfer([keys[-1]])])
    assert normalized(r) == (10, {"kv": 10, "mamba": 10}, list(range(1, 11)))
    ours.close()


@pytest.mark.parametrize("allocator", ["default", "shm"])
def test_state_batches_split_by_bytes(tmp_path, allocator):
    """--max-batch-bytes 1MiB and 128 KiB states: a call of 12 is sent in parts."""
    d = start_daemon(tmp_path / "d", ["--max-batch-bytes", "1MiB"])
    try:
        kv = kv_pool(allocator=allocator)
        mamba = mamba_pool(heads=4, value_dim=64, key_dim=64, slots=32, allocator=allocator)
        fill(kv, mamba, 4)
        ours = make_backend("dynamic", statepool_extra(d, namespace="bytes", state_arena_pages=16),
                            kv, mamba)
        keys = page_keys("bytes", 12)
        before = trips(ours)
        assert ours.batch_set_v2([mamba_transfer(keys, list(range(12)))])[PoolName.MAMBA] == \
            [True] * 12
        assert trips(ours) - before >= 2
        got = ours.batch_get_v2([mamba_transfer(keys, list(range(16, 28)))])[PoolName.MAMBA]
        assert got == [True] * 12
        assert same_states(mamba, list(range(12)), list(range(16, 28)))
        ours.close()
    finally:
        assert d.stop() == 0, d.log()


def test_one_copy_staging_cap_splits_batches(daemon):
    """staging_mib 1 and 64 KiB KV pages: 40 pages go through the staging buffer in parts."""
    kv = kv_pool(layers=4, heads=4, head_dim=64, page_size=16, pages=96)
    fill(kv, None, 5)
    ours = make_backend("dynamic", statepool_extra(daemon, namespace="staging-cap", staging_mib=1,
                                                   kv_arena_mib=16), kv, None)
    keys = page_keys("staging-cap", 40)
    before = trips(ours)
    assert ours.batch_set_v1(keys, token_indices(range(40), 16)) == [True] * 40
    assert trips(ours) - before >= 1 + 3  # a lookup, then 40 x 64 KiB in 1 MiB parts
    assert ours.batch_get_v1(keys, token_indices(range(48, 88), 16)) == [True] * 40
    assert all(torch.equal(kv.get_data_page(p * 16), kv.get_data_page((48 + p) * 16))
               for p in range(40))
    ours.close()


def test_exists_of_4096_one_token_pages_is_one_round_trip(daemon):
    """page_size 1 (SGLang's no_buffer mode): a hit query over 4,096 pages is one request, the
    KV pages' keys with their states' keys beside them (8,192 keys: --max-batch-keys)."""
    kv = kv_pool(layers=1, heads=1, head_dim=16, page_size=1, pages=4096 + 8)
    mamba = mamba_pool()
    fill(kv, mamba, 6)
    ours = make_backend("dynamic", statepool_extra(daemon, namespace="4096", kv_arena_mib=48),
                        kv, mamba)
    keys = page_keys("4096", 4096)
    for a in range(0, 4096, 128):  # as SGLang's backup thread writes them
        assert all(ours.batch_set_v1(keys[a:a + 128], torch.arange(a, a + 128)))
    assert ours.batch_set_v2([mamba_transfer([keys[-1]], [0])])[PoolName.MAMBA] == [True]
    before, t0 = trips(ours), time.monotonic()
    r = ours.batch_exists_v2(keys, [mamba_transfer([keys[-1]])])
    seconds = time.monotonic() - t0
    assert (r.kv_hit_pages, r.restorable_prefix_pages) == (4096, [4096])
    assert trips(ours) - before == 1
    assert seconds < 2, seconds  # ~10 ms here; Mooncake's embedded store ~54 ms
    ours.close()


def test_other_codecs_never_read_each_others_entries(daemon):
    """Two backends on the same namespace and SGLang keys, KV in bf16 and fp8, states in fp32 and
    stepquant6: each reads back only what it stored."""
    kv, mamba = kv_pool(pages=48), mamba_pool(slots=32)
    fill(kv, mamba, 7)
    a = make_backend("dynamic", statepool_extra(daemon, namespace="mixed"), kv, mamba)
    b = make_backend("dynamic", statepool_extra(daemon, namespace="mixed", kv_codec="fp8",
                                                state_codec="stepquant6"), kv, mamba)
    keys = page_keys("mixed", 3)
    assert a.batch_set_v1(keys, token_indices([0, 1, 2])) == [True] * 3
    assert a.batch_set_v2([mamba_transfer(keys, [0, 1, 2])])[PoolName.MAMBA] == [True] * 3
    assert b.batch_exists(keys) == 0
    assert normalized(b.batch_exists_v2(keys, [mamba_transfer([keys[-1]])])) == (0, {}, [])
    assert b.batch_get_v2([mamba_transfer(keys[:1], [8])])[PoolName.MAMBA] == [False]
    assert b.batch_set_v1(keys, token_indices([0, 1, 2])) == [True] * 3
    assert b.batch_set_v2([mamba_transfer(keys, [0, 1, 2])])[PoolName.MAMBA] == [True] * 3
    assert b.batch_get_v1(keys, token_indices([10, 11, 12])) == [True] * 3
    assert a.batch_get_v1(keys, token_indices([20, 21, 22])) == [True] * 3
    assert same_kv(kv, [0, 1, 2], [20, 21, 22])  # bf16: exact
    fp8 = kv.get_data_page(0).to(torch.float8_e4m3fn).to(torch.bfloat16)
    assert torch.equal(kv.get_data_page(10 * PAGE), fp8)
    assert b.batch_get_v2([mamba_transfer(keys, [8, 9, 10])])[PoolName.MAMBA] == [True] * 3
    assert a.batch_get_v2([mamba_transfer(keys, [11, 12, 13])])[PoolName.MAMBA] == [True] * 3
    assert same_states(mamba, [0, 1, 2], [11, 12, 13])
    assert not torch.equal(mamba.temporal_buffer[0], mamba.temporal_buffer[8])  # stepquant6
    a.close()
    b.close()


def test_zero_copy_lends_the_pools_and_is_bit_exact_from_two_threads(tmp_path, caplog):
    d = start_daemon(tmp_path / "d")
    try:
        kv = kv_pool(pages=64, allocator="shm")
        mamba = mamba_pool(slots=32, allocator="shm")
        fill(kv, mamba, 8)
        with caplog.at_level(logging.INFO, logger="statepool.sglang"):
            ours = make_backend("dynamic", statepool_extra(d, namespace="zero-copy"), kv, mamba)
        said = " ".join(r.getMessage() for r in caplog.records)
        assert "host KV pool" in said and "host MAMBA pool" in said
        assert said.count("zero copy: the host") == 2, said
        assert all(p.startswith("zero copy: ") for p in ours.pools().values())
        errors: list[BaseException] = []

        def work(t: int) -> None:
            try:
                keys = page_keys(f"zero-copy-{t}", 4)
                src, dst = [t * 8 + i for i in range(4)], [32 + t * 8 + i for i in range(4)]
                for _ in range(5):
                    assert ours.batch_set_v1(keys, token_indices(src)) == [True] * 4
                    assert ours.batch_set_v2([mamba_transfer(keys[-2:], [t * 4, t * 4 + 1])])[
                        PoolName.MAMBA] == [True, True]
                    assert ours.batch_exists_v2(keys, [mamba_transfer([keys[-1]])]) \
                        .kv_hit_pages == 4
                    assert ours.batch_get_v1(keys, token_indices(dst)) == [True] * 4
                    got = ours.batch_get_v2([mamba_transfer(keys[-2:], [16 + t * 4,
                                                                        17 + t * 4])])
                    assert got[PoolName.MAMBA] == [True, True]
                assert same_kv(kv, src, dst)
                assert same_states(mamba, [t * 4, t * 4 + 1], [16 + t * 4, 17 + t * 4])
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        st = ours.stats()
        assert st["bytes_copied"] == 0 and st["bytes_read"] > 0 and st["bytes_written"] > 0
        ours.close()
    finally:
        assert d.stop() == 0, d.log()
    # Each thread's connection lent SGLang's three memory files to the daemon.
    lent = [line for line in d.log().splitlines() if "registered" in line]
    for name in ("SGLang host KV pool", "SGLang host state pool (recurrent)",
                 "SGLang host state pool (conv)"):
        connections = {line.split("connection ")[1].split()[0] for line in lent if name in line}
        assert len(connections) == 2, (name, lent)


def test_one_copy_fallback_says_why_and_copies_only_what_moves(daemon, caplog):
    kv, mamba = kv_pool(), mamba_pool()
    fill(kv, mamba, 9)
    with caplog.at_level(logging.INFO, logger="statepool.sglang"):
        ours = make_backend("dynamic", statepool_extra(daemon, namespace="one-copy"), kv, mamba)
    said = [r.getMessage() for r in caplog.records]
    assert sum("one copy: the host" in m and '"allocator": "shm"' in m for m in said) == 2, said
    keys = page_keys("one-copy", 3)
    assert ours.batch_set_v1(keys, token_indices([0, 1, 2])) == [True] * 3
    page = kv.get_data_page(0).numel() * kv.dtype.itemsize
    assert ours.stats()["bytes_copied"] == 3 * page
    # Pages the store has are not copied again (SGLang re-sends a node's pages).
    assert ours.batch_set_v1(keys, token_indices([0, 1, 2])) == [True] * 3
    assert ours.stats()["bytes_copied"] == 3 * page and ours.stats()["kv_existing"] == 3
    # A get copies only the pages read (the leading run).
    missing = page_keys("one-copy-missing", 1)
    assert ours.batch_get_v1(keys[:2] + missing, token_indices([8, 9, 10])) == [True, True, False]
    assert ours.stats()["bytes_copied"] == 5 * page
    assert same_kv(kv, [0, 1], [8, 9])
    ours.close()

    # Shared memory, but zero_copy off: one copy, and the log says why.
    caplog.clear()
    shm_kv = kv_pool(allocator="shm")
    with caplog.at_level(logging.INFO, logger="statepool.sglang"):
        off = make_backend("dynamic", statepool_extra(daemon, namespace="one-copy-off",
                                                      zero_copy="false"), shm_kv, None)
    assert any("one copy: zero_copy is off" in r.getMessage() for r in caplog.records)
    assert off.batch_set_v1(keys, token_indices([0, 1, 2])) == [True] * 3
    assert off.stats()["bytes_copied"] > 0
    off.close()


def test_storage_metrics_and_hit_counting(daemon):
    kv, mamba = kv_pool(), mamba_pool()
    fill(kv, mamba, 10)
    ours = make_backend("dynamic", statepool_extra(daemon, namespace="metrics"), kv, mamba)
    first = ours.get_stats()
    assert isinstance(first, StorageMetrics)
    assert (first.prefetch_pgs, first.backup_pgs) == ([], [])
    keys = page_keys("metrics", 3)
    page = kv.get_data_page(0).numel() * kv.dtype.itemsize
    assert ours.batch_set_v1(keys, token_indices([0, 1, 2])) == [True] * 3
    assert ours.batch_set_v1(keys, token_indices([0, 1, 2])) == [True] * 3  # nothing moves
    assert ours.batch_set_v2([mamba_transfer(keys[1:], [1, 2])])[PoolName.MAMBA] == [True] * 2
    m = ours.get_stats()
    assert m.backup_pgs == [3, 2] and m.prefetch_pgs == []
    assert len(m.backup_bandwidth) == 2 and all(b > 0 for b in m.backup_bandwidth)
    drained = ours.get_stats()
    assert (drained.backup_pgs, drained.backup_bandwidth) == ([], [])

    # Existence queries are lookups, never hits.
    assert normalized(ours.batch_exists_v2(keys, [mamba_transfer([keys[-1]])])) == \
        (3, {"kv": 3, "mamba": 3}, [2, 3])
    assert ours.batch_exists(keys) == 3
    st = ours.stats()
    assert (st["kv_lookups"], st["kv_lookup_hits"]) == (6, 6)
    assert (st["state_lookups"], st["state_lookup_hits"]) == (3, 2)
    assert (st["kv_hits"], st["state_hits"], st["kv_misses"], st["state_misses"]) == (0, 0, 0, 0)

    # Gets: a hit is a page read; the pages not read are misses, states included.
    missing = page_keys("metrics-missing", 1)
    assert ours.batch_get_v1(keys + missing, token_indices([8, 9, 10, 11])) == [True] * 3 + [False]
    got = ours.batch_get_v2([mamba_transfer([keys[2], keys[0]], [8, 9])])[PoolName.MAMBA]
    assert got == [True, False]
    st = ours.stats()
    assert (st["kv_hits"], st["kv_misses"], st["state_hits"], st["state_misses"]) == (3, 1, 1, 1)
    assert (st["kv_puts"], st["kv_existing"], st["state_puts"]) == (3, 3, 2)
    m = ours.get_stats()
    assert m.prefetch_pgs == [3, 1] and len(m.prefetch_bandwidth) == 2
    state = mamba.temporal_buffer[0].nbytes + mamba.conv_buffer[0][0].nbytes
    assert st["bytes_read"] == 3 * page + state
    ours.close()


class _SlowConnection:
    """A statepool.Connection whose put_snapshots waits for ``gate`` first: a round trip that
    takes long (a slow daemon, a big batch) on one thread."""

    def __init__(self, conn, gate: threading.Event, entered: threading.Event):
        self._conn, self._gate, self._entered = conn, gate, entered

    def put_snapshots(self, *args, **kwargs):
        self._entered.set()
        assert self._gate.wait(30)
        return self._conn.put_snapshots(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._conn, name)


def test_a_slow_round_trip_holds_no_other_thread_up(daemon, monkeypatch):
    kv, mamba = kv_pool(allocator="shm"), mamba_pool(allocator="shm")
    fill(kv, mamba, 11)
    ours = make_backend("dynamic", statepool_extra(daemon, namespace="slow"), kv, mamba)
    keys = page_keys("slow", 4)
    assert ours.batch_set_v1(keys, token_indices([0, 1, 2, 3])) == [True] * 4
    assert ours.batch_set_v2([mamba_transfer(keys, [0, 1, 2, 3])])[PoolName.MAMBA] == [True] * 4

    gate, entered = threading.Event(), threading.Event()
    connect = statepool.connect

    def connect_slowly_on_backup(*args, **kwargs):
        conn = connect(*args, **kwargs)
        if threading.current_thread().name == "backup":
            return _SlowConnection(conn, gate, entered)
        return conn

    monkeypatch.setattr(statepool, "connect", connect_slowly_on_backup)
    more = page_keys("slow-backup", 4)
    out: list = []
    backup = threading.Thread(
        name="backup", target=lambda: out.append(ours.batch_set_v1(more, token_indices(
            [4, 5, 6, 7]))))
    backup.start()
    try:
        assert entered.wait(10)
        t0 = time.monotonic()
        # The prefetch side goes on while the backup thread waits in its round trip.
        r = ours.batch_exists_v2(keys, [mamba_transfer([keys[-1]])])
        assert normalized(r) == (4, {"kv": 4, "mamba": 4}, [1, 2, 3, 4])
        assert ours.batch_get_v1(keys, token_indices([8, 9, 10, 11])) == [True] * 4
        assert ours.batch_get_v2([mamba_transfer(keys, [8, 9, 10, 11])])[PoolName.MAMBA] == \
            [True] * 4
        assert ours.batch_set_v2([mamba_transfer(more, [4, 5, 6, 7])])[PoolName.MAMBA] == \
            [True] * 4
        ours.get_stats()
        ours.stats()
        assert time.monotonic() - t0 < 5
        assert backup.is_alive()  # still in its round trip
    finally:
        gate.set()
        backup.join(30)
    assert out == [[True] * 4]
    assert ours.batch_exists(more) == 4
    ours.close()


def test_pools_it_cannot_store_are_refused_at_registration(daemon, caplog):
    kv = kv_pool()
    fill(kv, None, 12)
    conv = (torch.zeros(2, 4, 24, 3, dtype=torch.bfloat16),)

    def pool(temporal, convs, side=()):
        info = MambaStateBufferInfo(temporal=temporal, conv=convs, extra_checkpoint_buffers=side)
        return MambaPoolHost(info, 4, 0, device_capacity=4, pin_memory=False, device="cpu",
                             layout="page_first")

    cases = {
        "several conv states": (mamba_pool(convs=2), "2 conv states per layer"),
        "side state": (pool(torch.zeros(2, 4, 3, 8, 16), conv, (torch.zeros(4, 5),)),
                       "side state"),
        "empty temporal": (pool(torch.zeros(2, 4, 1, 1, 0), conv), "recurrent state of shape"),
    }
    keys = page_keys("refused", 2)
    for label, (mamba, reason) in cases.items():
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="statepool.sglang"):
            ours = make_backend("dynamic", statepool_extra(daemon, namespace="refused"), kv,
                                mamba)
        said = [r.getMessage() for r in caplog.records]
        assert any("MAMBA pool is not stored" in m and reason in m for m in said), (label, said)
        assert ours.pools()["mamba"].startswith("not stored: ") and reason in ours.pools()["mamba"]
        assert ours.pools()["kv"].startswith("one copy: ")
        # Its pages miss; the KV pages are stored still.
        assert ours.batch_set_v1(keys, token_indices([0, 1])) == [True, True]
        assert ours.batch_set_v2([mamba_transfer(keys, [0, 1])])[PoolName.MAMBA] == [False] * 2
        assert ours.batch_get_v2([mamba_transfer(keys, [2, 3])])[PoolName.MAMBA] == [False] * 2
        assert normalized(ours.batch_exists_v2(keys, [mamba_transfer([keys[-1]])])) == \
            (0, {"kv": 2}, [])
        ours.close()

    # page_unified: SGLang 0.5.23 builds the pool but cannot select it; not stored.
    caplog.clear()
    unified = kv_pool(layout="page_unified")
    with caplog.at_level(logging.WARNING, logger="statepool.sglang"):
        ours = make_backend("dynamic", statepool_extra(daemon, namespace="unified"), unified,
                            None)
    assert any("page_unified" in r.getMessage() and "cannot select" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert ours.batch_set_v1(keys, token_indices([0, 1])) == [False, False]
    assert ours.batch_exists(keys) == 0
    ours.close()
