#!/usr/bin/env python3
"""SGLang's HiCache storage backends side by side on one machine: SGLang's file backend
(HiCacheFile), statepool's backend (statepool.sglang) and Mooncake Store (SGLang's own
MooncakeStore class), with a Qwen3-Next-shaped MAMBA page and its KV pages (issue 43).

    PY=$(scripts/sglang-venv)
    MC=$(scripts/mooncake-site)     # optional: without it the Mooncake rows are skipped
    PYTHONPATH=build/python:$MC $PY bench/sglang_hicache.py [--pages 16,128] [--repeats 14]

(about 4 minutes on 2 cores with the defaults; --repeats 3 for a quick look)

What it measures. For each page count of --pages (16 and 128), one "prefix" of that many KV
pages of --page-size tokens and the state at its end, as SGLang's hybrid cache controller writes
and reads them: the state with batch_set_v2 / batch_get_v2 (MAMBA pool), the KV pages with the
zero-copy batch_set_v1 / batch_get_v1 where the controller uses them (Mooncake, and statepool's
`"interface_v1": 1`) and with flat data pages (batch_set, batch_get and set_from_flat_data_page)
for HiCacheFile, which has no v1 path; and batch_exists_v2 over the prefix with the MAMBA pool's
TRAILING_PAGES transfer. Every repeat
stores fresh keys (every backend skips keys it holds), reads them back into other host pages and
slots, checks the bytes, and then empties the backend (clear(), untimed, until batch_exists finds
none), so each backend holds one prefix at a time and writes into memory it has used before, as a
warm server does. The backends are taken in turn (A B C A B C ...) with the same shapes, after one
untimed round; times are the min and the median of --repeats. A second measurement asks
batch_exists_v2 about 4,096 stored one-token pages (page size 1, as SGLang's no_buffer mode),
the same keys each repeat. A last, untimed phase shows what Mooncake's embedded mode cannot do:
a second engine process looks up a prefix that a first one stored and then exited (statepool's
daemon outlives both; Mooncake's embedded segment dies with the process that mounted it), for
the file backend, statepool's first configuration and Mooncake.

The backends, as SGLang builds them (host pools made with the allocator SGLang's hybrid pool
assembler picks for each backend, `get_allocator_type()`):
- file: HiCacheFile in --file-dir (default: a temporary folder under /tmp), default allocator;
  its reads come from the page cache;
- statepool: the daemon started here (build/service/statepoold or $STATEPOOL_DAEMON, private
  socket), one backend per state codec of --codecs (KV: bf16) and per allocator of
  --statepool-alloc: `shm` (`"allocator": "shm"` in the extra config: memfd host pools the daemon
  can map) and `default` (anonymous memory: the backend copies through its staging buffer);
- mooncake: MooncakeStore with an embedded client (TCP, P2PHANDSHAKE metadata, a global segment
  of --mooncake-segment in this process) and a private mooncake_master on 127.0.0.1 started and
  stopped here (its object lease shortened to 100 ms so that clear() can empty it between
  repeats); host pools from Mooncake's own allocator, registered with register_buffer by the
  backend. Its segment is prefaulted before timing (--no-mooncake-prefault: not), as a long
  running server's is. Skipped, with the reason, when `mooncake.store` does not import (CI=true:
  a failure instead).

Shapes: Qwen3-Next-80B-A3B (docs/models/qwen3-next-80b-a3b-instruct.json) at TP 1: 36
gated-delta-rule layers x 32 value heads x 128 x 128 fp32 state plus a conv state of 8,192
channels x 3 in bf16 (77.3 MB per MAMBA page), and 12 full-attention layers x 2 KV heads x 256
in bf16 (24 KiB per token). Ratios are statepool time / other time (min of the repeats): the
issue's goal is statepool <= 1.5x Mooncake on every operation and ahead of (< 1x) the file
backend; cells that miss it are marked with '!'.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import importlib.metadata
import json
import logging
import os
import pathlib
import platform
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from dataclasses import asdict, dataclass, field

warnings.filterwarnings("ignore", category=UserWarning)
os.environ.setdefault("MC_LOG_LEVEL", "ERROR")  # Mooncake's glog INFO lines on stderr otherwise

import torch  # noqa: E402
from sglang.srt.mem_cache.device_pool_info import (  # noqa: E402
    KVBufferLayout,
    KVBuffers,
    MambaStateBufferInfo,
    MHABufferInfo,
)
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorageConfig,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

import statepool  # noqa: E402

logging.getLogger("sglang").setLevel(logging.ERROR)  # e.g. the host pools' size advice

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODEL = "Qwen/Qwen3-Next-80B-A3B"

# Qwen3-Next-80B-A3B at TP 1
GDN_LAYERS, HV, HK, DK, DV, CONV_K = 36, 32, 16, 128, 128, 4
ATTN_LAYERS, KV_HEADS, HEAD_DIM = 12, 2, 256
CONV_CHANNELS = 2 * HK * DK + HV * DV

OPS = ("set_state", "set_kv", "exists", "get_state", "get_kv")
EXISTS_PAGES = 4096   # one-token pages of the batch_exists_v2 measurement
GOAL_VS_MOONCAKE = 1.5
LOSSY_STATE_ERROR = 0.1  # a lossy state codec's largest relative error that is still the state
MOONCAKE_DIST = "mooncake-transfer-engine-non-cuda"  # bench/requirements-mooncake.txt
PHASES = ("timing", "exists", "engines")  # also the file backend's folders under --file-dir
MOONCAKE_LEASE_S = 0.1   # the private master's object lease (its default: 10 s)


class BenchError(Exception):
    """A set, get or lookup that failed or returned other bytes: the run stops."""


# -- host pools, as SGLang's hybrid pool assembler builds them -----------------------------------

@dataclass
class Pools:
    allocator: str
    kv: MHATokenToKVPoolHost
    mamba: MambaPoolHost


def make_pools(allocator: str, page_size: int, pages: int) -> Pools:
    """A page_first host KV pool of `pages` pages and a MAMBA pool of 3 slots, with SGLang's host
    allocator `allocator` (default, shm, mooncake)."""
    dev = page_size

    def layers():
        return tuple(torch.zeros(dev, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16)
                     for _ in range(ATTN_LAYERS))
    k, v = layers(), layers()
    ptrs = [torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64) for ts in (k, v)]
    info = MHABufferInfo(buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs[0], v_data_ptrs=ptrs[1],
                                           layout=KVBufferLayout.NHD),
                         page_size=page_size, head_num=KV_HEADS, head_dim=HEAD_DIM,
                         v_head_dim=HEAD_DIM, dtype=torch.bfloat16, device=torch.device("cpu"))
    kv = MHATokenToKVPoolHost(info, 2.0, 0, page_size, "page_first", pin_memory=False,
                              device="cpu", allocator_type=allocator,
                              device_capacity_tokens=dev, start_layer=0,
                              end_layer=ATTN_LAYERS - 1, host_token_capacity=pages * page_size)
    temporal = torch.zeros(GDN_LAYERS, 1, HV, DV, DK, dtype=torch.float32)
    conv = (torch.zeros(GDN_LAYERS, 1, CONV_CHANNELS, CONV_K - 1, dtype=torch.bfloat16),)
    mamba = MambaPoolHost(MambaStateBufferInfo(temporal=temporal, conv=conv), 2.0, 0,
                          device_capacity=1, pin_memory=False, device="cpu",
                          allocator_type=allocator, layout="page_first")
    return Pools(allocator, kv, mamba)


def fill_source(pools: Pools, pages: int, seed: int) -> None:
    """Random KV in the first `pages` pages and a random state in MAMBA slot 0 (the same bytes in
    every pool for one seed); zeros in the rest of the KV pool and the other slots."""
    g = torch.Generator().manual_seed(seed)
    tokens = pages * pools.kv.page_size
    kv = pools.kv.kv_buffer
    kv.zero_()
    kv[:, :tokens].copy_(torch.randn(kv[:, :tokens].shape, generator=g).to(kv.dtype))
    m = pools.mamba
    m.temporal_buffer.zero_()
    m.temporal_buffer[0].copy_(torch.randn(m.temporal_buffer[0].shape, generator=g))
    for c in m.conv_buffer:
        c.zero_()
        c[0].copy_(torch.randn(c[0].shape, generator=g).to(c.dtype))


def state_error(pools: Pools, src: int, dst: int) -> float:
    """Largest relative difference between the state in slot dst and the one in slot src (0:
    bit-exact, conv state included)."""
    m = pools.mamba
    exact = torch.equal(m.temporal_buffer[src], m.temporal_buffer[dst]) and all(
        torch.equal(c[src], c[dst]) for c in m.conv_buffer)
    if exact:
        return 0.0
    t0, t1 = m.temporal_buffer[src], m.temporal_buffer[dst]
    return max(((t0 - t1).abs().max() / t0.abs().max()).item(), 1e-30)


# -- backends ------------------------------------------------------------------------------------

@dataclass
class Spec:
    """How to open one backend: enough to open it again in another process."""
    name: str        # the row's label
    kind: str        # SGLang's --hicache-storage-backend: file, dynamic (statepool) or mooncake
    allocator: str   # the host pools' allocator SGLang's assembler picks for it
    extra: dict      # --hicache-storage-backend-extra-config
    lossless: bool = True   # the state comes back bit-exact

    @property
    def zero_copy(self) -> bool:
        # SGLang's cache controller: v1 paths for mooncake and for dynamic with interface_v1
        return self.kind == "mooncake" or bool(self.extra.get("interface_v1"))

    @property
    def family(self) -> str:
        return {"file": "file", "dynamic": "statepool", "mooncake": "mooncake"}[self.kind]


def storage_config(extra: dict) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
                                is_page_first_layout=True, model_name=MODEL, extra_config=extra)


@dataclass
class Opened:
    spec: Spec
    pools: Pools
    backend: object
    times: dict = field(default_factory=lambda: {op: [] for op in OPS})
    state_err: float = 0.0


@contextlib.contextmanager
def stderr_into(path: pathlib.Path | None):
    """Points file descriptor 2 at `path` for a while: Mooncake's client logs through glog, to
    stderr, a line that is no error ('Local segment descriptor not found') while it sets up."""
    if path is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "a") as f:
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def open_backend(spec: Spec, pools: Pools, log: pathlib.Path | None = None) -> Opened:
    with stderr_into(log if spec.kind == "mooncake" else None):
        backend = StorageBackendFactory.create_backend(spec.kind, storage_config(spec.extra),
                                                       pools.kv)
    backend.register_mem_pool_host(pools.kv)
    backend.register_mem_host_pool_v2(pools.kv, PoolName.KV)
    backend.register_mem_host_pool_v2(pools.mamba, PoolName.MAMBA)
    return Opened(spec, pools, backend)


def close_backend(o: Opened) -> None:
    if hasattr(o.backend, "close"):  # not part of HiCacheStorage: HiCacheFile has none
        o.backend.close()
    if o.spec.kind == "mooncake":
        # MooncakeStore.close() does nothing; the client's own close unmounts its segment
        o.backend.store.close()


def keys_for(tag: str, n: int) -> list[str]:
    out, prev = [], tag.encode()
    for i in range(n):
        prev = hashlib.sha256(prev + i.to_bytes(4, "little")).digest()
        out.append(prev.hex())
    return out


def state_transfer(keys: list[str], slot: int | None = None) -> PoolTransfer:
    return PoolTransfer(name=PoolName.MAMBA, keys=[keys[-1]],
                        host_indices=None if slot is None else torch.tensor([slot]),
                        hit_policy=PoolHitPolicy.TRAILING_PAGES)


def store_prefix(o: Opened, keys: list[str]) -> tuple[float, float]:
    """Stores the state (MAMBA slot 0) and KV pages 0.. under `keys`; the seconds of each."""
    kv, ps = o.pools.kv, o.pools.kv.page_size
    t0 = time.perf_counter()
    ok_state = o.backend.batch_set_v2([state_transfer(keys, 0)])[PoolName.MAMBA] == [True]
    t1 = time.perf_counter()
    if o.spec.zero_copy:
        ok_kv = all(o.backend.batch_set_v1(keys, torch.arange(0, len(keys) * ps)))
    else:  # SGLang's _generic_page_set
        ok_kv = o.backend.batch_set(keys, [kv.get_data_page(i * ps) for i in range(len(keys))])
    t2 = time.perf_counter()
    if not (ok_state and ok_kv):
        raise BenchError(f"{o.spec.name}: storing {len(keys)} pages failed "
                         f"(state {ok_state}, KV {ok_kv})")
    return t1 - t0, t2 - t1


def lookup(o: Opened, keys: list[str]) -> tuple[int, int]:
    """batch_exists_v2 as the controller asks it: (KV pages, MAMBA boundary)."""
    hit = o.backend.batch_exists_v2(keys, [state_transfer(keys)])
    return hit.kv_hit_pages, hit.extra_pool_hit_pages.get(PoolName.MAMBA, 0)


def load_prefix(o: Opened, keys: list[str], first_page: int) -> tuple[float, float, bool]:
    """The state into MAMBA slot 1 and the KV pages into pages first_page..; (seconds of each,
    everything found)."""
    kv, ps, n = o.pools.kv, o.pools.kv.page_size, len(keys)
    t0 = time.perf_counter()
    ok = o.backend.batch_get_v2([state_transfer(keys, 1)])[PoolName.MAMBA] == [True]
    t1 = time.perf_counter()
    if o.spec.zero_copy:
        dst = torch.arange(first_page * ps, (first_page + n) * ps)
        ok &= all(o.backend.batch_get_v1(keys, dst))
    else:  # SGLang's _generic_page_get
        pages = o.backend.batch_get(keys, [kv.get_dummy_flat_data_page() for _ in keys])
        for i, page in enumerate(pages or [None] * n):
            if page is None:
                ok = False
                break
            kv.set_from_flat_data_page((first_page + i) * ps, page)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, ok


def empty(o: Opened, keys: list[str], deadline_s: float = 20.0) -> None:
    """clear() until none of `keys` is found. Mooncake keeps an object that was just read or
    looked up for its lease (a lookup grants a new one), so the next try waits longer than that."""
    end = time.monotonic() + deadline_s
    while True:
        o.backend.clear()
        if o.backend.batch_exists(keys) == 0:
            return
        if time.monotonic() > end:
            raise BenchError(f"{o.spec.name}: clear() left {keys[0][:12]}.. in place")
        time.sleep(1.5 * MOONCAKE_LEASE_S)


def repeat(o: Opened, pages: int, tag: str, record: bool) -> None:
    """One timed set / exists / get of a prefix of `pages` pages under fresh keys, checked."""
    kv, ps = o.pools.kv, o.pools.kv.page_size
    keys = keys_for(tag, pages)
    kv.kv_buffer[:, pages * ps:2 * pages * ps].zero_()
    o.pools.mamba.temporal_buffer[1].zero_()
    for c in o.pools.mamba.conv_buffer:
        c[1].zero_()
    gc.collect()
    gc.disable()  # no collection inside a timed call
    try:
        set_state, set_kv = store_prefix(o, keys)
        t0 = time.perf_counter()
        kv_hits, state_hits = lookup(o, keys)
        exists = time.perf_counter() - t0
        get_state, get_kv, ok = load_prefix(o, keys, pages)
    finally:
        gc.enable()
    if not ok or kv_hits != pages or state_hits != pages:
        raise BenchError(f"{o.spec.name}: found {kv_hits} KV pages and the state at page "
                         f"{state_hits} of {pages}; all read back: {ok}")
    if not torch.equal(kv.kv_buffer[:, :pages * ps], kv.kv_buffer[:, pages * ps:2 * pages * ps]):
        raise BenchError(f"{o.spec.name}: the KV pages read back differ from those stored")
    err = state_error(o.pools, 0, 1)
    if err > (0 if o.spec.lossless else LOSSY_STATE_ERROR):
        raise BenchError(f"{o.spec.name}: the state read back differs (max rel. error {err:.2e})")
    empty(o, keys)
    if record:
        for op, dt in zip(OPS, (set_state, set_kv, exists, get_state, get_kv)):
            o.times[op].append(dt)
        o.state_err = max(o.state_err, err)


# -- processes: statepoold, mooncake_master ------------------------------------------------------

def start_daemon(tmp: pathlib.Path) -> tuple[subprocess.Popen, str]:
    binary = os.environ.get("STATEPOOL_DAEMON", str(ROOT / "build/service/statepoold"))
    sock = str(tmp / "statepool.sock")
    log = tmp / "statepoold.log"
    # a limit, not a reservation: arena pages are touched as they are used
    proc = subprocess.Popen([binary, "--socket", sock, "--metrics-address", "off",
                             "--api-address", "off", "--pool-capacity", "16GiB",
                             "--tenant", "bench"],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while True:
        try:
            statepool.connect(sock, tenant="bench", timeout=2).close()
            return proc, sock
        except statepool.TransportError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise BenchError("statepoold did not start:\n" + log.read_text())
            time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Master:
    proc: subprocess.Popen
    address: str      # host:port of its RPC service, for master_server_address
    admin: int        # its HTTP port (/health, /metrics)

    def mounted_bytes(self) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}/metrics", timeout=2) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("master_total_capacity_bytes "):
                    return float(line.split()[1])
        return 0.0


def start_master(tmp: pathlib.Path, binary: pathlib.Path) -> Master:
    """mooncake_master on 127.0.0.1, free ports, no etcd, no HTTP metadata server, no metrics
    reporting; metadata only (the data lives in the clients' segments)."""
    rpc, admin = free_port(), free_port()
    log = tmp / "mooncake_master.log"
    proc = subprocess.Popen([str(binary), "--rpc_address=127.0.0.1", f"--rpc_port={rpc}",
                             "--metrics_host=127.0.0.1", f"--metrics_port={admin}",
                             "--rpc_thread_num=2", "--enable_http_metadata_server=false",
                             "--enable_metric_reporting=false",
                             f"--default_kv_lease_ttl={int(MOONCAKE_LEASE_S * 1000)}"],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}/health", timeout=1) as r:
                if json.load(r).get("service_ready"):
                    return Master(proc, f"127.0.0.1:{rpc}", admin)
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise BenchError("mooncake_master did not start:\n" + log.read_text())
        time.sleep(0.05)


def stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def find_mooncake() -> tuple[pathlib.Path | None, str]:
    """(mooncake_master, version) when SGLang's MooncakeStore can run here, else (None, why)."""
    try:
        import mooncake
        from mooncake.store import MooncakeDistributedStore  # noqa: F401
    except Exception as e:  # noqa: BLE001 (ImportError, or OSError of a missing system library)
        return None, f"mooncake.store does not import ({type(e).__name__}: {e})"
    master = pathlib.Path(mooncake.__file__).parent / "mooncake_master"
    if not os.access(master, os.X_OK):
        return None, f"{master} is missing"
    try:
        return master, importlib.metadata.version(MOONCAKE_DIST)
    except importlib.metadata.PackageNotFoundError:
        return master, "unknown version"


def prefault(o: Opened) -> int:
    """Writes throwaway objects over 85% of the embedded client's segment (below the master's 0.9
    eviction watermark) and removes them: its later puts land in memory that is already mapped,
    as on a server that has run a while. Returns the bytes touched."""
    store, segment = o.backend.store, o.backend.config.global_segment_size
    chunk = torch.ones(64 << 20, dtype=torch.uint8)
    if store.register_buffer(chunk.data_ptr(), chunk.numel()) != 0:
        raise BenchError("mooncake: register_buffer of the prefault buffer failed")
    n = 0
    while (n + 1) * chunk.numel() <= 0.85 * segment:
        if store.put_from(f"statepool-bench-prefault-{n}", chunk.data_ptr(), chunk.numel()) != 0:
            break
        n += 1
    store.remove_all()
    store.unregister_buffer(chunk.data_ptr())
    return n * chunk.numel()


# -- the second engine: a process that looks up what an exited one stored -----------------------

def engine_child(role: str, job: dict) -> None:
    """Runs in a subprocess: `writer` stores a prefix and exits (as an engine that stops);
    `reader` opens the same backend afresh and prints what it finds and reads. One JSON line."""
    spec = Spec(**job["spec"])
    pages = job["pages"]
    pools = make_pools(spec.allocator, job["page_size"], 2 * pages)
    fill_source(pools, pages, job["seed"])
    o = open_backend(spec, pools)
    keys = keys_for(job["tag"], pages)
    if role == "writer":
        store_prefix(o, keys)
        out = {"stored": pages}
    else:
        kv_hits, state_hits = lookup(o, keys)
        out = {"kv_hits": kv_hits, "state_hits": state_hits, "read": 0, "exact": False}
        if kv_hits:
            got = keys[:kv_hits]
            ps = pools.kv.page_size
            _, _, ok = load_prefix(o, got, pages)
            out["read"] = kv_hits if ok else 0
            out["exact"] = ok and torch.equal(
                pools.kv.kv_buffer[:, :kv_hits * ps],
                pools.kv.kv_buffer[:, pages * ps:(pages + kv_hits) * ps]) and (
                state_hits != kv_hits or state_error(pools, 0, 1) == 0.0)
    # no close: the process ends as an engine's does, and with it what it alone holds
    print(json.dumps(out), flush=True)


def run_child(role: str, job: dict, log: pathlib.Path) -> dict:
    cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--engine-child", role,
           "--engine-job", json.dumps(job)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    with open(log, "a") as f:
        f.write(f"$ {shlex.join(cmd)}\n{r.stdout}{r.stderr}\n")
    if r.returncode != 0 or not r.stdout.strip():
        raise BenchError(f"{job['spec']['name']}: the {role} process failed ({r.returncode}):\n"
                         + r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


# -- output --------------------------------------------------------------------------------------

def machine() -> str:
    model = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                mem = f", {int(line.split()[1]) / 2**20:.0f} GiB RAM"
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0))
    return (f"{model}, {os.cpu_count()} cores ({usable} usable){mem}, "
            f"{platform.system()} {platform.release()}, no GPU used")


def command() -> str:
    env = [f"{k}={shlex.quote(os.environ[k])}" for k in ("PYTHONPATH", "STATEPOOL_DAEMON")
           if k in os.environ]
    return " ".join(env + [shlex.join([sys.executable] + sys.argv)])


def ms(values: list[float]) -> str:
    return f"{min(values) * 1e3:.2f} / {statistics.median(values) * 1e3:.2f}"


# -- the run -------------------------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", default="16,128",
                    help="KV pages per prefix, comma separated (default 16,128)")
    ap.add_argument("--page-size", type=int, default=64, help="tokens per KV page (default 64)")
    ap.add_argument("--repeats", type=int, default=14,
                    help="timed repeats per backend and page count (default 14, as the issue's "
                         "'min of 14')")
    ap.add_argument("--codecs", default="fp32,stepquant6", help="statepool state codecs")
    ap.add_argument("--statepool-alloc", default="shm,default",
                    help="host pool allocators for statepool's backend, comma separated: shm "
                         "(memfd pools, '\"allocator\": \"shm\"'), default (private memory: "
                         "the one-copy fallback); default: both")
    ap.add_argument("--file-dir", default="", help="HiCacheFile's folder (default: under /tmp)")
    ap.add_argument("--mooncake-segment", default="2gb",
                    help="global segment of Mooncake's embedded client (bytes or Ngb)")
    ap.add_argument("--mooncake-prefault", action=argparse.BooleanOptionalAction, default=True,
                    help="touch Mooncake's segment before timing, as a warm server's is "
                         "(default: yes)")
    ap.add_argument("--second-engine", action=argparse.BooleanOptionalAction, default=True,
                    help="run the second-engine phase (default: yes)")
    ap.add_argument("--engine-child", choices=("writer", "reader"), help=argparse.SUPPRESS)
    ap.add_argument("--engine-job", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.pages = [int(p) for p in args.pages.split(",")]
    args.codecs = args.codecs.split(",")
    args.statepool_alloc = args.statepool_alloc.split(",")
    if any(a not in ("shm", "default") for a in args.statepool_alloc):
        ap.error("--statepool-alloc takes shm and/or default")
    if args.repeats < 1 or any(p < 1 for p in args.pages):
        ap.error("--repeats and --pages must be positive")
    return args


@dataclass
class Run:
    """One run's processes, folders and open backends (closed on the way out, failing or not)."""
    args: argparse.Namespace
    tmp: pathlib.Path
    file_dir: pathlib.Path
    sock: str = ""
    master: Master | None = None
    opened: list[Opened] = field(default_factory=list)

    def specs(self, phase: str, kv_tokens: int) -> list[Spec]:
        """The backends of one phase, in the order they take turns; statepool's hold
        `kv_tokens` tokens of KV each at most."""
        a = self.args
        out = [Spec("file", "file", "default", {"file_storage_path": str(self.file_dir / phase)})]
        # the backends of one daemon tenant share the arena of a layout (statepool.sglang):
        # room for all of them, the entries' headers and the arena's page rounding
        token_bytes = ATTN_LAYERS * 2 * KV_HEADS * HEAD_DIM * 2
        kv_mib = int(1.25 * kv_tokens * token_bytes * len(a.codecs) * len(a.statepool_alloc)
                     / 2**20) + 64
        for alloc in a.statepool_alloc:
            for codec in a.codecs:
                extra = {"backend_name": "statepool", "module_path": "statepool.sglang",
                         "class_name": "StatepoolHiCacheStorage", "interface_v1": 1,
                         "socket": self.sock, "tenant": "bench", "state_codec": codec,
                         "kv_codec": "bf16", "state_arena_pages": 8, "kv_arena_mib": kv_mib,
                         "namespace": f"bench-{phase}-{codec}-{alloc}"}
                if alloc == "shm":
                    extra["allocator"] = "shm"
                out.append(Spec(f"statepool {codec} {alloc}", "dynamic", alloc, extra,
                                lossless=codec == "fp32"))
        if self.master is not None:
            out.append(Spec("mooncake", "mooncake", "mooncake",
                            {"master_server_address": self.master.address, "protocol": "tcp",
                             "device_name": "", "metadata_server": "P2PHANDSHAKE",
                             "local_hostname": "127.0.0.1",
                             "global_segment_size": a.mooncake_segment}))
        return out

    def open(self, specs: list[Spec], page_size: int, pages: int, seed: int) -> list[Opened]:
        """Opens the backends on host pools of `pages` pages (one set per allocator), the first
        half of the KV pages (at least one page) and MAMBA slot 0 filled from `seed`."""
        pools: dict[str, Pools] = {}
        for s in specs:
            if s.allocator not in pools:
                pools[s.allocator] = make_pools(s.allocator, page_size, pages)
                fill_source(pools[s.allocator], max(1, pages // 2), seed)
            self.opened.append(open_backend(s, pools[s.allocator], self.tmp / "mooncake.log"))
        return list(self.opened)

    def close(self) -> None:
        while self.opened:
            close_backend(self.opened.pop())
        gc.collect()

    def timings(self) -> dict[int, list[tuple[Spec, dict, float]]]:
        """Phase 1: set / exists / get of one prefix, per page count; {pages: [(spec, times,
        state error)]}."""
        a = self.args
        biggest = max(a.pages)
        # a prefix, and the one before it while it is emptied
        opened = self.open(self.specs("timing", 2 * biggest * a.page_size), a.page_size,
                           2 * biggest, seed=43)
        touched = {o.spec.name: prefault(o) for o in opened
                   if o.spec.kind == "mooncake" and a.mooncake_prefault}
        print("backends, taken in turn in this order:")
        table(["backend", "what"], [[o.spec.name, describe(o.spec, touched.get(o.spec.name))]
                                    for o in opened], left=2)
        sys.stdout.flush()
        results = {}
        for pages in a.pages:
            for o in opened:
                o.times, o.state_err = {op: [] for op in OPS}, 0.0
            progress(f"{pages} pages: 1 untimed round, then {a.repeats} rounds of "
                     f"{len(opened)} backends in turn")
            for r in range(-1, a.repeats):
                for o in opened:
                    repeat(o, pages, f"{o.spec.name}/{pages}/{r}", record=r >= 0)
            results[pages] = [(o.spec, o.times, o.state_err) for o in opened]
        self.close()
        return results

    def exists_one_token_pages(self) -> dict[str, list[float]]:
        """Phase 2: batch_exists_v2 of EXISTS_PAGES stored one-token pages; {backend: seconds}."""
        progress(f"batch_exists_v2 of {EXISTS_PAGES} one-token pages")
        opened = self.open(self.specs("exists", EXISTS_PAGES), 1, 2 * EXISTS_PAGES, seed=44)
        keys = {o.spec.name: keys_for(f"{o.spec.name}/exists", EXISTS_PAGES) for o in opened}
        for o in opened:
            store_prefix(o, keys[o.spec.name])
        times: dict[str, list[float]] = {o.spec.name: [] for o in opened}
        for r in range(-1, self.args.repeats):
            for o in opened:
                gc.collect()
                gc.disable()
                try:
                    t0 = time.perf_counter()
                    hits = lookup(o, keys[o.spec.name])
                    dt = time.perf_counter() - t0
                finally:
                    gc.enable()
                if hits != (EXISTS_PAGES, EXISTS_PAGES):
                    raise BenchError(f"{o.spec.name}: batch_exists_v2 found (KV pages, state "
                                     f"boundary) {hits} of {EXISTS_PAGES} one-token pages")
                if r >= 0:
                    times[o.spec.name].append(dt)
        self.close()
        return times

    def second_engine(self) -> list[tuple[Spec, dict, dict]]:
        """Phase 3: per backend (statepool: its first configuration), a writer process stores a
        prefix and exits, then a reader process looks it up; [(spec, writer's, reader's)]."""
        if self.master is not None:  # no segment of this process may hold the writer's objects
            deadline = time.monotonic() + 15
            while self.master.mounted_bytes() > 0:
                if time.monotonic() > deadline:
                    raise BenchError("mooncake: a segment of this process is still mounted")
                time.sleep(0.1)
        progress("second engine: a writer process, then a reader process, per backend")
        picks: dict[str, Spec] = {}
        for s in self.specs("engines", 2 * 16 * self.args.page_size):
            picks.setdefault(s.family, s)
        out = []
        for s in picks.values():
            if s.kind == "mooncake":
                s.extra["global_segment_size"] = "1gb"
            job = {"spec": asdict(s), "pages": 16, "page_size": self.args.page_size, "seed": 45,
                   "tag": f"{s.name}/second-engine"}
            wrote = run_child("writer", job, self.tmp / "engines.log")
            read = run_child("reader", job, self.tmp / "engines.log")
            out.append((s, wrote, read))
        return out


def describe(spec: Spec, prefaulted: int | None) -> str:
    pools = {"default": "SGLang's default allocator (private memory)",
             "shm": "SGLang's shm allocator (memfd)",
             "mooncake": "Mooncake's allocator, register_buffer'ed"}[spec.allocator]
    if spec.kind == "file":
        what = f"HiCacheFile in {spec.extra['file_storage_path']}, flat data pages"
    elif spec.kind == "dynamic":
        what = (f"statepool.sglang (dynamic, interface_v1), state {spec.extra['state_codec']}, "
                f"KV {spec.extra['kv_codec']}"
                + (', "allocator": "shm"' if spec.extra.get("allocator") else ""))
    else:
        what = (f"MooncakeStore, embedded client, TCP, segment {spec.extra['global_segment_size']}"
                + (f" ({prefaulted / 2**30:.2f} GiB prefaulted)" if prefaulted else
                   " (NOT prefaulted: its sets pay first-touch faults)")
                + f", master on 127.0.0.1 (lease {MOONCAKE_LEASE_S * 1000:.0f} ms)")
    return f"{what}; host pools: {pools}"


def progress(what: str) -> None:
    print(f"bench/sglang_hicache.py: {what} ...", file=sys.stderr, flush=True)


def git_describe() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                              capture_output=True, text=True, timeout=10).stdout.strip() or "?"
    except OSError:
        return "?"


def header(args, mooncake_version: str | None) -> None:
    print("SGLang HiCache storage backends side by side (bench/sglang_hicache.py)")
    print(f"command: {command()}")
    print(f"machine: {machine()}")
    print(f"versions: sglang {importlib.metadata.version('sglang')}, torch {torch.__version__}, "
          f"mooncake {mooncake_version or 'not available'}, statepool {statepool.__version__} "
          f"(source {git_describe()}, daemon "
          f"{os.environ.get('STATEPOOL_DAEMON', 'build/service/statepoold')})")
    token_bytes = ATTN_LAYERS * 2 * KV_HEADS * HEAD_DIM * 2
    state_bytes = GDN_LAYERS * (HV * DV * DK * 4 + CONV_CHANNELS * (CONV_K - 1) * 2)
    print(f"shapes: {MODEL} at TP 1: {GDN_LAYERS} GDN layers x {HV} heads x {DV} x {DK} fp32 + "
          f"conv {CONV_CHANNELS} x {CONV_K - 1} bf16 = {state_bytes / 1e6:.1f} MB per MAMBA "
          f"page; {ATTN_LAYERS} attention layers x {KV_HEADS} KV heads x {HEAD_DIM} bf16 = "
          f"{token_bytes // 1024} KiB per token, a KV page of {args.page_size} tokens = "
          f"{args.page_size * token_bytes / 1e6:.2f} MB")


def table(head: list[str], rows: list[list[str]], left: int = 1) -> None:
    """Prints rows under a header, the first `left` columns left-aligned, the others right."""
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    for r in [head] + rows:
        cells = [c.ljust(w) if i < left else c.rjust(w)
                 for i, (c, w) in enumerate(zip(r, widths))]
        print("  " + "  ".join(cells).rstrip())


def ratio_rows(rows: list[tuple[Spec, dict]], ops) -> tuple[list[list[str]], dict]:
    """statepool / Mooncake and statepool / file of the min per op, marked '!' where the goal is
    missed; and {statepool row: {op: (vs Mooncake, vs file)}}."""
    by_family = {s.family: t for s, t in rows if s.family != "statepool"}
    mc, file = by_family.get("mooncake"), by_family["file"]
    out, ratios = [], {}
    for s, t in rows:
        if s.family != "statepool":
            continue
        r_mc = [min(t[op]) / min(mc[op]) for op in ops] if mc else [None] * len(ops)
        r_file = [min(t[op]) / min(file[op]) for op in ops]
        if mc:
            out.append([f"{s.name} / mooncake"]
                       + [f"{x:.2f}x" + ("!" if x > GOAL_VS_MOONCAKE else "") for x in r_mc])
        out.append([f"{s.name} / file"] + [f"{x:.2f}x" + ("!" if x >= 1.0 else "")
                                             for x in r_file])
        ratios[s.name] = dict(zip(ops, zip(r_mc, r_file)))
    return out, ratios


def report(args, results, exists4k, engines) -> None:
    n = args.repeats
    print(f"\nms, min / median of {n} repeats (fresh keys every repeat, the backends in turn); "
          f"ratios: statepool time / other time, of the mins ('!': misses the goal)")
    goals: dict[str, dict[str, tuple]] = {}
    for pages, rows in results.items():
        kv_mb = pages * args.page_size * ATTN_LAYERS * 2 * KV_HEADS * HEAD_DIM * 2 / 1e6
        print(f"\n{pages} KV pages of {args.page_size} tokens ({kv_mb:.1f} MB) and the state "
              f"at their end")
        table(["backend"] + [op.replace("_", " ") for op in OPS] + ["state err"],
              [[s.name] + [ms(t[op]) for op in OPS] + [f"{err:.1e}"] for s, t, err in rows])
        ratio_table, ratios = ratio_rows([(s, t) for s, t, _ in rows], OPS)
        print()
        table(["ratio"] + [op.replace("_", " ") for op in OPS], ratio_table)
        for name, per_op in ratios.items():
            goals.setdefault(name, {}).update({f"{op} @{pages}": r for op, r in per_op.items()})

    print(f"\nbatch_exists_v2 of {EXISTS_PAGES} stored one-token pages (page size 1, as SGLang's "
          "no_buffer mode) with the MAMBA pool's TRAILING_PAGES transfer, the same keys each "
          "repeat")
    specs_of = [s for s, _, _ in next(iter(results.values()))]
    rows = [(s, {"exists": exists4k[s.name]}) for s in specs_of]
    ratio_table, ratios = ratio_rows(rows, ("exists",))
    table(["backend", "exists"], [[s.name, ms(t["exists"])] for s, t in rows])
    print()
    table(["ratio", "exists"], ratio_table)
    for name, per_op in ratios.items():
        goals[name][f"exists {EXISTS_PAGES}x1"] = per_op["exists"]

    print(f"\nthe issue's goal (min of {n}): statepool <= {GOAL_VS_MOONCAKE}x Mooncake on every "
          "operation, and ahead of the file backend")
    for name, per_op in goals.items():
        miss_mc = [op for op, (m, _) in per_op.items() if m is not None and m > GOAL_VS_MOONCAKE]
        miss_file = [op for op, (_, f) in per_op.items() if f >= 1.0]
        have_mc = any(m is not None for m, _ in per_op.values())
        print(f"  {name}:")
        print("    <= 1.5x Mooncake: " + (
            "not measured (no Mooncake)" if not have_mc else "holds on all "
            f"{len(per_op)} operations" if not miss_mc else
            f"does not hold on {len(miss_mc)} of {len(per_op)}: {', '.join(miss_mc)}"))
        print("    ahead of file: " + (
            f"holds on all {len(per_op)} operations" if not miss_file else
            f"does not hold on {len(miss_file)} of {len(per_op)}: {', '.join(miss_file)}"))

    if engines:
        print("\nsecond engine: engine 1 (a process) stores 16 pages and the state at their end "
              "and exits; then engine 2 (a new process) looks them up and reads them")
        rows = []
        for s, w, r in engines:
            found = f"{r['kv_hits']} pages, state at page {r['state_hits']}"
            read = (f"{r['read']} pages and the state, bit-exact" if r["read"] and r["exact"] else
                    f"{r['read']} pages, DIFFERENT" if r["read"] else "nothing")
            rows.append([s.name, f"{w['stored']} pages and the state", found, read])
        table(["backend", "engine 1 stored", "engine 2 found", "engine 2 read"], rows)
        print("  statepool: the daemon holds the prefix; file: the files stay; Mooncake, "
              "embedded client: the data lived in engine 1's own segment and went with it")


def main() -> None:
    args = parse_args()
    if args.engine_child:
        engine_child(args.engine_child, json.loads(args.engine_job))
        return
    mc_master, mc_version = find_mooncake()
    header(args, mc_version if mc_master else None)
    if mc_master is None:
        print(f"mooncake: SKIPPED: {mc_version}; scripts/mooncake-site installs it: "
              "PYTHONPATH=build/python:$(scripts/mooncake-site)")
        if os.environ.get("CI") == "true":
            sys.exit("bench/sglang_hicache.py: Mooncake is not available (CI=true: not skipped)")
    sys.stdout.flush()

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="sglang-hicache-bench-"))
    run = Run(args, tmp, pathlib.Path(args.file_dir) if args.file_dir else tmp / "hicache")
    daemon = None
    try:
        daemon, run.sock = start_daemon(tmp)
        if mc_master is not None:
            run.master = start_master(tmp, mc_master)
        results = run.timings()
        exists = run.exists_one_token_pages()
        engines = run.second_engine() if args.second_engine else []
    except BenchError as e:
        logs = "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in tmp.glob("*.log"))
        sys.exit(f"bench/sglang_hicache.py: FAILED: {e}\n{logs}")
    finally:
        try:
            run.close()
        finally:
            stop(daemon)
            stop(run.master.proc if run.master else None)
            shutil.rmtree(tmp, ignore_errors=True)
            for phase in PHASES:  # what this run wrote into a --file-dir of the caller's
                shutil.rmtree(run.file_dir / phase, ignore_errors=True)
    report(args, results, exists, engines)


if __name__ == "__main__":
    main()
