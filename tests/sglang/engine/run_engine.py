"""One SGLang engine run, in a process of its own: SGLang 0.5.23's offline `sglang.Engine` on
the CPU serving the tiny Qwen3-Next of tiny_model.py, with statepool as its HiCache storage
backend (`--hicache-storage-backend dynamic`). Each request of the plan is sent in turn; the
result (output token ids, cached-token breakdown per request, wall times) is written as JSON.

    run_engine.py MODEL_DIR PLAN.json OUT.json

PLAN: {"extra_config": {...backend extra config...}, "requests": [[token ids], ...],
"max_new_tokens": N, "port": P, "log_level": L}

Needs the test-only environment of tests/sglang/engine (engine_env() in the test): the
pure-PyTorch `sgl_kernel` stand-in and the `sitecustomize` of stubs/ first on PYTHONPATH,
SGLANG_USE_CPU_ENGINE=1."""

from __future__ import annotations

import json
import pathlib
import sys
import time


def main() -> int:
    model_dir, plan_path, out_path = sys.argv[1:4]
    plan = json.loads(pathlib.Path(plan_path).read_text())
    t0 = time.monotonic()
    import sglang

    engine = sglang.Engine(
        model_path=model_dir,
        tokenizer_path=model_dir,
        device="cpu",
        dtype="bfloat16",
        attention_backend="torch_native",
        disable_cuda_graph=True,
        disable_overlap_schedule=True,
        mamba_radix_cache_strategy="no_buffer",
        page_size=1,
        max_total_tokens=1024,
        max_mamba_cache_size=8,
        max_running_requests=4,
        chunked_prefill_size=256,
        enable_hierarchical_cache=True,
        hicache_ratio=2,
        hicache_write_policy="write_through",
        hicache_io_backend="direct",
        hicache_mem_layout="page_first_direct",
        hicache_storage_prefetch_policy="wait_complete",
        hicache_storage_backend="dynamic",
        hicache_storage_backend_extra_config=json.dumps(plan["extra_config"]),
        enable_cache_report=True,
        random_seed=0,
        port=plan.get("port", 30000),  # SGLang derives its other ports from it
        log_level=plan.get("log_level", "warning"),
    )
    started = time.monotonic()
    results = []
    sampling = {"temperature": 0.0, "max_new_tokens": plan.get("max_new_tokens", 8)}
    for ids in plan["requests"]:
        r0 = time.monotonic()
        out = engine.generate(input_ids=ids, sampling_params=sampling)
        meta = out.get("meta_info", {})
        results.append({
            "output_ids": out.get("output_ids"),
            "text": out.get("text"),
            "cached_tokens": meta.get("cached_tokens"),
            "cached_tokens_details": meta.get("cached_tokens_details"),
            "seconds": round(time.monotonic() - r0, 3),
        })
    engine.shutdown()
    pathlib.Path(out_path).write_text(json.dumps({
        "results": results,
        "startup_seconds": round(started - t0, 2),
        "total_seconds": round(time.monotonic() - t0, 2),
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
