"""One vLLM engine run, in a process of its own: vLLM 0.32's offline ``vllm.LLM`` on the CPU
serving the tiny Qwen3-Next of tiny_model.py with statepool's offloading spec, running the
steps of a plan and writing what happened as JSON.

    run_engine.py PLAN.json OUT.json

PLAN: {"model": dir, "extra_config": {...}, "max_tokens": N, "steps": [step, ...]}, a step one
of {"op": "generate", "prompts": [[ids], ...]} (each prompt its own generate call, greedy),
{"op": "generate_batch", "prompts": [...], "kill_after": seconds, "pid": P} (one generate call
for all; with kill_after, statepoold (pid P) is killed that long after it starts),
{"op": "reset_prefix_cache"} (vLLM's own prefix cache: later hits come from statepool), and
{"op": "degrade_states", "codec": "stepquant6"} (every stored Mamba state replaced by what a
store and load under that codec, nominal plan, returns: the daemon's own codec code, through
statepool's PageCodec).

vLLM runs its engine core in another process (spawn): hence the ``__main__`` guard.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import sys
import threading
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def degrade_states(extra: dict, codec_name: str) -> int:
    """Replaces every stored state of the tiny model by its round trip through ``codec_name``;
    returns how many."""
    import statepool
    import tiny_model
    from statepool.vllm import KEY_PREFIX

    layers = tiny_model.LINEAR_LAYERS
    heads, value_dim, key_dim = tiny_model.STATE
    # the layout statepool.vllm registers for the tiny model's Mamba group (fp32 codec)
    layout = statepool.StateLayout(
        arch=statepool.Arch.gdn, num_layers=layers, num_heads=heads, key_dim=key_dim,
        value_dim=value_dim, conv_channels=max(tiny_model.CONV), conv_width=min(tiny_model.CONV),
        conv_dtype=statepool.DType.bf16, codec=statepool.CodecId.fp32,
        name=f"vllm-state-{layers}x{heads}x{value_dim}x{key_dim}")
    codec_id = statepool.CodecId.__members__[codec_name]
    lossy = statepool.PageCodec(layout.with_codec(codec_id, statepool.Plan.nominal(layout, 6)))
    n = 0
    with statepool.connect(extra["socket"], tenant=extra.get("tenant", "")) as conn:
        info = conn.register_layout(layout)
        arena = conn.open_arena(info, 0)
        staging = conn.open_staging(info.state_bytes_f32)
        state = bytearray(info.state_bytes_f32)
        page = bytearray(lossy.page_bytes)
        view = memoryview(staging.view("uint8"))
        for e in conn.list_snapshots(KEY_PREFIX, 10000).snapshots:
            if e.layout_id != info.id:
                continue
            rng = statepool.StateRange(staging, 0, statepool.DType.f32)
            got = conn.get_snapshots(arena.id, [statepool.SnapshotGetEntry(e.prefix, 0, rng)])
            if not got.results[0].hit:
                continue
            state[:] = view[:len(state)]
            lossy.encode(state, statepool.DType.f32, page)
            lossy.decode(page, statepool.DType.f32, state)
            view[:len(state)] = state
            conn.delete_snapshot(e.prefix, 0)
            puts = conn.put_snapshots(arena.id, [statepool.SnapshotPutEntry(e.prefix, 0, rng)])
            assert puts.created == 1, puts
            n += 1
        del view
        staging.close()
        arena.close()
    return n


def main() -> int:
    plan = json.loads(pathlib.Path(sys.argv[1]).read_text())
    out_path = pathlib.Path(sys.argv[2])
    t0 = time.monotonic()
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    extra = plan["extra_config"]
    llm = LLM(model=plan["model"], enforce_eager=True, skip_tokenizer_init=True,
              enable_prefix_caching=True, dtype="bfloat16", max_model_len=1024,
              max_num_seqs=4, seed=0, mamba_ssm_cache_dtype="float32",
              kv_transfer_config=KVTransferConfig(
                  kv_connector="StatepoolConnector", kv_connector_module_path="statepool.vllm",
                  kv_role="kv_both", kv_load_failure_policy="recompute",
                  kv_connector_extra_config=extra))
    started = time.monotonic()
    sampling = SamplingParams(temperature=0.0, max_tokens=plan.get("max_tokens", 16),
                              detokenize=False)

    def generate(prompts):
        r0 = time.monotonic()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sampling,
                            use_tqdm=False)
        return [{"tokens": list(o.outputs[0].token_ids), "cached": o.num_cached_tokens,
                 "seconds": round(time.monotonic() - r0, 3)} for o in outs]

    steps = []
    for step in plan["steps"]:
        op = step["op"]
        record = {"op": op}
        if op == "generate":
            record["results"] = [generate([p])[0] for p in step["prompts"]]
        elif op == "generate_batch":
            killer = None
            if step.get("kill_after") is not None:
                killer = threading.Timer(step["kill_after"],
                                         lambda: os.kill(step["pid"], signal.SIGKILL))
                killer.start()
            record["results"] = generate(step["prompts"])
            if killer is not None:
                killer.join()
        elif op == "reset_prefix_cache":
            record["ok"] = bool(llm.reset_prefix_cache())
        elif op == "degrade_states":
            record["states"] = degrade_states(extra, step["codec"])
        else:
            raise ValueError(f"unknown op {op}")
        steps.append(record)
        print("STEP", json.dumps(record), flush=True)
    out_path.write_text(json.dumps({"steps": steps, "startup_seconds": round(started - t0, 2),
                                    "total_seconds": round(time.monotonic() - t0, 2)},
                                   indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
