#!/usr/bin/env python3
"""Set/get of a Qwen3-Next-shaped MAMBA page and its KV pages through SGLang's HiCache storage
interface: statepool's backend (statepool.sglang) against SGLang's own file backend (HiCacheFile)
on the same machine, side by side in one run, ratios printed.

    PY=$(scripts/sglang-venv)
    PYTHONPATH=build/python $PY bench/sglang_hicache.py [--pages 16] [--repeats 5]

Shapes: Qwen3-Next-80B-A3B (docs/models/qwen3-next-80b-a3b-instruct.json) at TP 1: 36
gated-delta-rule layers x 32 value heads x 128 x 128 fp32 state plus a conv state of 8,192
channels x 3 in bf16 (77 MB per MAMBA page), and 12 full-attention layers x 2 KV heads x 256 in
bf16 (24 KiB per token). One "prefix" is --pages KV pages of --page-size tokens and the state at
its end, as SGLang's hybrid cache controller writes them (batch_set_v2 for the MAMBA pool,
batch_set_v1 for statepool's zero-copy KV path, batch_set of flat data pages for HiCacheFile,
which has no v1 path) and reads them back into other host pages and slots. Every repeat uses
fresh keys (both backends skip keys they hold). The file backend writes into --file-dir (default:
a temporary folder under /tmp); its reads come from the page cache when the files are hot, as
here. The daemon is started here (build/service/statepoold or $STATEPOOL_DAEMON) with a private
socket. Timings are medians; ratios are file time / statepool time (above 1: statepool faster).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

warnings.filterwarnings("ignore", category=UserWarning)

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
from statepool.sglang import StatepoolHiCacheStorage  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Qwen3-Next-80B-A3B at TP 1
GDN_LAYERS, HV, HK, DK, DV, CONV_K = 36, 32, 16, 128, 128, 4
ATTN_LAYERS, KV_HEADS, HEAD_DIM = 12, 2, 256
CONV_CHANNELS = 2 * HK * DK + HV * DV


def kv_pool(page_size: int, pages: int) -> MHATokenToKVPoolHost:
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
    return MHATokenToKVPoolHost(info, 2.0, 0, page_size, "page_first", pin_memory=False,
                                device="cpu", device_capacity_tokens=dev, start_layer=0,
                                end_layer=ATTN_LAYERS - 1, host_token_capacity=pages * page_size)


def mamba_pool() -> MambaPoolHost:
    temporal = torch.zeros(GDN_LAYERS, 1, HV, DV, DK, dtype=torch.float32)
    conv = (torch.zeros(GDN_LAYERS, 1, CONV_CHANNELS, CONV_K - 1, dtype=torch.bfloat16),)
    return MambaPoolHost(MambaStateBufferInfo(temporal=temporal, conv=conv), 2.0, 0,
                         device_capacity=1, pin_memory=False, device="cpu", layout="page_first")


def config(extra: dict) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
                                is_page_first_layout=True, model_name="Qwen/Qwen3-Next-80B-A3B",
                                extra_config=extra)


def start_daemon(tmp: pathlib.Path, capacity: str) -> tuple[subprocess.Popen, str]:
    binary = os.environ.get("STATEPOOL_DAEMON", str(ROOT / "build/service/statepoold"))
    sock = str(tmp / "statepool.sock")
    proc = subprocess.Popen([binary, "--socket", sock, "--metrics-address", "off",
                             "--api-address", "off", "--pool-capacity", capacity,
                             "--tenant", "bench"],
                            stdout=open(tmp / "statepoold.log", "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while True:
        try:
            statepool.connect(sock, tenant="bench", timeout=2).close()
            return proc, sock
        except statepool.TransportError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                sys.exit("statepoold did not start:\n" + (tmp / "statepoold.log").read_text())
            time.sleep(0.05)


def keys_for(tag: str, n: int) -> list[str]:
    out, prev = [], tag.encode()
    for i in range(n):
        prev = hashlib.sha256(prev + bytes([i % 256])).digest()
        out.append(prev.hex())
    return out


def run(name, backend, kv, mamba, pages: int, repeats: int) -> dict:
    ps = kv.page_size
    src = torch.arange(0, pages * ps, dtype=torch.int64)
    dst = torch.arange(pages * ps, 2 * pages * ps, dtype=torch.int64)
    zero_copy = isinstance(backend, StatepoolHiCacheStorage)
    times = {"set_state": [], "set_kv": [], "exists": [], "get_state": [], "get_kv": []}
    for r in range(repeats):
        keys = keys_for(f"{name}-{r}", pages)
        mt = lambda slot: PoolTransfer(name=PoolName.MAMBA, keys=[keys[-1]],  # noqa: E731
                                       host_indices=torch.tensor([slot]),
                                       hit_policy=PoolHitPolicy.TRAILING_PAGES)
        t0 = time.perf_counter()
        ok = backend.batch_set_v2([mt(0)])[PoolName.MAMBA] == [True]
        t1 = time.perf_counter()
        if zero_copy:
            ok &= all(backend.batch_set_v1(keys, src))
        else:
            ok &= backend.batch_set(keys, [kv.get_data_page(i * ps) for i in range(pages)])
        t2 = time.perf_counter()
        hit = backend.batch_exists_v2(keys, [PoolTransfer(name=PoolName.MAMBA, keys=[keys[-1]],
                                                          hit_policy=PoolHitPolicy.TRAILING_PAGES)])
        t3 = time.perf_counter()
        ok &= backend.batch_get_v2([mt(1)])[PoolName.MAMBA] == [True]
        t4 = time.perf_counter()
        if zero_copy:
            ok &= all(backend.batch_get_v1(keys, dst))
        else:
            for i, key in enumerate(keys):
                page = backend.get(key, kv.get_dummy_flat_data_page())
                ok &= page is not None
                kv.set_from_flat_data_page((pages + i) * ps, page)
        t5 = time.perf_counter()
        if not ok or hit.kv_hit_pages != pages:
            sys.exit(f"{name}: a set or get failed (hit {hit.kv_hit_pages} of {pages})")
        for k, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
            times[k].append(dt)
    state_err = ((mamba.temporal_buffer[0] - mamba.temporal_buffer[1]).abs().max()
                 / mamba.temporal_buffer[0].abs().max()).item()
    kv_equal = torch.equal(kv.kv_buffer[:, :pages * ps], kv.kv_buffer[:, pages * ps:2 * pages * ps])
    mamba.temporal_buffer[1].zero_()
    kv.kv_buffer[:, pages * ps:].zero_()
    return {k: statistics.median(v) for k, v in times.items()} | {"state_err": state_err,
                                                                  "kv_exact": kv_equal}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=16, help="KV pages per prefix (default 16)")
    ap.add_argument("--page-size", type=int, default=64, help="tokens per KV page (default 64)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--file-dir", default="", help="HiCacheFile's folder (default: under /tmp)")
    ap.add_argument("--codecs", default="fp32,stepquant6", help="statepool state codecs")
    args = ap.parse_args()

    torch.manual_seed(0)
    kv, mamba = kv_pool(args.page_size, 2 * args.pages), mamba_pool()
    kv.kv_buffer[:, :args.pages * args.page_size].normal_()
    mamba.temporal_buffer[0].normal_()
    mamba.conv_buffer[0][0].normal_()
    state_mb = mamba.get_size_per_token() / 1e6
    kv_mb = args.pages * args.page_size * kv.get_size_per_token() / 1e6

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="sglang-hicache-bench-"))
    file_dir = pathlib.Path(args.file_dir) if args.file_dir else tmp / "hicache"
    proc, sock = start_daemon(tmp, "8GiB")
    results = {}
    try:
        file = StorageBackendFactory.create_backend(
            "file", config({"file_storage_path": str(file_dir)}), kv)
        backends = [("file", file)]
        for codec in args.codecs.split(","):
            extra = {"backend_name": "statepool", "module_path": "statepool.sglang",
                     "class_name": "StatepoolHiCacheStorage", "interface_v1": 1, "socket": sock,
                     "tenant": "bench", "state_codec": codec, "kv_codec": "bf16",
                     "state_arena_pages": 2 * args.repeats + 4,
                     # one small arena for every codec's KV entries (the same layout)
                     "kv_arena_mib": int(1.1 * kv_mb * len(args.codecs.split(","))
                                         * (args.repeats + 2)) + 64,
                     "namespace": f"bench-{codec}"}
            backends.append((f"statepool {codec}",
                             StorageBackendFactory.create_backend("dynamic", config(extra), kv)))
        for name, backend in backends:
            backend.register_mem_pool_host(kv)
            backend.register_mem_host_pool_v2(kv, PoolName.KV)
            backend.register_mem_host_pool_v2(mamba, PoolName.MAMBA)
            run(name, backend, kv, mamba, args.pages, 1)  # warm-up: arenas, files, page cache
            results[name] = run(name + "+", backend, kv, mamba, args.pages, args.repeats)
        disk = sum(f.stat().st_size for f in file_dir.iterdir()) / (args.repeats + 1)
        with statepool.connect(sock, tenant="bench") as c:
            arenas = [(a.layout_name, a.codec.name, a.pages_used, a.page_bytes,
                       a.stored_bytes_used, a.fp32_bytes_used) for a in c.stats().arenas]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"Qwen3-Next-80B-A3B shapes: MAMBA page {state_mb:.1f} MB, {args.pages} KV pages of "
          f"{args.page_size} tokens = {kv_mb:.1f} MB; median of {args.repeats}; "
          f"HiCacheFile stores {disk / 1e6:.1f} MB per prefix")
    for name, codec, pages, page, stored, fp32 in arenas:
        print(f"statepool arena {name} ({codec}): {pages} pages of {page / 1e6:.3f} MB in use, "
              f"{stored / 1e6:.1f} MB stored for {fp32 / 1e6:.1f} MB as FP32")
    cols = ["set_state", "set_kv", "exists", "get_state", "get_kv"]
    print(f"{'backend':<22}" + "".join(f"{c + ' ms':>14}" for c in cols)
          + f"{'state err':>12}{'kv exact':>10}")
    base = results["file"]
    for name, r in results.items():
        print(f"{name:<22}" + "".join(f"{r[c] * 1e3:>14.2f}" for c in cols)
              + f"{r['state_err']:>12.2e}{str(r['kv_exact']):>10}")
    for name, r in results.items():
        if name == "file":
            continue
        print(f"{'file / ' + name:<22}" + "".join(f"{base[c] / r[c]:>13.2f}x" for c in cols))


if __name__ == "__main__":
    main()
