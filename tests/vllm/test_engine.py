"""vLLM 0.32's own engine (``vllm.LLM``: engine core process, scheduler, hybrid KV-cache manager,
CPU model runner) serving a tiny random-weight Qwen3-Next with statepool's offloading spec and
connector, two engine processes one after the other against one statepoold (run_engine.py):

1. engine A serves prompts P1, P2, P3 (300 tokens each) one by one: no statepool hits (the
   store is empty), so its tokens are those of a run without the connector; it stores the
   states at token 256 and the attention blocks (fp32 state codec, bf16 KV codec);
2. engine B, a new process, serves P1 and P2: 256 of each prompt's tokens come from
   statepool (num_cached_tokens; vLLM's own prefix cache is empty in a new process) and its
   tokens equal A's;
3. B's stored states replaced by their stepquant6 round trip (the daemon's codec, nominal
   plan), vLLM's prefix cache reset: P1 and P2 load those; how many tokens differ from A's is
   reported;
4. statepoold killed while B serves P1, P2, P3 in one batch: every request finishes; then P3
   again: nothing from statepool, A's tokens.

Slow (two engine starts, about 20 s each on 2 cores): marked `slow`, ctest `vllm.engine`."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from conftest import HERE, REPORT, extra_config, prompt, start_daemon

pytestmark = pytest.mark.slow

ENGINE_TIMEOUT = 300
NEW_TOKENS = 16
CACHED = 256


def run_engine(tmp: pathlib.Path, name: str, plan: dict) -> dict:
    plan_path, out_path, log_path = (tmp / f"{name}.plan.json", tmp / f"{name}.out.json",
                                     tmp / f"{name}.log")
    plan_path.write_text(json.dumps(plan))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    with open(log_path, "w") as log:
        proc = subprocess.run([sys.executable, str(HERE / "run_engine.py"), str(plan_path),
                               str(out_path)], stdout=log, stderr=subprocess.STDOUT, env=env,
                              timeout=ENGINE_TIMEOUT, cwd=tmp)
    text = log_path.read_text()
    assert proc.returncode == 0, f"engine {name} failed ({proc.returncode}):\n{text[-6000:]}"
    return json.loads(out_path.read_text())


def test_two_engines_share_states_and_blocks_through_statepool(tmp_path, model_dir):
    d = start_daemon(tmp_path / "statepoold")
    p1, p2, p3 = prompt(101), prompt(102), prompt(103)
    extra = extra_config(d.socket)
    try:
        a = run_engine(tmp_path, "A", {
            "model": str(model_dir), "extra_config": extra, "max_tokens": NEW_TOKENS,
            # the last generate lets vLLM submit P3's deferred stores (a step's stores start
            # with the next step)
            "steps": [{"op": "generate", "prompts": [p1, p2, p3, p1[:20]]}]})
        ref = a["steps"][0]["results"]
        assert [r["cached"] for r in ref[:3]] == [0, 0, 0]
        b = run_engine(tmp_path, "B", {
            "model": str(model_dir), "extra_config": extra, "max_tokens": NEW_TOKENS,
            "steps": [
                {"op": "generate", "prompts": [p1, p2]},
                {"op": "reset_prefix_cache"},
                {"op": "degrade_states", "codec": "stepquant6"},
                {"op": "generate", "prompts": [p1, p2]},
                {"op": "reset_prefix_cache"},
                {"op": "generate_batch", "prompts": [p1, p2, p3], "kill_after": 0.05,
                 "pid": d.process.pid},
                {"op": "reset_prefix_cache"},
                {"op": "generate", "prompts": [p3]},
            ]})
    finally:
        if d.process.poll() is None:
            d.stop()
    exact, _, degraded, lossy, _, killed, _, after = b["steps"]
    # 2. statepool served 256 tokens of each prompt, and the tokens are A's
    assert [r["cached"] for r in exact["results"]] == [CACHED, CACHED]
    assert [r["tokens"] for r in exact["results"]] == [ref[0]["tokens"], ref[1]["tokens"]]
    # 3. stepquant6 states: served, and reported against A
    assert degraded["states"] >= 2
    assert [r["cached"] for r in lossy["results"]] == [CACHED, CACHED]
    differ = [sum(x != y for x, y in zip(r["tokens"], ref[i]["tokens"]))
              for i, r in enumerate(lossy["results"])]
    leading = [next((j for j, (x, y) in enumerate(zip(r["tokens"], ref[i]["tokens"])) if x != y),
                    NEW_TOKENS) for i, r in enumerate(lossy["results"])]
    # 4. the daemon killed during a batch: every request finishes; then misses, A's tokens
    assert d.process.poll() is not None
    assert [len(r["tokens"]) for r in killed["results"]] == [NEW_TOKENS] * 3
    assert after["results"][0]["cached"] == 0
    assert after["results"][0]["tokens"] == ref[2]["tokens"]
    REPORT.append(f"vLLM engine test: engine A start {a['startup_seconds']} s, total "
          f"{a['total_seconds']} s; engine B start {b['startup_seconds']} s, total "
          f"{b['total_seconds']} s; B from statepool: {CACHED} tokens of each 300-token "
          f"prompt, tokens equal A's (fp32 states); stepquant6 states: "
          f"{differ} of {NEW_TOKENS} tokens differ from A's (first difference at "
          f"{leading}); daemon killed mid-batch: 3 of 3 requests finished "
          f"(cached {[r['cached'] for r in killed['results']]})")
