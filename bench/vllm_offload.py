#!/usr/bin/env python3
"""statepool's vLLM offloading spec (statepool.vllm) at Qwen3-Next-80B-A3B size: what vLLM's
offloading connector waits for when it stores and loads a block, and a request, with the
state codec lossless (fp32) and stepquant6 side by side in one run, and what the daemon keeps
per request (issue 44).

    PY=$(scripts/vllm-venv)
    PYTHONPATH=build/python $PY bench/vllm_offload.py [--blocks 16] [--repeats 7]

(about a minute on 2 cores with the defaults)

Shapes: Qwen3-Next-80B-A3B (docs/models/qwen3-next-80b-a3b-instruct.json) at TP 1, as vLLM's
hybrid KV-cache manager groups it with prefix caching on (Mamba "align" mode): 36
gated-delta-rule layers in 3 Mamba groups of 12 (per layer a conv state 3 x 8,192 bf16 and a
recurrent state 32 x 128 x 128 fp32, 2.05 MiB; a group's block 24.6 MiB), and 12 full-attention
layers in one group (2 KV heads x 256, bf16; the block size vLLM picks so that an attention page
holds a Mamba page: 1,056 tokens, a group's block 24.8 MiB). vLLM's CPU attention page format
[head][K|V][token][head_dim]. A request of --blocks attention blocks (16: 16,896 tokens) stores
and loads what vLLM's connector moves for it: the state at its last full block in each Mamba
group (3 keys) and its attention blocks (16 keys).

What is timed, as vLLM's connector sees it (submit_store / submit_load, then wait until
get_finished reports the job): a store or load job of one Mamba key (store state, load state),
one attention key (store KV, load KV), the request's 4 store jobs submitted together (one per
Mamba group, one with the attention keys: vLLM's split) and its one load job, and the
scheduler's first lookup of the request (one daemon request for every key; vLLM's further
lookups of the step are answered from it). Every repeat stores fresh keys and loads them into
other blocks, checked (fp32: byte for byte; stepquant6: the conv state and KV exact, the state
within 5% relative L2 error). The yardstick: one memcpy of the same page bytes (torch copy into
a buffer), the least any offload that copies does. Times: min and median of --repeats, after
one untimed round, codecs taken in turn. The daemon: build/service/statepoold (or
$STATEPOOL_DAEMON) on a private socket, --workers one per core, host backend.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from typing import Dict, List

warnings.filterwarnings("ignore")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)
from vllm.v1.kv_offload.base import (  # noqa: E402
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    ReqContext,
    make_offload_key,
)
from vllm.v1.kv_offload.config import (  # noqa: E402
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)

import statepool  # noqa: E402
from statepool._vllm_geometry import building_with  # noqa: E402
from statepool.vllm import KEY_PREFIX, StatepoolKeys, StatepoolOffloadingSpec  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODEL = "Qwen/Qwen3-Next-80B-A3B-Instruct"
LAYERS, INTERVAL = 48, 4                     # every 4th layer is full attention
HV, HK, DK, DV, CONV_K = 32, 16, 128, 128, 4
KV_HEADS, HEAD_DIM = 2, 256
CONV_DIM = 2 * HK * DK + HV * DV             # 8,192
BS = 1056                                    # tokens per block (vLLM: attention page >= Mamba)
MAMBA_GROUPS = 3
CODECS = ("fp32", "stepquant6")
OPS = ("store state", "store KV", "load state", "load KV", "lookup request", "store request",
       "load request")
TENANT = "bench"
MAX_STATE_ERROR = 0.05


class BenchError(Exception):
    """A job that failed or moved other bytes: the run stops."""


@dataclass
class Engine:
    """One engine's spec, manager and worker over page tensors of its own."""

    codec: str
    spec: StatepoolOffloadingSpec
    manager: object
    worker: object
    pages: Dict[int, List[torch.Tensor]]     # group id -> per-layer [blocks, page] int8
    unpadded: Dict[int, int]                 # group id -> unpadded page bytes
    next_job: int = 0

    def job(self) -> int:
        self.next_job += 1
        return self.next_job


def model_groups():
    attn = FullAttentionSpec(block_size=BS, num_kv_heads=KV_HEADS, head_size=HEAD_DIM,
                             dtype=torch.bfloat16)
    mamba = MambaSpec(block_size=BS, shapes=((CONV_K - 1, CONV_DIM), (HV, DV, DK)),
                      dtypes=(torch.bfloat16, torch.float32),
                      page_size_padded=attn.page_size_bytes, mamba_cache_mode="align")
    linear = [i for i in range(LAYERS) if (i + 1) % INTERVAL]
    full = [i for i in range(LAYERS) if (i + 1) % INTERVAL == 0]
    per = len(linear) // MAMBA_GROUPS
    groups = [KVCacheGroupSpec([f"model.layers.{i}.linear_attn" for i in linear[g * per:
                                                                                (g + 1) * per]],
                               mamba) for g in range(MAMBA_GROUPS)]
    groups.append(KVCacheGroupSpec([f"model.layers.{i}.self_attn.attn" for i in full], attn))
    return groups, attn, mamba


def make_engine(codec: str, socket: str, blocks: int) -> Engine:
    groups, attn, mamba = model_groups()
    kv_cache_config = KVCacheConfig(num_blocks=2 * blocks + 4, kv_cache_tensors=[],
                                    kv_cache_groups=groups)
    extra = {"spec_name": "StatepoolOffloadingSpec", "spec_module_path": "statepool.vllm",
             "socket": socket, "tenant": TENANT, "state_codec": codec, "kv_codec": "bf16",
             "state_arena_pages": 12, "kv_arena_mib": 2048, "timeout": 60,
             "staging_mib": 1024}
    config = OffloadingConfig(
        groups=tuple(OffloadingGroupConfig(BS, tuple(g.layer_names), i)
                     for i, g in enumerate(groups)),
        worker_kv_bytes_per_block=attn.page_size_bytes * LAYERS, enable_kv_cache_events=False,
        extra_config=extra, engine_id=f"bench-{codec}",
        model=OffloadingModelConfig(MODEL, "bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=BS, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(0, 1, 1, 1, 1, 1, 0, 1, None, False),
        kv_cache_layout="LBHNC")
    with building_with(kv_cache_config):
        spec = StatepoolOffloadingSpec(config)
    tensors, refs, pages, unpadded = [], [], {}, {}
    g = torch.Generator().manual_seed(7)
    for gid, group in enumerate(groups):
        is_mamba = isinstance(group.kv_cache_spec, MambaSpec)
        n = 4 if is_mamba else 2 * blocks + 2  # a request's blocks, and as many to load into
        page = attn.page_size_bytes
        size = (mamba.state_content_size_bytes if is_mamba else attn.real_page_size_bytes)
        pages[gid], unpadded[gid], grefs = [], size, []
        for _ in group.layer_names:
            t = torch.randn(n * page // 2, generator=g).to(torch.bfloat16).view(torch.int8)
            t = t.view(n, page)  # bf16 values: every reading of the bytes is finite
            tensors.append(CanonicalKVCacheTensor(t, page))
            grefs.append(CanonicalKVCacheRef(len(tensors) - 1, size))
            pages[gid].append(t)
        refs.append(grefs)
    worker = spec.get_worker(CanonicalKVCaches(tensors, refs))
    return Engine(codec, spec, spec.get_manager(), worker, pages, unpadded)


def block_spec(groups_blocks: Dict[int, List[int]]) -> GPULoadStoreSpec:
    ids, sizes = [], []
    for gid in range(MAMBA_GROUPS + 1):
        b = groups_blocks.get(gid, [])
        ids.extend(b)
        sizes.append(len(b))
    return GPULoadStoreSpec(ids, sizes, [0] * len(sizes))


def run_jobs(e: Engine, jobs) -> float:
    """Submits (store?, keys, blocks per group) jobs together; seconds until all finished."""
    ids = []
    t0 = time.perf_counter()
    for store, keys, blocks in jobs:
        j = e.job()
        ids.append(j)
        ok = (e.worker.submit_store(j, block_spec(blocks), StatepoolKeys(keys)) if store
              else e.worker.submit_load(j, StatepoolKeys(keys), block_spec(blocks)))
        assert ok
    e.worker.wait(set(ids))
    seconds = time.perf_counter() - t0
    results = {r.job_id: r for r in e.worker.get_finished()}
    if any(not results[j].success for j in ids):
        raise BenchError(f"{e.codec}: a job failed: {e.worker.stats()}")
    return seconds


def check(e: Engine, pairs) -> float:
    """(group, source block, loaded block) pairs: byte-exact except a lossy state, whose
    largest relative L2 error is returned."""
    worst = 0.0
    for gid, src, dst in pairs:
        for t in e.pages[gid]:
            a, b = t[src, :e.unpadded[gid]], t[dst, :e.unpadded[gid]]
            if torch.equal(a, b):
                continue
            conv = (CONV_K - 1) * CONV_DIM * 2
            if gid == MAMBA_GROUPS or e.codec == "fp32" or not torch.equal(a[:conv], b[:conv]):
                raise BenchError(f"{e.codec}: group {gid} block {dst} is not block {src}")
            va = a[conv:].numpy().view(np.float32)
            vb = b[conv:].numpy().view(np.float32)
            worst = max(worst, float(np.linalg.norm(va - vb) / np.linalg.norm(va)))
    if worst > MAX_STATE_ERROR:
        raise BenchError(f"{e.codec}: a loaded state {worst:.3f} away from the stored one")
    return worst


def fresh_hashes(tag: str, n: int) -> List[bytes]:
    return [os.urandom(28) + tag.encode()[:4].ljust(4, b"-") for _ in range(n)]


def one_round(e: Engine, blocks: int, times: Dict[str, List[float]]) -> dict:
    """One repeat of every timed operation with fresh keys; returns the request's keys."""
    A = MAMBA_GROUPS
    # per block: one Mamba key, one attention key (stored from block 0, loaded into block 1/2)
    h = fresh_hashes("blk", 2)
    ks, kk = make_offload_key(h[0], 0), make_offload_key(h[1], A)
    times["store state"].append(run_jobs(e, [(True, [ks], {0: [0]})]))
    times["store KV"].append(run_jobs(e, [(True, [kk], {A: [0]})]))
    times["load state"].append(run_jobs(e, [(False, [ks], {0: [1]})]))
    times["load KV"].append(run_jobs(e, [(False, [kk], {A: [blocks + 1]})]))
    err = check(e, [(0, 0, 1), (A, 0, blocks + 1)])
    # per request: the state at its last block in each Mamba group, its attention blocks
    hashes = fresh_hashes("req", blocks)
    state_keys = [make_offload_key(hashes[-1], g) for g in range(A)]
    kv_keys = [make_offload_key(x, A) for x in hashes]
    src = list(range(blocks))
    store = [(True, [state_keys[g]], {g: [2]}) for g in range(A)]
    store.append((True, kv_keys, {A: src}))
    times["store request"].append(run_jobs(e, store))
    # vLLM's first lookup of the request in a step: the manager asks the daemon about every
    # key of the request at once (the positions vLLM records in the request's context)
    ctx = ReqContext(req_id=f"r{e.next_job}")
    for i, k in enumerate(kv_keys):
        ctx.set_offload_key_position(k, (i + 1) * BS)
    for k in state_keys:
        ctx.set_offload_key_position(k, blocks * BS)
    t0 = time.perf_counter()
    hit = [e.manager.lookup(k, ctx).name for k in kv_keys[:1]]
    times["lookup request"].append(time.perf_counter() - t0)
    hit += [e.manager.lookup(k, ctx).name for k in kv_keys[1:] + state_keys]
    if set(hit) != {"HIT"}:
        raise BenchError(f"{e.codec}: the request's lookup: {hit}")
    e.manager.on_schedule_end(None)
    dst = list(range(blocks + 1, 2 * blocks + 1))
    load = [(False, state_keys + kv_keys, {0: [3], 1: [3], 2: [3], A: dst})]
    times["load request"].append(run_jobs(e, load))
    err = max(err, check(e, [(g, 2, 3) for g in range(A)] +
                         [(A, s, d) for s, d in zip(src, dst)]))
    return {"state_keys": state_keys, "kv_keys": kv_keys, "error": err}


def kept_bytes(e: Engine, keys: dict, socket: str) -> dict:
    """What the daemon keeps for the request's entries: the arena pages they hold (a state's
    page; a KV entry's header page and the pages its encoded blocks take), against vLLM's
    unpadded page bytes."""
    geo = e.spec.geometry(0)
    prefixes = {geo.prefix(k, geo.groups[int.from_bytes(k[-4:], "big")]).encode()
                for k in keys["state_keys"] + keys["kv_keys"]}
    state = kv = 0
    with statepool.connect(socket, tenant=TENANT) as conn:
        for info in conn.list_snapshots(KEY_PREFIX, 10000).snapshots:
            if info.prefix not in prefixes:
                continue
            if info.kv is not None:
                kv += info.pages * info.page_bytes
            else:
                state += info.pages * info.page_bytes
    pages_state = MAMBA_GROUPS * 12 * e.unpadded[0]
    pages_kv = len(keys["kv_keys"]) * 12 * e.unpadded[MAMBA_GROUPS]
    return {"state": state, "kv": kv, "pages_state": pages_state, "pages_kv": pages_kv}


def memcpy_seconds(e: Engine, blocks: int, repeats: int) -> Dict[str, float]:
    """One copy of the same page bytes into a buffer: a state block, a KV block, a request."""
    out = {}
    for name, gid, n in (("state", 0, 1), ("KV", MAMBA_GROUPS, 1), ("request", None, blocks)):
        parts = ([(g, 1) for g in range(MAMBA_GROUPS)] + [(MAMBA_GROUPS, n)] if gid is None
                 else [(gid, n)])
        total = sum(len(e.pages[g]) * k * e.unpadded[g] for g, k in parts)
        buf = torch.empty(total, dtype=torch.int8)
        best = float("inf")
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            at = 0
            for g, k in parts:
                size = e.unpadded[g]
                for t in e.pages[g]:
                    buf[at:at + k * size].view(k, size).copy_(t[:k, :size])
                    at += k * size
            best = min(best, time.perf_counter() - t0)
        out[name] = best
    return out


def start_daemon(tmp: pathlib.Path, workers: int) -> subprocess.Popen:
    binary = os.environ.get("STATEPOOL_DAEMON", str(ROOT / "build/service/statepoold"))
    sock = str(tmp / "statepool.sock")
    log = open(tmp / "statepoold.log", "w")
    proc = subprocess.Popen([binary, "--socket", sock, "--metrics-address", "off",
                             "--api-address", "off", "--pool-capacity", "6GiB",
                             "--max-arena-pages", "1048576", "--workers", str(workers),
                             "--tenant", TENANT], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while True:
        try:
            statepool.connect(sock, tenant=TENANT, timeout=2).close()
            return proc
        except statepool.TransportError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("statepoold did not start:\n"
                                   + (tmp / "statepoold.log").read_text())
            time.sleep(0.05)


def ms(x: float) -> str:
    return f"{x * 1e3:.2f}" if x < 10 else f"{x * 1e3:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=16, help="attention blocks of the request")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                    help="statepoold --workers (default: one per core)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # vLLM's worker owns the cores; the page copies run beside it
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="vllm-offload-bench-"))
    daemon = start_daemon(tmp, args.workers)
    socket = str(tmp / "statepool.sock")
    try:
        engines = [make_engine(c, socket, args.blocks) for c in CODECS]
        times = {c: {op: [] for op in OPS} for c in CODECS}
        keys, errors = {}, {c: 0.0 for c in CODECS}
        for e in engines:  # untimed round
            one_round(e, args.blocks, {op: [] for op in OPS})
        for _ in range(args.repeats):
            for e in engines:
                keys[e.codec] = one_round(e, args.blocks, times[e.codec])
                errors[e.codec] = max(errors[e.codec], keys[e.codec]["error"])
        kept = {e.codec: kept_bytes(e, keys[e.codec], socket) for e in engines}
        copy = memcpy_seconds(engines[0], args.blocks, args.repeats)
        for e in engines:
            e.worker.shutdown()
            e.manager.shutdown()
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)

    tokens = args.blocks * BS
    print(f"statepool.vllm at Qwen3-Next-80B-A3B size (TP 1, block {BS} tokens): a block = one "
          f"Mamba group's state (12 layers, {12 * engines[0].unpadded[0] / 2**20:.1f} MiB) or "
          f"one attention block (12 layers, "
          f"{12 * engines[0].unpadded[MAMBA_GROUPS] / 2**20:.1f} MiB); a request = "
          f"{args.blocks} attention blocks ({tokens:,} tokens) + the state in 3 groups")
    print(f"{platform.machine()}, {os.cpu_count()} cores, statepoold --workers {args.workers}, "
          f"torch {torch.__version__}, min (median) of {args.repeats} repeats, milliseconds\n")
    print(f"| operation | fp32 (lossless) | stepquant6 | stepquant6 / fp32 | one memcpy |")
    print("|---|---|---|---|---|")
    yard = {"store state": copy["state"], "load state": copy["state"], "store KV": copy["KV"],
            "load KV": copy["KV"], "store request": copy["request"],
            "load request": copy["request"]}
    for op in OPS:
        cells = []
        for c in CODECS:
            t = times[c][op]
            cells.append(f"{ms(min(t))} ({ms(statistics.median(t))})")
        ratio = min(times["stepquant6"][op]) / min(times["fp32"][op])
        y = ms(yard[op]) if op in yard else "-"
        print(f"| {op} | {cells[0]} | {cells[1]} | {ratio:.2f} | {y} |")
    print()
    k0 = kept["fp32"]
    pages = k0["pages_state"] + k0["pages_kv"]
    print(f"| bytes per request | vLLM's pages | fp32 | stepquant6 | stepquant6 / fp32 |")
    print("|---|---|---|---|---|")
    for part, pk in (("states (3 groups)", "pages_state"), ("KV blocks", "pages_kv")):
        key = "state" if pk == "pages_state" else "kv"
        a, b = kept["fp32"][key], kept["stepquant6"][key]
        print(f"| {part} | {k0[pk] / 1e6:.1f} MB | {a / 1e6:.1f} MB | {b / 1e6:.1f} MB | "
              f"{b / a:.3f} |")
    a = kept["fp32"]["state"] + kept["fp32"]["kv"]
    b = kept["stepquant6"]["state"] + kept["stepquant6"]["kv"]
    print(f"| total | {pages / 1e6:.1f} MB | {a / 1e6:.1f} MB | {b / 1e6:.1f} MB | {b / a:.3f} |")
    print(f"\nloaded = stored: fp32 byte for byte; stepquant6 conv and KV byte for byte, states "
          f"within {errors['stepquant6']:.4f} relative L2 error (nominal plan)")


if __name__ == "__main__":
    sys.exit(main())
