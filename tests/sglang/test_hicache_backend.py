"""statepool.sglang against the real SGLang 0.5.23 package and a live statepoold: built by SGLang's
StorageBackendFactory, fed by SGLang's own host pools, and compared operation by operation with
SGLang's file backend (HiCacheFile), the reference behaviour of a hybrid-capable backend."""

from __future__ import annotations

import logging
import time

import pytest
import torch
from conftest import (
    PAGE,
    fill,
    kill_daemon,
    kv_pool,
    make_backend,
    mamba_pool,
    mamba_transfer,
    normalized,
    page_keys,
    start_daemon,
    statepool_extra,
    stop_daemon_process,
    storage_config,
    token_indices,
)
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheFile,
    HiCacheStorage,
    HiCacheStorageFailureInjector,
    PoolName,
)
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

import statepool
from statepool.sglang import StatepoolHiCacheStorage


def store_kv(backend, kv, keys: list[str], pages: list[int]) -> bool:
    """KV pages as SGLang's cache controller writes them: zero-copy batch_set_v1 where the
    backend has it (interface_v1), else flat data pages through batch_set."""
    if isinstance(backend, StatepoolHiCacheStorage):
        return all(backend.batch_set_v1(keys, token_indices(pages)))
    return backend.batch_set(keys, [kv.get_data_page(p * PAGE) for p in pages])


def load_kv(backend, kv, keys: list[str], pages: list[int]) -> list[bool]:
    if isinstance(backend, StatepoolHiCacheStorage):
        return backend.batch_get_v1(keys, token_indices(pages))
    out = []
    for key, p in zip(keys, pages):
        got = backend.get(key, kv.get_dummy_flat_data_page())
        if got is not None:
            kv.set_from_flat_data_page(p * PAGE, got)
        out.append(got is not None)
    return out


# Chains of page keys and what each backend is given for them: KV pages (by page index into
# the chain) and states (MAMBA pages, at the page whose key they are stored under).
CHAINS = {
    "full": dict(pages=6, kv=[0, 1, 2, 3, 4, 5], states=[1, 5]),
    "missing_middle": dict(pages=5, kv=[0, 1, 3, 4], states=[1, 4]),
    "missing_tail_state": dict(pages=4, kv=[0, 1, 2, 3], states=[1]),
    "no_states": dict(pages=3, kv=[0, 1, 2], states=[]),
}


def populate(backend, kv, mamba):
    """Stores every chain; returns {chain: keys} and the slots/pages the data came from."""
    keys_of, kv_page, state_slot = {}, 0, 0
    sources = {}
    for name, c in CHAINS.items():
        keys = page_keys(name, c["pages"])
        keys_of[name] = keys
        pages = list(range(kv_page, kv_page + len(c["kv"])))
        kv_page += len(c["kv"])
        assert store_kv(backend, kv, [keys[i] for i in c["kv"]], pages)
        slots = list(range(state_slot, state_slot + len(c["states"])))
        state_slot += len(c["states"])
        if c["states"]:
            res = backend.batch_set_v2([mamba_transfer([keys[i] for i in c["states"]], slots)])
            assert res[PoolName.MAMBA] == [True] * len(slots)
        sources[name] = (pages, slots)
    return keys_of, sources


def queries(keys_of):
    """(keys, trailing MAMBA keys) for the hit queries: full chains, partial prefixes, an
    unknown chain."""
    qs = []
    for name, keys in keys_of.items():
        for n in range(1, len(keys) + 1):
            qs.append((f"{name}[:{n}]", keys[:n], [keys[n - 1]]))
    unknown = page_keys("never-stored", 3)
    qs.append(("unknown", unknown, [unknown[-1]]))
    return qs


@pytest.fixture
def pools():
    kv, mamba = kv_pool(), mamba_pool()
    fill(kv, mamba, 1)
    return kv, mamba


def test_factory_builds_a_hicache_storage(daemon, pools):
    kv, mamba = pools
    backend = make_backend("dynamic", statepool_extra(daemon), kv, mamba)
    assert isinstance(backend, HiCacheStorage)
    assert isinstance(backend, StatepoolHiCacheStorage)
    assert backend.settings.socket == daemon.socket
    backend.close()


def test_same_answers_as_sglang_file_backend(daemon, pools, tmp_path):
    kv, mamba = pools
    ours = make_backend("dynamic", statepool_extra(daemon, namespace="equivalence"), kv, mamba)
    file = make_backend("file", {"file_storage_path": str(tmp_path / "hicache")}, kv, mamba)
    assert isinstance(file, HiCacheFile)

    keys_of, sources = populate(ours, kv, mamba)
    keys_file, _ = populate(file, kv, mamba)
    assert keys_of == keys_file

    for label, keys, trailing in queries(keys_of):
        a = normalized(ours.batch_exists_v2(keys, [mamba_transfer(trailing)]))
        b = normalized(file.batch_exists_v2(keys, [mamba_transfer(trailing)]))
        assert a == b, label
        assert ours.batch_exists(keys) == file.batch_exists(keys), label
    # A few by hand, so that agreement is not agreement on nothing.
    full = keys_of["full"]
    assert normalized(ours.batch_exists_v2(full, [mamba_transfer([full[-1]])])) == \
        (6, {"kv": 6, "mamba": 6}, [2, 6])
    mm = keys_of["missing_middle"]
    assert normalized(ours.batch_exists_v2(mm, [mamba_transfer([mm[-1]])])) == \
        (2, {"kv": 2, "mamba": 2}, [2])
    tail = keys_of["missing_tail_state"]
    assert normalized(ours.batch_exists_v2(tail, [mamba_transfer([tail[-1]])])) == \
        (2, {"kv": 4, "mamba": 2}, [2])
    assert normalized(ours.batch_exists_v2(keys_of["no_states"],
                                           [mamba_transfer([keys_of["no_states"][-1]])])) == \
        (0, {"kv": 3}, [])
    ours.close()


def test_reads_back_bit_exact_into_other_slots(daemon, pools, tmp_path):
    kv, mamba = pools
    ours = make_backend("dynamic", statepool_extra(daemon, namespace="exact"), kv, mamba)
    file = make_backend("file", {"file_storage_path": str(tmp_path / "hicache")}, kv, mamba)
    for backend in (ours, file):
        keys = page_keys("exact", 3)
        assert store_kv(backend, kv, keys, [0, 1, 2])
        assert backend.batch_set_v2([mamba_transfer(keys, [0, 1, 2])])[PoolName.MAMBA] == [True] * 3

        # Into other pages and slots of the same pools.
        assert load_kv(backend, kv, keys, [10, 11, 12]) == [True] * 3
        res = backend.batch_get_v2([mamba_transfer(keys, [8, 9, 10])])
        assert res[PoolName.MAMBA] == [True] * 3
        for src, dst in ((0, 10), (1, 11), (2, 12)):
            assert torch.equal(kv.get_data_page(src * PAGE), kv.get_data_page(dst * PAGE))
        for src, dst in ((0, 8), (1, 9), (2, 10)):
            assert torch.equal(mamba.temporal_buffer[src], mamba.temporal_buffer[dst])
            assert torch.equal(mamba.conv_buffer[0][src], mamba.conv_buffer[0][dst])
            assert torch.equal(mamba.get_data_page(src), mamba.get_data_page(dst))
        # Reset the targets between backends.
        kv.kv_buffer[:, 10 * PAGE:13 * PAGE] = 0
        mamba.temporal_buffer[8:11] = 0
        mamba.conv_buffer[0][8:11] = 0
    # A key that was never stored fails without touching the target.
    missing = page_keys("absent", 1)
    assert ours.batch_get_v2([mamba_transfer(missing, [8])])[PoolName.MAMBA] == [False]
    assert ours.batch_get_v1(missing, token_indices([10])) == [False]
    assert not mamba.temporal_buffer[8].any()
    ours.close()


@pytest.mark.parametrize("allocator", ["default", "shm"])
@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct", "page_head"])
def test_every_host_kv_layout_both_paths(daemon, layout, allocator):
    """SGLang's zero-copy v1 path and its generic flat-page path, for every host KV layout, from
    private memory (one copy through a staging buffer) and from SGLang's shared memory (the
    daemon reads and writes the pool in place, except page_head: one copy)."""
    kv = kv_pool(layout=layout, dtype=torch.float16, heads=3, head_dim=8, allocator=allocator)
    fill(kv, None, 2)
    ours = make_backend("dynamic", statepool_extra(daemon, namespace=f"layout-{layout}-{allocator}",
                                                   kv_codec="fp8"), kv, None)
    keys = page_keys(layout, 2)
    assert ours.batch_set_v1(keys, token_indices([0, 1])) == [True, True]
    assert ours.batch_get_v1(keys, token_indices([5, 6])) == [True, True]
    zero_copy = allocator == "shm" and layout != "page_head"
    assert (ours.stats()["bytes_copied"] == 0) == zero_copy
    # The generic path: flat data pages in the pool's own order.
    keys2 = page_keys(layout + "-flat", 1)
    assert ours.batch_set(keys2, [kv.get_data_page(2 * PAGE)])
    out = ours.batch_get(keys2, [kv.get_dummy_flat_data_page()])
    assert out[0] is not None
    kv.set_from_flat_data_page(7 * PAGE, out[0])
    for src, dst in ((0, 5), (1, 6), (2, 7)):
        # fp8 is lossy: what comes back is the float8 e4m3 value of each fp16 value.
        want = kv.get_data_page(src * PAGE).to(torch.float8_e4m3fn).to(torch.float16)
        assert torch.equal(kv.get_data_page(dst * PAGE), want), (layout, src)
    assert ours.exists(keys[0]) and not ours.exists(page_keys("nope", 1)[0])
    assert ours.batch_exists(keys + page_keys("nope", 1) + keys2) == 2  # the run ends at a miss
    ours.close()


def test_stepquant6_state_within_the_codec_bound(daemon, pools):
    kv, mamba = pools
    ours = make_backend("dynamic", statepool_extra(daemon, namespace="sq6",
                                                   state_codec="stepquant6"), kv, mamba)
    keys = page_keys("sq6", 2)
    assert ours.batch_set_v2([mamba_transfer(keys, [0, 1])])[PoolName.MAMBA] == [True, True]
    assert ours.batch_get_v2([mamba_transfer(keys, [4, 5])])[PoolName.MAMBA] == [True, True]
    for src, dst in ((0, 4), (1, 5)):
        a, b = mamba.temporal_buffer[src], mamba.temporal_buffer[dst]
        err = (a - b).abs().max() / a.abs().max()
        assert 0 < err <= 4e-2, err  # tests/python/test_client.py's bound for stepquant6
        assert torch.equal(mamba.conv_buffer[0][src], mamba.conv_buffer[0][dst])  # raw
    # A stepquant6 entry is not an fp32 entry: another codec's backend misses it.
    fp32 = make_backend("dynamic", statepool_extra(daemon, namespace="sq6"), kv, mamba)
    assert fp32.batch_get_v2([mamba_transfer(keys, [6, 7])])[PoolName.MAMBA] == [False, False]
    ours.close()
    fp32.close()


def test_killed_daemon_fails_quietly_and_recovers(tmp_path, pools, caplog):
    kv, mamba = pools
    d = start_daemon(tmp_path / "d")
    ours = make_backend("dynamic", statepool_extra(d, namespace="kill"), kv, mamba)
    keys = page_keys("kill", 2)
    assert store_kv(ours, kv, keys, [0, 1])
    assert ours.batch_set_v2([mamba_transfer(keys, [0, 1])])[PoolName.MAMBA] == [True, True]
    kill_daemon(d)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="statepool.sglang"):
        t0 = time.monotonic()
        for _ in range(3):
            assert ours.batch_exists(keys) == 0
            result = ours.batch_exists_v2(keys, [mamba_transfer([keys[-1]])])
            assert normalized(result) == (0, {}, [])
            assert ours.batch_get_v1(keys, token_indices([4, 5])) == [False, False]
            assert ours.batch_set_v1(keys, token_indices([4, 5])) == [False, False]
            assert ours.batch_get_v2([mamba_transfer(keys, [4, 5])])[PoolName.MAMBA] == [False] * 2
            assert ours.batch_set_v2([mamba_transfer(keys, [4, 5])])[PoolName.MAMBA] == [False] * 2
            assert ours.get(keys[0], kv.get_dummy_flat_data_page()) is None
            assert not ours.set(keys[0], kv.get_data_page(0))
            assert not ours.exists(keys[0])
        assert time.monotonic() - t0 < 5
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert "unreachable" in warnings[0].getMessage()

        d = start_daemon(tmp_path / "d")  # same socket path; a new, empty pool
        try:
            deadline = time.monotonic() + 10
            while not store_kv(ours, kv, keys, [0, 1]):
                assert time.monotonic() < deadline, "no recovery"
                time.sleep(0.1)
            assert ours.batch_set_v2([mamba_transfer(keys, [0, 1])])[PoolName.MAMBA] == [True] * 2
            assert normalized(ours.batch_exists_v2(keys, [mamba_transfer([keys[-1]])])) == \
                (2, {"kv": 2, "mamba": 2}, [1, 2])
            assert ours.batch_get_v2([mamba_transfer(keys, [4, 5])])[PoolName.MAMBA] == [True] * 2
            assert torch.equal(mamba.temporal_buffer[0], mamba.temporal_buffer[4])
            assert any("recovered" in r.getMessage() for r in caplog.records)
            assert ours.stats()["reconnects"] >= 1
        finally:
            ours.close()
            assert d.stop() == 0, d.log()


def test_sglang_random_failure_wrapper(daemon, pools, monkeypatch):
    kv, mamba = pools
    monkeypatch.setenv("SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE", "0.5")
    wrapped = make_backend("dynamic", statepool_extra(daemon, namespace="inject"), kv, mamba)
    assert isinstance(wrapped, HiCacheStorageFailureInjector)
    keys = page_keys("inject", 4)
    for _ in range(20):
        ok = wrapped.batch_set_v1(keys, token_indices([0, 1, 2, 3]))
        assert len(ok) == 4
        res = wrapped.batch_set_v2([mamba_transfer(keys, [0, 1, 2, 3])])
        assert len(res[PoolName.MAMBA]) == 4
        got = wrapped.batch_get_v2([mamba_transfer(keys, [8, 9, 10, 11])])
        for i, hit in enumerate(got[PoolName.MAMBA]):
            if hit:  # a hit is always the right bytes
                assert torch.equal(mamba.temporal_buffer[i], mamba.temporal_buffer[8 + i])
        r = wrapped.batch_exists_v2(keys, [mamba_transfer([keys[-1]])])
        assert r.kv_hit_pages in (0, 4)
    wrapped._backend.close()


def test_full_pool_and_refused_codec_are_misses(daemon, pools, tmp_path, caplog):
    kv, mamba = pools
    # The tenant "small" has a 4 MiB quota: its 64 MiB KV arena is refused.
    small = make_backend("dynamic", statepool_extra(daemon, namespace="quota", tenant="small",
                                                    kv_arena_mib=64), kv, mamba)
    keys = page_keys("quota", 2)
    with caplog.at_level(logging.WARNING, logger="statepool.sglang"):
        for _ in range(3):
            assert small.batch_set_v1(keys, token_indices([0, 1])) == [False, False]
            assert small.batch_exists(keys) == 0
    assert len([r for r in caplog.records if "quota" in r.getMessage().lower()]) == 1
    small.close()

    # A STEPQuant plan calibrated for another shape: the daemon refuses the layout.
    other = statepool.StateLayout(arch=statepool.Arch.gdn, num_layers=5, num_heads=2, key_dim=16,
                                  value_dim=16, codec=statepool.CodecId.fp32)
    plan_path = tmp_path / "other.plan"
    statepool.Plan.nominal(other, 6).save(str(plan_path))
    refused = make_backend("dynamic", statepool_extra(daemon, namespace="refused",
                                                      state_codec="stepquant6",
                                                      state_plan=str(plan_path)), kv, mamba)
    assert refused.batch_set_v2([mamba_transfer(keys, [0, 1])])[PoolName.MAMBA] == [False, False]
    assert refused.batch_get_v2([mamba_transfer(keys, [2, 3])])[PoolName.MAMBA] == [False, False]
    # The KV side does not depend on the state codec.
    assert refused.batch_set_v1(keys, token_indices([0, 1])) == [True, True]
    refused.close()

    with pytest.raises(ValueError, match="state_codec"):
        StorageBackendFactory.create_backend(
            "dynamic", storage_config(statepool_extra(daemon, state_codec="int7")), kv)


def test_tensor_parallel_ranks_and_models_do_not_share_entries(daemon, pools):
    kv, mamba = pools
    a = make_backend("dynamic", statepool_extra(daemon), kv, mamba, model="m/a")
    b = make_backend("dynamic", statepool_extra(daemon), kv, mamba, model="m/b")
    keys = page_keys("iso", 2)
    assert store_kv(a, kv, keys, [0, 1])
    assert a.batch_exists(keys) == 2 and b.batch_exists(keys) == 0
    a.close()
    b.close()


def test_second_daemon_on_the_same_redis_hits(tmp_path, pools, redis_server):
    kv, mamba = pools
    remote = ["--snapshot-remote", redis_server]
    d1 = start_daemon(tmp_path / "a", remote)
    d2 = start_daemon(tmp_path / "b", remote)
    try:
        first = make_backend("dynamic", statepool_extra(d1, namespace="redis"), kv, mamba)
        keys = page_keys("redis", 3)
        assert store_kv(first, kv, keys, [0, 1, 2])
        assert first.batch_set_v2([mamba_transfer(keys, [0, 1, 2])])[PoolName.MAMBA] == [True] * 3
        second = make_backend("dynamic", statepool_extra(d2, namespace="redis"), kv, mamba)
        # The remote writes happen after the replies: wait until the second daemon sees them.
        deadline = time.monotonic() + 10
        while normalized(second.batch_exists_v2(keys, [mamba_transfer([keys[-1]])])) != \
                (3, {"kv": 3, "mamba": 3}, [1, 2, 3]):
            assert time.monotonic() < deadline, "the second daemon never hit"
            time.sleep(0.1)
        assert second.batch_get_v1(keys, token_indices([8, 9, 10])) == [True] * 3
        assert second.batch_get_v2([mamba_transfer(keys, [8, 9, 10])])[PoolName.MAMBA] == [True] * 3
        for src, dst in ((0, 8), (1, 9), (2, 10)):
            assert torch.equal(kv.get_data_page(src * PAGE), kv.get_data_page(dst * PAGE))
            assert torch.equal(mamba.temporal_buffer[src], mamba.temporal_buffer[dst])
        with statepool.connect(d2.socket, tenant="team-a") as c:
            tenant = [t for t in c.stats().tenants if t.tenant == "team-a"][0]
            assert tenant.snapshot_hits_remote >= 3
        first.close()
        second.close()
    finally:
        assert d1.stop() == 0, d1.log()
        assert d2.stop() == 0, d2.log()


def test_entries_are_plain_statepool_snapshots(daemon, pools):
    """What the backend stores is readable by any statepool client of the namespace, in
    statepool's conventions: the state as [layer][head][key][value] (SGLang keeps [value][key])
    with the conv state after it, the KV page as KV blocks [layer][K, V][token][channels]."""
    kv, mamba = pools
    ours = make_backend("dynamic", statepool_extra(daemon, namespace="interop"), kv, mamba)
    keys = page_keys("interop", 1)
    assert store_kv(ours, kv, keys, [3])
    assert ours.batch_set_v2([mamba_transfer(keys, [2])])[PoolName.MAMBA] == [True]

    L, H, V, K = mamba.temporal_buffer.shape[1], *mamba.temporal_buffer.shape[3:]
    C, W = mamba.conv_buffer[0].shape[3:]
    layout = statepool.StateLayout(arch=statepool.Arch.gdn, num_layers=L, num_heads=H,
                                   key_dim=K, value_dim=V, conv_channels=C, conv_width=W,
                                   conv_dtype=statepool.DType.bf16, codec=statepool.CodecId.fp32)
    with daemon.connect() as conn:
        info = conn.register_layout(layout)
        arena = conn.open_arena(info, 4)
        with conn.open_staging(info.state_bytes_f32) as staging, conn.allocate(arena)[0] as slot:
            assert conn.get_snapshot(ours._prefix("mamba", keys[0]), 0, slot).hit
            conn.decompress(slot, staging)
            state = torch.from_dlpack(staging.view("float32", (L, H, K, V)))
            conv = torch.from_dlpack(staging.view("bfloat16", (L, C, W), L * H * K * V * 4))
            assert torch.equal(state, mamba.temporal_buffer[2, :, 0].transpose(-1, -2))
            assert torch.equal(conv, mamba.conv_buffer[0][2, :, 0])
            del state, conv

        listed = conn.list_snapshots(ours._prefix(ours._kv_geo.kind, keys[0]))
        assert len(listed.snapshots) == 1
        blocks = listed.snapshots[0].kv
        assert (blocks.layers, blocks.key_channels, blocks.tokens) == (kv.layer_num, 32, PAGE)
    ours.close()


def test_pool_eviction_still_hits_from_redis(tmp_path, pools, redis_server):
    """A state evicted from the pool and from the host tier is served by the Redis tier."""
    kv, mamba = pools
    # A host tier of 4 KiB keeps one of these states (3.4 KB) at most.
    d = start_daemon(tmp_path / "a", ["--snapshot-remote", redis_server,
                                      "--snapshot-host-capacity", "4KiB"])
    try:
        # 2 snapshot pages (the backend holds no slot of its own): the third state evicts the
        # first.
        ours = make_backend("dynamic", statepool_extra(d, namespace="evict", state_arena_pages=2),
                            kv, mamba)
        keys = page_keys("evict", 3)
        for i, key in enumerate(keys):
            assert ours.batch_set_v2([mamba_transfer([key], [i])])[PoolName.MAMBA] == [True]
        with statepool.connect(d.socket, tenant="team-a") as c:
            deadline = time.monotonic() + 10
            while True:
                t = [t for t in c.stats().tenants if t.tenant == "team-a"][0]
                if t.snapshot_demotions >= 1:
                    break
                assert time.monotonic() < deadline, "nothing left the pool"
                time.sleep(0.05)
            # The remote writes happen after the replies: poll.
            while ours.batch_get_v2([mamba_transfer(keys[:1], [8])])[PoolName.MAMBA] != [True]:
                assert time.monotonic() < deadline, "the evicted state did not come back"
                time.sleep(0.05)
            assert torch.equal(mamba.temporal_buffer[0], mamba.temporal_buffer[8])
            t = [t for t in c.stats().tenants if t.tenant == "team-a"][0]
            assert t.snapshot_hits_remote >= 1
        ours.close()
    finally:
        assert d.stop() == 0, d.log()


def test_other_geometries_and_format_versions_never_read_each_other(daemon, monkeypatch):
    """KV pages of the same shape and codec but another dtype live under other keys, and so do
    the entries of another format version of this backend: a miss, never wrong bytes."""
    import statepool.sglang as backend_module

    bf16, f16 = kv_pool(dtype=torch.bfloat16), kv_pool(dtype=torch.float16)
    bf16.kv_buffer.normal_()
    f16.kv_buffer.normal_()
    a = make_backend("dynamic", statepool_extra(daemon, namespace="geometry"), bf16, None)
    b = make_backend("dynamic", statepool_extra(daemon, namespace="geometry"), f16, None)
    keys = page_keys("geometry", 2)
    assert a.batch_set_v1(keys, token_indices([0, 1])) == [True, True]
    assert b.batch_exists(keys) == 0
    assert b.batch_set_v1(keys, token_indices([0, 1])) == [True, True]
    assert b.batch_get_v1(keys, token_indices([4, 5])) == [True, True]
    # fp16 values through the bf16 KV codec: their bfloat16 rounding comes back.
    want = f16.get_data_page(0).to(torch.bfloat16).to(torch.float16)
    assert torch.equal(f16.get_data_page(4 * PAGE), want)

    # A later format of this backend, same keys: the old entries are misses.
    monkeypatch.setattr(backend_module, "_FORMAT", backend_module._FORMAT + 1)
    newer = make_backend("dynamic", statepool_extra(daemon, namespace="geometry"), bf16, None)
    assert newer._prefix("kv", keys[0]).startswith(f"sgl{backend_module._FORMAT}/")
    bf16.kv_buffer[:, 8 * PAGE:10 * PAGE] = 0
    assert newer.batch_exists(keys) == 0
    assert newer.batch_get_v1(keys, token_indices([8, 9])) == [False, False]
    assert not bf16.kv_buffer[:, 8 * PAGE:10 * PAGE].any()
    assert a.batch_exists(keys) == 2  # the old format's backend still reads its own
    for backend in (a, b, newer):
        backend.close()


@pytest.mark.parametrize("allocator", ["default", "shm"])
def test_concurrent_prefetch_and_backup_threads(daemon, allocator):
    """SGLang calls the backend from its prefetch and backup threads at once (each thread on a
    connection of its own)."""
    import threading

    kv, mamba = kv_pool(allocator=allocator), mamba_pool(allocator=allocator)
    fill(kv, mamba, 1)
    ours = make_backend("dynamic", statepool_extra(daemon, namespace=f"threads-{allocator}"), kv,
                        mamba)
    keys = page_keys("threads", 4)
    assert store_kv(ours, kv, keys, [0, 1, 2, 3])
    assert ours.batch_set_v2([mamba_transfer(keys, [0, 1, 2, 3])])[PoolName.MAMBA] == [True] * 4
    errors = []

    def writer():
        try:
            for r in range(20):
                more = page_keys(f"threads-{allocator}-w{r}", 2)
                assert ours.batch_set_v1(more, token_indices([4, 5])) == [True, True]
                assert ours.batch_set_v2([mamba_transfer(more, [4, 5])])[PoolName.MAMBA] == \
                    [True, True]
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    def reader():
        try:
            for _ in range(20):
                r = ours.batch_exists_v2(keys, [mamba_transfer([keys[-1]])])
                assert r.kv_hit_pages == 4
                assert ours.batch_get_v1(keys, token_indices([8, 9, 10, 11])) == [True] * 4
                got = ours.batch_get_v2([mamba_transfer(keys, [8, 9, 10, 11])])
                assert got[PoolName.MAMBA] == [True] * 4
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for i in range(4):
        assert torch.equal(mamba.temporal_buffer[i], mamba.temporal_buffer[8 + i])
        assert torch.equal(kv.get_data_page(i * PAGE), kv.get_data_page((8 + i) * PAGE))
    ours.close()


def test_clear_deletes_this_namespace_only(daemon, pools):
    kv, mamba = pools
    ours = make_backend("dynamic", statepool_extra(daemon, namespace="clear"), kv, mamba)
    other = make_backend("dynamic", statepool_extra(daemon, namespace="clear-other"), kv, mamba)
    keys = page_keys("clear", 2)
    for backend in (ours, other):
        assert store_kv(backend, kv, keys, [0, 1])
        assert backend.batch_set_v2([mamba_transfer(keys, [0, 1])])[PoolName.MAMBA] == [True] * 2
    assert ours.clear()
    assert ours.batch_exists(keys) == 0
    assert ours.batch_get_v2([mamba_transfer(keys, [4, 5])])[PoolName.MAMBA] == [False] * 2
    assert normalized(other.batch_exists_v2(keys, [mamba_transfer([keys[-1]])])) == \
        (2, {"kv": 2, "mamba": 2}, [1, 2])
    ours.close()
    other.close()


def test_hung_daemon_times_out_and_recovers(tmp_path, pools):
    """A daemon that stops answering (SIGSTOP, waited for until the daemon is stopped): calls
    fail after `timeout`, then at once until `retry_interval` passes; after SIGCONT the backend
    reconnects and hits again."""
    import signal

    kv, mamba = pools
    d = start_daemon(tmp_path / "d")
    try:
        ours = make_backend("dynamic", statepool_extra(d, namespace="hang", timeout=0.3,
                                                       retry_interval=0.5), kv, mamba)
        keys = page_keys("hang", 2)
        assert store_kv(ours, kv, keys, [0, 1])
        stop_daemon_process(d)
        try:
            t0 = time.monotonic()
            assert ours.batch_exists(keys) == 0
            assert ours.batch_get_v1(keys, token_indices([4, 5])) == [False, False]
            assert time.monotonic() - t0 < 3
        finally:
            d.process.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 10
        while ours.batch_exists(keys) != 2:
            assert time.monotonic() < deadline, "no recovery"
            time.sleep(0.1)
        assert ours.batch_get_v1(keys, token_indices([4, 5])) == [True, True]
        assert torch.equal(kv.get_data_page(0), kv.get_data_page(4 * PAGE))
        ours.close()
    finally:
        assert d.stop() == 0, d.log()
