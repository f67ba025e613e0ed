"""SGLang 0.5.23's own offline engine (`sglang.Engine`: its scheduler, radix cache and HiCache
controller) on the CPU, with statepool as its HiCache storage backend through
`--hicache-storage-backend dynamic`, serving a tiny random-weight Qwen3-Next (tiny_model.py).

Every engine runs in a fresh process (run_engine.py) against one live statepoold:

1. engine A (fp32 states) serves a 64-token prompt P, then P + 8 new tokens: a device hit;
2. engine B, a new process, serves P + 8: its 64-token prefix comes from statepool (storage
   hits in cached_tokens_details, only the 8 new tokens prefilled), output identical to A's;
3. the stored states replaced by zero states (same keys, same layout): a storage hit still, and
   the output differs: the state the engine runs on is the one statepool served;
4. the stored states removed: SGLang discards the prefetched prefix (no restorable prefix
   without the state), prefills all 72 tokens, and the output equals A's again;
5. a stepquant6 state codec: engines A6 and B6 as 1 and 2; B6 hits storage and completes, and
   its output is reported against the fp32 run's.

Slow (about 20-30 s per engine on 2 cores, six engines): marked `slow`, ctest `sglang.engine`.
What the CPU engine needs beyond the PyPI packages (a pure-PyTorch `sgl_kernel` stand-in, a few
post-import patches of SGLang internals, torch.get_device_module() answering torch.cpu) lives in
stubs/, only for this test; see stubs/sgl_cpu_patches.py."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
import zlib

import pytest
from conftest import free_port, serve, start_daemon

from statepool.sglang import KEY_PREFIX

pytestmark = pytest.mark.slow

HERE = pathlib.Path(__file__).resolve().parent
STUBS = HERE / "stubs"
PROMPT = [4 + (i * 37) % 500 for i in range(64)]  # P: 64 tokens of the word-level vocabulary
SUFFIX = [7, 8, 9, 10, 11, 12, 13, 14]              # the 8 new tokens
NEW_TOKENS = 8
ENGINE_TIMEOUT = 300
REPORT: dict = {}


def engine_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(STUBS)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    # SGLang JIT-builds a C++ extension (its HiCache page hash) on first use: keep the build
    # beside the venv, in statepool's cache folder.
    cache = env.get("STATEPOOL_CACHE_DIR") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "statepool")
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(cache, "torch-extensions"))
    return env


def require_build_tools() -> None:
    """SGLang's page hash (sglang/srt/mem_cache/cpp_utils) is a C++ extension that torch builds
    at the engine's first request: g++, ninja, Python's headers and OpenSSL's (libssl-dev)."""
    import shutil
    import sysconfig

    missing = [what for what, ok in (
        ("g++", shutil.which("g++")), ("ninja", shutil.which("ninja")),
        ("python3-dev", os.path.exists(os.path.join(sysconfig.get_paths()["include"],
                                                    "Python.h"))),
        ("libssl-dev", os.path.exists("/usr/include/openssl/sha.h"))) if not ok]
    if missing:
        message = ("SGLang's engine builds a C++ extension and needs "
                   + ", ".join(missing) + " (apt-get install g++ ninja-build python3-dev "
                   "libssl-dev)")
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("tiny-qwen3-next")
    subprocess.run([sys.executable, str(HERE / "tiny_model.py"), str(out)], check=True,
                   env=engine_env(), timeout=300, capture_output=True)
    return out


@pytest.fixture(scope="module")
def engine_daemon(tmp_path_factory):
    yield from serve(start_daemon(tmp_path_factory.mktemp("statepoold-engine")))


def extra_config(d, **overrides) -> dict:
    extra = {"backend_name": "statepool", "module_path": "statepool.sglang",
             "class_name": "StatepoolHiCacheStorage", "interface_v1": 1, "socket": d.socket,
             "tenant": "team-a", "state_codec": "fp32", "kv_codec": "bf16",
             "state_arena_pages": 64, "kv_arena_mib": 8, "timeout": 10,
             # SGLang's own setting: the default (256 tokens) skips a 64-token prefix.
             "prefetch_threshold": 16}
    extra.update(overrides)
    return extra


def run_engine(model: pathlib.Path, tmp: pathlib.Path, name: str, extra: dict,
               requests: list[list[int]]) -> dict:
    plan = tmp / f"{name}.plan.json"
    out = tmp / f"{name}.out.json"
    log = tmp / f"{name}.log"
    plan.write_text(json.dumps({"extra_config": extra, "requests": requests,
                                "max_new_tokens": NEW_TOKENS, "log_level": "info",
                                "port": free_port()}))
    start = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, str(HERE / "run_engine.py"), str(model),
                               str(plan), str(out)], env=engine_env(), cwd=tmp, stdout=f,
                              stderr=subprocess.STDOUT, timeout=ENGINE_TIMEOUT)
    seconds = time.monotonic() - start
    text = log.read_text()
    assert proc.returncode == 0 and out.exists(), (
        f"engine {name} failed ({proc.returncode}); last lines of {log}:\n"
        + "\n".join(text.splitlines()[-60:]))
    result = json.loads(out.read_text())
    result["wall_seconds"] = round(seconds, 1)
    result["log"] = text
    REPORT[name] = {"wall_s": result["wall_seconds"],
                    "requests": [{k: r[k] for k in ("output_ids", "cached_tokens",
                                                    "cached_tokens_details")}
                                 for r in result["results"]]}
    print(f"engine {name}: {result['wall_seconds']} s, "
          + "; ".join(f"out={r['output_ids']} cached={r['cached_tokens_details']}"
                      for r in result["results"]))
    return result


def storage_tokens(r: dict) -> int:
    return (r.get("cached_tokens_details") or {}).get("storage", 0)


def mamba_snapshots(conn) -> list:
    return [s for s in conn.list_snapshots(KEY_PREFIX).snapshots if b"/mamba/" in s.prefix]


def zeroed(value: bytes) -> bytes:
    """A snapshot value (service/store/snapshot_value.hpp, format 2) with its page zeroed and
    its CRC-32 made again: for an fp32 state layout, a zero recurrent and conv state."""
    assert value[:8] == b"SPSNAP\r\n" and int.from_bytes(value[8:10], "little") == 2
    n = int.from_bytes(value[10:12], "little")
    p = int.from_bytes(value[12:14], "little")
    m = int.from_bytes(value[28:36], "little")
    start = 80 + n + p
    out = bytearray(value)
    out[start:start + m] = bytes(m)
    out[16:20] = zlib.crc32(bytes(out[20:])).to_bytes(4, "little")
    return bytes(out)


def test_engine_end_to_end(model_dir, engine_daemon, tmp_path):
    require_build_tools()
    d = engine_daemon
    # fp32 engines with SGLang's shared-memory host pools (the daemon reads and writes them in
    # place), stepquant6 ones with its default allocator (one copy through staging).
    fp32 = extra_config(d, allocator="shm")
    full = PROMPT + SUFFIX

    # 1. Engine A: P, then P + 8 (a hit in the engine's own memory), writing through to
    # statepool.
    a = run_engine(model_dir, tmp_path, "A", fp32, [PROMPT, full])
    a_cold, a_hit = a["results"]
    assert a_hit["cached_tokens"] == len(PROMPT), a_hit
    assert "host KV pool" in a["log"] and "zero copy: the host KV pool" in a["log"], \
        "the engine's host KV pool was not lent to the daemon"
    assert "zero copy: the host state pool" in a["log"]
    conn = d.connect()
    states = mamba_snapshots(conn)
    assert states, "engine A stored no MAMBA state in statepool"
    kv = [s for s in conn.list_snapshots(KEY_PREFIX).snapshots if b"/kv-" in s.prefix]
    assert len(kv) >= len(PROMPT), f"engine A stored {len(kv)} KV pages"

    # 2. Engine B, a fresh process: the prefix from statepool, identical output.
    b = run_engine(model_dir, tmp_path, "B", fp32, [full])["results"][0]
    assert storage_tokens(b) == len(PROMPT), b
    assert b["cached_tokens"] == len(PROMPT), b
    assert b["output_ids"] == a_hit["output_ids"]

    # 3. The stored states replaced by zero states under the same keys and layout.
    for s in mamba_snapshots(conn):
        value = conn.export_snapshot_bytes(s.prefix, s.position, s.layout_digest)
        assert value is not None
        assert conn.delete_snapshot(s.prefix, s.position) >= 1
        conn.import_snapshot_bytes(zeroed(value))
    z = run_engine(model_dir, tmp_path, "B-zero-state", fp32, [full])["results"][0]
    assert storage_tokens(z) == len(PROMPT), z
    assert z["output_ids"] != a_hit["output_ids"], "a zero state gave the same output"

    # 4. The stored states removed: no restorable prefix, a full prefill, A's output.
    for s in mamba_snapshots(conn):
        conn.delete_snapshot(s.prefix, s.position)
    assert not mamba_snapshots(conn)
    r = run_engine(model_dir, tmp_path, "B-no-state", fp32, [full])["results"][0]
    assert storage_tokens(r) == 0 and not r["cached_tokens"], r
    assert r["output_ids"] == a_hit["output_ids"]
    conn.close()

    # 5. stepquant6 states (KV pages stay bf16): A6 stores, B6 hits and completes.
    sq6 = extra_config(d, state_codec="stepquant6")
    run_engine(model_dir, tmp_path, "A-stepquant6", sq6, [PROMPT])
    b6 = run_engine(model_dir, tmp_path, "B-stepquant6", sq6, [full])["results"][0]
    assert storage_tokens(b6) == len(PROMPT), b6
    assert len(b6["output_ids"]) == NEW_TOKENS
    same = next((i for i, (x, y) in enumerate(zip(b6["output_ids"], a_hit["output_ids"]))
                 if x != y), NEW_TOKENS)
    REPORT["stepquant6_vs_fp32"] = {"fp32": a_hit["output_ids"], "stepquant6": b6["output_ids"],
                                    "leading_tokens_equal": same}
    print(f"stepquant6 vs fp32: first {same} of {NEW_TOKENS} output tokens equal "
          f"(fp32 {a_hit['output_ids']}, stepquant6 {b6['output_ids']})")
    report = os.environ.get("STATEPOOL_SGLANG_ENGINE_REPORT")
    if report:
        pathlib.Path(report).write_text(json.dumps(REPORT, indent=1))
