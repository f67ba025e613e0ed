"""statepool's vLLM offloading spec (python/statepool/vllm.py) driven by vLLM 0.32's own
classes without an engine: its Scheduler (hybrid KV-cache manager, Mamba align mode, the
OffloadingConnector's scheduler side calling statepool's manager) and a WORKER-role connector
over CPU page tensors (calling statepool's worker), against live statepoold processes. Each
``Harness`` stands for one engine; two of them in turn are two engines sharing the daemon."""

from __future__ import annotations

import dataclasses
import signal
import time

import numpy as np
import pytest
import torch
from conftest import (
    REPORT,
    TENANT,
    Harness,
    connect,
    extra_config,
    kill_daemon,
    prompt,
    start_daemon,
    stop_daemon_process,
)

import statepool
from statepool import vllm as sv
from statepool._vllm_geometry import _sliced_plan

CACHED = 256  # a 300-token prompt: two full blocks of 128, the last prompt token recomputed


def run_one(h: Harness, request_id: str, ids, **kw) -> int:
    """Adds a request and runs the harness until it is done; returns the tokens it got from
    statepool (its computed tokens after its first schedule)."""
    req = h.add(request_id, ids)
    h.step(**kw)
    got = req.num_computed_tokens if req.status.name == "WAITING_FOR_REMOTE_KVS" else 0
    h.run(**kw)
    return got


def stored_blocks(h: Harness) -> dict:
    """key -> (group id, block) of every entry the harness's worker stored."""
    return {k: b for store, keys, blocks in h.jobs if store and keys
            for k, b in zip(keys, blocks)}


def loaded_blocks(h: Harness) -> list:
    return [(k, b) for store, keys, blocks in h.jobs if not store and keys
            for k, b in zip(keys, blocks)]


def state_values(page: torch.Tensor) -> np.ndarray:
    """The recurrent state of a tiny-model Mamba page, as float32."""
    conv = 3 * 512 * 2
    return page[conv:].numpy().view(np.float32)


def assert_pages_equal(a: Harness, b: Harness) -> int:
    """B's loaded pages are A's stored ones, byte for byte; returns how many were compared."""
    stored = stored_blocks(a)
    loaded = loaded_blocks(b)
    assert loaded
    for key, (gid, block) in loaded:
        a_gid, a_block = stored[key]
        assert a_gid == gid
        for layer in range(2):
            assert torch.equal(a.page(gid, layer, a_block), b.page(gid, layer, block)), \
                f"group {gid} layer {layer}: B's block {block} is not A's block {a_block}"
    return len(loaded)


# -- the round trip ------------------------------------------------------------------------------


def test_an_engine_loads_what_another_stored_byte_for_byte(daemon, harnesses):
    """Engine A stores the Mamba state at 256 tokens and the two attention blocks; engine B
    (fresh scheduler, worker and connections) finds them with one lookup request, loads them
    in one job, and its pages equal A's (fp32 state codec, bf16 KV codec: exact)."""
    a = harnesses(extra_config(daemon.socket))
    a.fill(1)
    assert run_one(a, "r0", prompt(1)) == 0
    stored = stored_blocks(a)
    assert sorted(gid for gid, _ in stored.values()) == [0, 1, 1]  # one state, two KV blocks
    sa, wa = a.manager.stats(), a.worker.stats()
    assert sa["store_keys"] == 3 and wa["puts"] == 3 and wa["failed_store_jobs"] == 0
    assert wa["bytes_stored"] == 2 * 134144 + 2 * 2 * 262144

    b = harnesses(extra_config(daemon.socket))
    assert run_one(b, "r0", prompt(1)) == CACHED
    assert assert_pages_equal(a, b) == 3
    sb, wb = b.manager.stats(), b.worker.stats()
    assert sb["lookup_hits"] == sb["lookups"] == 3
    assert sb["lookup_requests"] == 1  # every key of the request in one request
    assert wb["gets"] == 3 and wb["failed_load_jobs"] == 0
    assert wb["round_trips"] == 2  # one get per arena: the states' and the KV blocks'
    assert wb["bytes_loaded"] == wb["bytes_copied"] == wa["bytes_stored"]  # one copy

    with connect(daemon) as conn:
        listed = conn.list_snapshots(sv.KEY_PREFIX).snapshots
        tenant = next(t for t in conn.stats().tenants if t.tenant == TENANT)
    assert {e.layout_name for e in listed} >= {"vllm-state-2x2x128x128", "vllm-kv"}
    assert tenant.snapshot_hits >= 3


def test_one_lookup_request_per_request_and_step(daemon, harnesses):
    """A 900-token prompt has 7 keys per group: vLLM asks about them one at a time, the
    manager asks the daemon once for all of them (and every stored block loads)."""
    a = harnesses(extra_config(daemon.socket))
    a.fill(2)
    ids = prompt(2, 900)
    run_one(a, "long", ids)
    b = harnesses(extra_config(daemon.socket))
    assert run_one(b, "long", ids) == 896
    s = b.manager.stats()
    assert s["lookups"] >= 8 and s["lookup_requests"] == 1, s
    assert s["lookup_keys_sent"] == 14
    assert len(loaded_blocks(b)) == 1 + 7  # the state at 896 and seven KV blocks
    assert_pages_equal(a, b)


def test_stepquant6_states(daemon, harnesses):
    """state_codec stepquant6 (nominal plan): the loaded state is the stored one within the
    codec's error, the conv state and the KV blocks are exact."""
    extra = extra_config(daemon.socket, state_codec="stepquant6")
    a = harnesses(extra)
    a.fill(3)
    run_one(a, "q", prompt(3))
    b = harnesses(extra)
    assert run_one(b, "q", prompt(3)) == CACHED
    stored = stored_blocks(a)
    worst = 0.0
    for key, (gid, block) in loaded_blocks(b):
        _, a_block = stored[key]
        for layer in range(2):
            pa, pb = a.page(gid, layer, a_block), b.page(gid, layer, block)
            if gid == 1:
                assert torch.equal(pa, pb)
                continue
            conv = 3 * 512 * 2
            assert torch.equal(pa[:conv], pb[:conv])
            va, vb = state_values(pa), state_values(pb)
            rel = float(np.linalg.norm(va - vb) / np.linalg.norm(va))
            worst = max(worst, rel)
    assert 0 < worst < 0.05, worst
    REPORT.append(f"stepquant6 (nominal plan): relative L2 error of the loaded states "
                  f"{worst:.4f}")


# -- what never mixes -------------------------------------------------------------------------


@pytest.mark.parametrize("change", [{"namespace": "another-deployment"}, {"kv_codec": "fp8"},
                                    {"state_codec": "bf16"}, {"tenant": "small"}])
def test_entries_of_other_settings_are_not_read(daemon, harnesses, change):
    """Another namespace, KV codec or state codec: other keys (and layouts), so engine B
    misses what engine A stored and computes the prompt itself. Another tenant: another
    snapshot namespace in the daemon. (A request needs the state and the KV blocks: with only
    the state codec changed the KV blocks are found, the states are not.)"""
    a = harnesses(extra_config(daemon.socket))
    a.fill(4)
    ids = prompt(40 + len(str(change)))
    run_one(a, "x", ids)
    b = harnesses(extra_config(daemon.socket, **change))
    assert run_one(b, "x", ids) == 0
    assert not loaded_blocks(b)


# -- failures: never an exception into vLLM ---------------------------------------------------


def test_dead_daemon_gives_misses_logged_once(tmp_path, harnesses, spec_log):
    d = start_daemon(tmp_path / "d")
    kill_daemon(d)
    b = harnesses(extra_config(d.socket, retry_interval=0))
    for i in range(3):
        assert run_one(b, f"r{i}", prompt(50 + i)) == 0
    s, w = b.manager.stats(), b.worker.stats()
    assert s["lookup_hits"] == 0 and s["failures"] >= 3
    assert w["failed_store_jobs"] == w["store_jobs"] > 0
    warnings = [r.getMessage() for r in spec_log.records if "cannot connect" in r.getMessage()]
    # one warning per process part (scheduler and worker), however often it failed
    assert len(warnings) == 2, warnings


def test_daemon_killed_between_lookup_and_load_recomputes(tmp_path, harnesses):
    """The lookup hits, the daemon dies before the worker reads: the load job fails,
    StatepoolConnector reports the request as failed_recving, vLLM (policy recompute) sets
    it back to 0 computed tokens and runs it to the end."""
    d = start_daemon(tmp_path / "d")
    a = harnesses(extra_config(d.socket))
    a.fill(6)
    run_one(a, "r", prompt(6))
    b = harnesses(extra_config(d.socket))
    killed = []

    def kill_before_the_load(so):
        if so.kv_connector_metadata.load_jobs and not killed:
            kill_daemon(d)
            killed.append(True)

    req = b.add("r", prompt(6))
    b.step(before_worker=kill_before_the_load)
    assert killed and req.status.name == "WAITING_FOR_REMOTE_KVS"
    b.run(before_worker=kill_before_the_load)
    w = b.worker.stats()
    assert w["failed_load_jobs"] == 1 and w["gets"] == 0
    assert req.is_finished() and req.num_output_tokens == 4


def test_hung_daemon_costs_the_scheduler_one_lookup_timeout(tmp_path, harnesses):
    d = start_daemon(tmp_path / "d")
    try:
        stop_daemon_process(d)
        b = harnesses(extra_config(d.socket, lookup_timeout=0.3, timeout=0.5,
                                   retry_interval=30))
        t0 = time.monotonic()
        b.add("r0", prompt(7))
        b.step()
        first = time.monotonic() - t0
        t1 = time.monotonic()
        b.add("r1", prompt(8))
        b.step()
        second = time.monotonic() - t1
        assert first < 2.0 and second < 0.25, (first, second)
        assert b.manager.stats()["lookup_hits"] == 0
    finally:
        d.process.send_signal(signal.SIGCONT)
        d.stop()


def test_full_tenant_fails_stores_not_vllm(daemon, harnesses, spec_log):
    """Tenant `small` (4 MiB quota) cannot hold the state arena: stores fail (one warning),
    vLLM runs on, and a second engine misses."""
    extra = extra_config(daemon.socket, tenant="small", state_arena_pages=64, kv_arena_mib=1)
    a = harnesses(extra)
    a.fill(9)
    run_one(a, "r", prompt(9))
    run_one(a, "r2", prompt(10))
    assert a.worker.stats()["failed_store_jobs"] >= 1
    assert any("refused" in r.getMessage() or "quota" in r.getMessage().lower()
               for r in spec_log.records), [r.getMessage() for r in spec_log.records]
    b = harnesses(extra)
    assert run_one(b, "r", prompt(9)) == 0


def test_vllms_own_connector_is_refused_where_it_cannot_take_a_failed_load(daemon, model_dir):
    if sv.VLLM_REPORTS_FAILED_LOADS:
        pytest.skip("this vLLM reports failed loads itself: its OffloadingConnector is fine")
    with pytest.raises(ValueError, match="StatepoolConnector"):
        Harness(model_dir, extra_config(daemon.socket), connector="OffloadingConnector")


def test_unknown_codec_fails_at_startup(daemon, model_dir):
    with pytest.raises(Exception, match="unknown state_codec"):
        Harness(model_dir, extra_config(daemon.socket, state_codec="zip"))


# -- vLLM 0.34's worker interface ---------------------------------------------------------------


@dataclasses.dataclass
class DevicePointers:
    """vLLM 0.34's DevicePointers (v1/kv_offload/base.py), which 0.32 lacks: for each group,
    for each layer, for each block, the page's address and size."""

    ptrs: np.ndarray
    sizes: np.ndarray
    group_block_counts: tuple
    group_data_ref_counts: tuple
    block_indices: tuple


def test_device_pointers_of_vllm_0_34(daemon, harnesses):
    """A load submitted as vLLM 0.34 submits it (DevicePointers, expedited) lands in the same
    pages as through 0.32's GPULoadStoreSpec."""
    a = harnesses(extra_config(daemon.socket))
    a.fill(11)
    run_one(a, "r", prompt(11))
    b = harnesses(extra_config(daemon.socket))
    b.fill(12)
    w = b.worker
    keys = [k for _, ks, _ in a.jobs for k in ks]
    targets = {0: [5], 1: [6, 7]}
    ptrs, sizes = [], []
    for gid in (0, 1):
        for layer in w._pages[gid]:
            for block in targets[gid]:
                ptrs.append(layer.data_ptr() + block * layer.stride(0))
                sizes.append(w._geo.groups[gid].page_bytes)
    dp = DevicePointers(np.array(ptrs, dtype=np.uint64), np.array(sizes, dtype=np.uint64),
                        (1, 2), (2, 2), (1, 0))
    assert w._blocks(dp) == [(0, 5), (1, 6), (1, 7)]
    assert w.submit_load(1000, sv.StatepoolKeys(keys), dp, expedited=True)
    w.wait({1000})
    [result] = [r for r in w.get_finished() if r.job_id == 1000]
    assert result.success
    stored = stored_blocks(a)
    for key, (gid, block) in zip(keys, [(0, 5), (1, 6), (1, 7)]):
        for layer in range(2):
            assert torch.equal(a.page(gid, layer, stored[key][1]), b.page(gid, layer, block))


# -- the host and Redis tiers: another node ------------------------------------------------


def test_another_node_loads_through_redis(tmp_path, harnesses, redis_server):
    """Two daemons (two nodes) share a Redis: engine B on the second finds engine A's entries
    in the remote tier (lookup) and loads them from there."""
    remote = ["--snapshot-remote", redis_server]
    d1 = start_daemon(tmp_path / "node1", remote)
    d2 = start_daemon(tmp_path / "node2", remote)
    try:
        a = harnesses(extra_config(d1.socket))
        a.fill(13)
        run_one(a, "r", prompt(13))
        b = harnesses(extra_config(d2.socket))
        assert run_one(b, "r", prompt(13)) == CACHED
        assert_pages_equal(a, b)
        with connect(d2) as conn:
            tenant = next(t for t in conn.stats().tenants if t.tenant == TENANT)
        assert tenant.snapshot_hits_remote == 3
    finally:
        d1.stop()
        d2.stop()


# -- plans ----------------------------------------------------------------------------------


def test_a_model_plan_is_cut_to_each_group_and_rank():
    """A calibrated plan covers every gated-delta-rule layer and head of the model; a group
    holds some layers and a tensor-parallel rank some heads: the plan of a group is those rows."""
    layers, heads, k, v = 4, 4, 8, 8
    widths = [6 if (u % 3) else 16 for u in range(layers * heads)]
    impact = [1.0 + 0.01 * i for i in range(layers * heads * k)]
    plan = statepool.Plan(arch=statepool.Arch.gdn, num_layers=layers, num_heads=heads, key_dim=k,
                          value_dim=v, budget_bits=6, widths=widths, impact=impact, source="t")
    cut = _sliced_plan(plan, [1, 3], heads=2, rank=1, tp_size=2)
    assert (cut.num_layers, cut.num_heads) == (2, 2)
    units = [1 * heads + 2, 1 * heads + 3, 3 * heads + 2, 3 * heads + 3]
    assert cut.widths == [widths[u] for u in units]
    stored = plan.impact  # float32 values
    assert cut.impact == [stored[u * k + r] for u in units for r in range(k)]


# -- vLLM's own OffloadingConnector (0.34+) --------------------------------------------------


def test_under_vllms_own_connector_the_spec_finds_the_kv_cache_config(daemon, model_dir,
                                                                       monkeypatch):
    """vLLM's OffloadingConnector builds the spec inside its __init__, whose kv_cache_config
    argument the spec reads (OffloadingConfig has no per-group specs). Where vLLM reports failed
    loads itself (0.34+) that is all the spec needs; here it is pretended."""
    from statepool import vllm as module
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
        build_offloading_config,
    )
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    h = Harness(model_dir, extra_config(daemon.socket))
    try:
        monkeypatch.setattr(module, "VLLM_REPORTS_FAILED_LOADS", True)

        def offloading_connector_init(vllm_config, kv_cache_config):
            # what OffloadingConnector.__init__ does (0.32 and 0.34)
            config = build_offloading_config(vllm_config, kv_cache_config)
            return OffloadingSpecFactory.create_spec(config)

        spec = offloading_connector_init(h.vc, h.kcc)
        assert isinstance(spec, module.StatepoolOffloadingSpec)
        geo = spec.geometry(0)
        assert sorted(geo.groups) == [0, 1] and not geo.refused
        assert geo.groups[0].layout == h.manager._geometries[0].groups[0].layout
    finally:
        h.close()


def test_vllms_prometheus_logger_takes_the_managers_counters(daemon, harnesses):
    """vLLM's KVConnectorProm (what `vllm serve` exports) built for StatepoolConnector takes
    the manager's stats of a step: statepool's counters are in its Prometheus registry."""
    import prometheus_client
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorProm

    a = harnesses(extra_config(daemon.socket))
    a.fill(14)
    run_one(a, "r", prompt(14))
    b = harnesses(extra_config(daemon.socket))
    taken = []
    get_stats = b.manager.get_stats
    b.manager.get_stats = lambda: taken.append(get_stats()) or taken[-1]
    assert run_one(b, "r", prompt(14)) == CACHED
    stats = [s for s in taken if s is not None]
    assert stats, "vLLM's scheduler never asked the manager for its stats"
    prom = KVConnectorProm(b.vc, ["model_name", "engine"], {0: ["tiny", "0"]})
    for s in stats:
        prom.observe(s.data, 0)
    value = prometheus_client.REGISTRY.get_sample_value(
        "vllm:statepool_lookup_hits_total", {"model_name": "tiny", "engine": "0"})
    assert value == 3
