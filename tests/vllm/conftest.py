"""Fixtures of the vLLM offloading tests: real statepoold processes (the Daemon helper of
tests/python/conftest.py and the fixtures of tests/engine_fixtures.py, shared with
tests/sglang), the tiny Qwen3-Next of tiny_model.py, and ``Harness``: vLLM 0.32's own
Scheduler (its hybrid KV-cache manager, the OffloadingConnector's scheduler side and so
statepool's manager) and a WORKER-role connector over CPU page tensors (so statepool's worker),
driven step by step as vLLM's engine core and model runner drive them, without a model or an
engine process. Runs in the venv of scripts/vllm-venv (tests/vllm/run-pytest)."""

from __future__ import annotations

import importlib.util
import logging
import pathlib
import sys
import time
from typing import Callable, Dict, List, Optional

import pytest
import torch

HERE = pathlib.Path(__file__).resolve().parent

# tests/engine_fixtures.py (the statepoold fixtures shared with tests/sglang) under its own name.
_spec = importlib.util.spec_from_file_location(
    "statepool_engine_fixtures", pathlib.Path(__file__).resolve().parents[1] / "engine_fixtures.py")
sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sys.modules[_spec.name])
from statepool_engine_fixtures import (  # noqa: E402,F401 - for the tests, and fixtures
    Daemon,
    daemon,
    kill_daemon,
    redis_server,
    start_daemon,
    stop_daemon_process,
)

import tiny_model  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.config import KVTransferConfig, set_current_vllm_config  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.forward_context import ForwardContext  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    get_kv_cache_configs,
    get_request_block_hasher,
    init_none_hash,
    resolve_kv_cache_block_sizes,
)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

import statepool  # noqa: E402
from statepool.vllm import StatepoolOffloadingWorker  # noqa: E402

TENANT = "team-a"
BS = tiny_model.BLOCK


# Lines the tests report (timings, how many tokens a lossy codec changed): printed at the end
# of the run, also under ctest (which shows pytest's output, not the captured prints).
REPORT: List[str] = []


def pytest_terminal_summary(terminalreporter):
    if REPORT:
        terminalreporter.section("statepool.vllm report")
        for line in REPORT:
            terminalreporter.write_line(line)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: real vLLM engines end to end (ctest vllm.engine); `-m 'not slow'` "
        "leaves them out")


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> pathlib.Path:
    return tiny_model.build(tmp_path_factory.mktemp("tiny-qwen3-next"))


def extra_config(socket: str, **overrides) -> dict:
    extra = {"spec_name": "StatepoolOffloadingSpec", "spec_module_path": "statepool.vllm",
             "socket": socket, "tenant": TENANT, "state_codec": "fp32", "kv_codec": "bf16",
             "state_arena_pages": 64, "kv_arena_mib": 32, "retry_interval": 0.2, "timeout": 5}
    extra.update(overrides)
    return extra


def transfer_config(extra: dict, connector: str = "StatepoolConnector") -> KVTransferConfig:
    ours = connector == "StatepoolConnector"
    return KVTransferConfig(kv_connector=connector, kv_role="kv_both",
                            kv_connector_module_path="statepool.vllm" if ours else None,
                            kv_load_failure_policy="recompute",
                            kv_connector_extra_config=extra)


def prompt(seed: int, n: int = 300) -> List[int]:
    return [4 + (i * 7 + seed * 131) % 500 for i in range(n)]


def _record_jobs() -> None:
    """Every StatepoolOffloadingWorker keeps the jobs it was given in ``test_jobs``:
    (store?, keys, (group id, block) per key), as vLLM handed them over."""
    original = StatepoolOffloadingWorker._submit

    def submit(worker, job_id, store, ours, engine_side):
        jobs = worker.__dict__.setdefault("test_jobs", [])
        try:
            jobs.append((store, list(ours.keys), worker._blocks(engine_side)))
        except Exception:  # noqa: BLE001 - the worker reports it
            jobs.append((store, None, None))
        return original(worker, job_id, store, ours, engine_side)

    StatepoolOffloadingWorker._submit = submit


_record_jobs()


class Harness:
    """vLLM's Scheduler and a worker-side connector over CPU pages, without a model.

    The KV-cache specs are the tiny Qwen3-Next's as vLLM 0.32's CPU platform makes them
    (block 128, Mamba align mode, the Mamba page padded to the attention page); every
    KVCacheTensor overlays one int8 buffer (``raw``), a block belonging to one group at a
    time, as the CPU model runner allocates it. ``fill`` writes random finite values where a
    forward pass would write. ``jobs``: every job the worker was given."""

    def __init__(self, model_dir: pathlib.Path, extra: dict,
                 connector: str = "StatepoolConnector"):
        args = EngineArgs(model=str(model_dir), skip_tokenizer_init=True, enforce_eager=True,
                          enable_prefix_caching=True, max_model_len=1024, max_num_seqs=4,
                          dtype="bfloat16", kv_transfer_config=transfer_config(extra, connector))
        vc = args.create_engine_config()
        # what the engine core and the CPU worker resolve for this model
        vc.cache_config.kv_cache_layout = "LBHNC"
        vc.cache_config.block_size = BS
        vc.cache_config.mamba_block_size = BS
        attn = FullAttentionSpec(block_size=BS, num_kv_heads=tiny_model.KV_HEADS,
                                 head_size=tiny_model.HEAD_DIM, dtype=torch.bfloat16)
        mamba = MambaSpec(block_size=BS, shapes=(tiny_model.CONV, tiny_model.STATE),
                          dtypes=(torch.bfloat16, torch.float32),
                          page_size_padded=attn.page_size_bytes, mamba_cache_mode="align")
        self.specs = {"model.layers.0.linear_attn": mamba,
                      "model.layers.1.self_attn.attn": attn,
                      "model.layers.2.linear_attn": mamba,
                      "model.layers.3.self_attn.attn": attn}
        self.attn, self.mamba = attn, mamba
        with set_current_vllm_config(vc):
            kcc = get_kv_cache_configs(vc, [self.specs], [64 * attn.page_size_bytes * 4])[0]
        vc.cache_config.num_gpu_blocks = kcc.num_blocks
        sched_bs, hash_bs = resolve_kv_cache_block_sizes(kcc, vc)
        self.vc, self.kcc = vc, kcc
        with set_current_vllm_config(vc):
            self.sched = Scheduler(vllm_config=vc, kv_cache_config=kcc,
                                   structured_output_manager=StructuredOutputManager(vc),
                                   block_size=sched_bs, hash_block_size=hash_bs, log_stats=True)
            cls = type(self.sched.connector)
            self.wconn = cls(vc, KVConnectorRole.WORKER, kcc)
            self.raw = torch.zeros(max(t.offset + t.size for t in kcc.kv_cache_tensors),
                                   dtype=torch.int8)
            kv_caches = {}
            for t in kcc.kv_cache_tensors:
                for layer, name in enumerate(t.layers):
                    region = self.raw[t.offset + layer * t.layer_stride:
                                      t.offset + (layer + 1) * t.layer_stride]
                    if isinstance(self.specs[name], MambaSpec):
                        kv_caches[name] = region.view(kcc.num_blocks, 1, 1, t.block_stride)
                    else:
                        kv_caches[name] = region.view(torch.bfloat16).view(
                            kcc.num_blocks, tiny_model.KV_HEADS, BS, 2 * tiny_model.HEAD_DIM)
            self.wconn.register_kv_caches(kv_caches)
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(hash_bs, sha256)
        self.ctx = ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={})
        self.requests: Dict[str, Request] = {}

    # -- the statepool objects --------------------------------------------------------------

    @property
    def manager(self):
        return self.sched.connector.connector_scheduler.manager

    @property
    def worker(self):
        return self.wconn.connector_worker.worker

    @property
    def jobs(self) -> List[tuple]:
        return self.worker.__dict__.setdefault("test_jobs", [])

    # -- pages ----------------------------------------------------------------------------

    def fill(self, seed: int) -> None:
        """Random bf16 values everywhere: every reading of the bytes is finite (a float32 of
        two bf16 halves has a normal bf16 as its high half)."""
        g = torch.Generator().manual_seed(seed)
        self.raw.view(torch.bfloat16).copy_(
            torch.randn(self.raw.numel() // 2, generator=g).to(torch.bfloat16))

    def page(self, group_id: int, layer: int, block: int) -> torch.Tensor:
        """The unpadded page of a layer of a group at a block, from vLLM's KVCacheTensors."""
        name = self.kcc.kv_cache_groups[group_id].layer_names[layer]
        t = next(t for t in self.kcc.kv_cache_tensors if name in t.layers)
        spec = self.specs[name]
        size = (spec.state_content_size_bytes if isinstance(spec, MambaSpec)
                else spec.real_page_size_bytes)
        at = t.offset + t.layers.index(name) * t.layer_stride + block * t.block_stride
        return self.raw[at:at + size]

    # -- driving it -------------------------------------------------------------------------

    def add(self, request_id: str, ids: List[int], max_tokens: int = 4) -> Request:
        sp = SamplingParams(max_tokens=max_tokens)
        sp.update_from_generation_config({}, 2)
        req = Request(request_id=request_id, prompt_token_ids=ids, sampling_params=sp,
                      pooling_params=None, block_hasher=self.hasher)
        self.sched.add_request(req)
        self.requests[request_id] = req
        return req

    def step(self, before_worker: Optional[Callable[[object], None]] = None):
        """One engine step: schedule, the worker's part of the forward pass, the outputs."""
        so = self.sched.schedule()
        meta = so.kv_connector_metadata
        if before_worker is not None:
            before_worker(so)
        w = self.wconn
        w.handle_preemptions(meta)
        w.bind_connector_metadata(meta)
        w.start_load_kv(self.ctx)
        if so.total_num_scheduled_tokens > 0:
            w.wait_for_save()
        results = w.get_transfer_results(so.finished_req_ids)
        wmeta = w.build_connector_worker_meta()
        w.clear_connector_metadata()
        reqs = list(self.sched.running)
        out = ModelRunnerOutput(
            req_ids=[r.request_id for r in reqs],
            req_id_to_index={r.request_id: i for i, r in enumerate(reqs)},
            sampled_token_ids=[[7] if so.num_scheduled_tokens.get(r.request_id) else []
                               for r in reqs],
            logprobs=None, prompt_logprobs_dict={}, pooler_output=None,
            kv_connector_output=KVConnectorOutput(
                finished_sending=results.finished_sending,
                finished_recving=results.finished_recving,
                failed_recving=results.failed_recving, kv_connector_worker_meta=wmeta))
        self.sched.update_from_output(so, out)
        return so

    def idle(self) -> bool:
        return not self.sched.requests and not self.sched.connector.has_pending_push_work()

    def run(self, max_steps: int = 200, before_worker=None, timeout: float = 60) -> int:
        """Steps until every request is done and every transfer reported; returns the steps."""
        deadline = time.monotonic() + timeout
        for n in range(max_steps):
            so = self.step(before_worker)
            if self.idle():
                return n + 1
            if so.total_num_scheduled_tokens == 0:
                time.sleep(0.002)  # waiting for the transfer thread
            assert time.monotonic() < deadline, "the harness did not finish in time"
        raise AssertionError("the harness did not finish in its steps")

    def close(self) -> None:
        self.wconn.shutdown()
        self.sched.connector.shutdown()


@pytest.fixture
def harnesses(model_dir):
    """Makes harnesses (each like a fresh engine) and shuts them down after the test."""
    made: List[Harness] = []

    def make(extra: dict, connector: str = "StatepoolConnector") -> Harness:
        h = Harness(model_dir, extra, connector)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


@pytest.fixture
def spec_log(caplog):
    """The records of statepool.vllm (which, once a spec exists, logs through vLLM's
    handlers and does not propagate): propagating to caplog's root handler for the test."""
    logger = logging.getLogger("statepool.vllm")
    caplog.set_level(logging.INFO, logger="statepool.vllm")  # a level: the spec leaves it be
    saved, logger.propagate = logger.propagate, True
    yield caplog
    logger.propagate = saved


def connect(d: "Daemon") -> statepool.Connection:
    return statepool.connect(d.socket, tenant=TENANT)
