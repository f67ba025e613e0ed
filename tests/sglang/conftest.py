"""Fixtures of the SGLang storage-backend tests: real statepoold processes (the Daemon helper of
tests/python/conftest.py and the fixtures of tests/engine_fixtures.py, shared with tests/vllm),
real SGLang host pools on the CPU, and backends built through SGLang's own
StorageBackendFactory. Runs in the venv of scripts/sglang-venv (tests/sglang/run-pytest)."""

from __future__ import annotations

import hashlib
import importlib.util
import pathlib
import sys

import pytest
import torch

# tests/engine_fixtures.py (the statepoold fixtures shared with tests/vllm) under its own name.
_spec = importlib.util.spec_from_file_location(
    "statepool_engine_fixtures", pathlib.Path(__file__).resolve().parents[1] / "engine_fixtures.py")
sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sys.modules[_spec.name])
from statepool_engine_fixtures import (  # noqa: E402,F401 - for the tests, and fixtures
    Daemon,
    daemon,
    free_port,
    kill_daemon,
    redis_server,
    serve,
    start_daemon,
    stop_daemon_process,
)

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

PAGE = 4  # tokens per KV page of kv_pool()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: a real SGLang engine end to end (tests/sglang/engine; ctest "
        "sglang.engine); `-m 'not slow'` leaves it out")


# -- SGLang host pools on the CPU -------------------------------------------------------------


def kv_pool(layers=3, heads=2, head_dim=16, page_size=4, pages=32, dtype=torch.bfloat16,
            layout="page_first", allocator="default") -> MHATokenToKVPoolHost:
    """SGLang's MHA host KV pool (pin_memory off, CPU), over small stand-in device buffers.
    ``allocator="shm"``: in a memfd, as SGLang allocates it with ``"allocator": "shm"`` in the
    storage extra config (the backend's zero-copy path)."""
    dev_tokens = page_size * 4
    k = tuple(torch.zeros(dev_tokens, heads, head_dim, dtype=dtype) for _ in range(layers))
    v = tuple(torch.zeros(dev_tokens, heads, head_dim, dtype=dtype) for _ in range(layers))

    def ptrs(ts):
        return torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)

    info = MHABufferInfo(
        buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v),
                          layout=KVBufferLayout.NHD),
        page_size=page_size, head_num=heads, head_dim=head_dim, v_head_dim=head_dim,
        dtype=dtype, device=torch.device("cpu"))
    return MHATokenToKVPoolHost(info, 2.0, 0, page_size, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=dev_tokens, start_layer=0,
                                end_layer=layers - 1, host_token_capacity=pages * page_size,
                                allocator_type=allocator)


def mamba_pool(layers=2, heads=3, value_dim=8, key_dim=16, conv_channels=24, conv_width=3,
               slots=16, temporal_dtype=torch.float32, conv_dtype=torch.bfloat16,
               allocator="default", convs=1) -> MambaPoolHost:
    """SGLang's MambaPoolHost (CPU, pin_memory off) for a gated-delta-rule model: per slot an
    fp32 recurrent state [layers, heads, value, key] and ``convs`` conv states [layers, channels,
    width] (SGLang's hybrids have one; ZAYA1 and Inkling several). ``allocator="shm"`` as in
    kv_pool()."""
    temporal = torch.zeros(layers, 4, heads, value_dim, key_dim, dtype=temporal_dtype)
    conv = tuple(torch.zeros(layers, 4, conv_channels, conv_width, dtype=conv_dtype)
                 for _ in range(convs))
    info = MambaStateBufferInfo(temporal=temporal, conv=conv)
    return MambaPoolHost(info, slots / 4, 0, device_capacity=4, pin_memory=False, device="cpu",
                         layout="page_first", allocator_type=allocator)


def storage_config(extra: dict | None, model: str = "pytest/tiny-hybrid",
                   tp_rank: int = 0) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(tp_rank=tp_rank, tp_size=1, pp_rank=0, pp_size=1,
                                attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
                                enable_storage_metrics=False, is_page_first_layout=True,
                                model_name=model, extra_config=extra)


def statepool_extra(d: "Daemon", **overrides) -> dict:
    extra = {"backend_name": "statepool", "module_path": "statepool.sglang",
             "class_name": "StatepoolHiCacheStorage", "interface_v1": 1,
             "socket": d.socket, "tenant": "team-a", "state_codec": "fp32", "kv_codec": "bf16",
             "state_arena_pages": 64, "kv_arena_mib": 8, "retry_interval": 0.2, "timeout": 5}
    extra.update(overrides)
    return extra


def make_backend(name: str, extra: dict, kv, mamba, model: str = "pytest/tiny-hybrid"):
    """A backend as SGLang's cache controllers make one: through the factory, then the anchor
    host pool, then every pool of the host pool group."""
    backend = StorageBackendFactory.create_backend(name, storage_config(extra, model), kv)
    backend.register_mem_pool_host(kv)
    backend.register_mem_host_pool_v2(kv, PoolName.KV)
    if mamba is not None:
        backend.register_mem_host_pool_v2(mamba, PoolName.MAMBA)
    backend.on_host_pools_registered()
    return backend


def token_indices(pages: list[int], page: int = PAGE) -> torch.Tensor:
    """SGLang's host indices of whole pages: one per token."""
    return torch.cat([torch.arange(p * page, (p + 1) * page) for p in pages]).to(torch.int64)


def mamba_transfer(keys: list[str], slots: list[int] | None = None) -> PoolTransfer:
    """A MAMBA pool transfer as SGLang's hybrid controller makes one (slots None: the hit
    query's)."""
    indices = None if slots is None else torch.tensor(slots, dtype=torch.int64)
    return PoolTransfer(name=PoolName.MAMBA, keys=keys, host_indices=indices,
                        hit_policy=PoolHitPolicy.TRAILING_PAGES)


def normalized(result):
    return (result.kv_hit_pages, {str(k): v for k, v in result.extra_pool_hit_pages.items()},
            result.restorable_prefix_pages)


def fill(kv, mamba, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    kv.kv_buffer.copy_(torch.randn(kv.kv_buffer.shape, generator=g).to(kv.kv_buffer.dtype))
    if mamba is not None:
        mamba.temporal_buffer.copy_(torch.randn(mamba.temporal_buffer.shape, generator=g))
        for conv in mamba.conv_buffer:
            conv.copy_(torch.randn(conv.shape, generator=g).to(conv.dtype))


def page_keys(chain: str, n: int) -> list[str]:
    keys, prev = [], chain.encode()
    for i in range(n):
        prev = hashlib.sha256(prev + i.to_bytes(4, "little")).digest()
        keys.append(prev.hex())
    return keys
