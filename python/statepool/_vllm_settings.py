"""The settings of statepool's vLLM offloading spec (private to statepool.vllm, re-exported
there).

Below every other ``_vllm_*`` module: they take a ``Settings``; none imports the spec. The
parsing and the checks shared with statepool.sglang are ``_daemon_link.settings_from_extra``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

import statepool

from ._daemon_link import settings_from_extra

# kv_connector_extra_config keys that vLLM itself reads (the spec leaves them to vLLM):
# the factory's, the offloading config's, OffloadingSpec's and those of vLLM's CPU spec.
VLLM_KEYS = ("spec_name", "spec_module_path", "block_size", "blocks_per_chunk",
             "canonical_layout", "offload_prompt_only", "self_describing_kv_events",
             "sync_load_budget_bytes", "cpu_bytes_to_use", "eviction_policy",
             "cache_policy_module_path", "store_threshold", "max_tracker_size")


@dataclass
class Settings:
    """The spec's settings, from vLLM's ``kv_connector_extra_config`` (docs/vllm.md has the
    table).

    Keys (all optional): ``socket`` (the daemon's Unix socket), ``tenant`` ('' = the daemon's
    default), ``state_codec`` (a statepool codec name for the Mamba groups' states: ``fp32``
    is exact for fp32 and bf16 states, ``bf16`` for bf16 ones; ``stepquant6``, ``stepquant4``,
    ``int8``, ...), ``state_plan`` (a STEPQuant plan file of the whole model, from
    ``statepool-quant calibrate``; without it a stepquant codec uses the nominal plan),
    ``kv_codec`` (``bf16``, ``fp8``, ``kivi2``, ``kivi4``, ``flexgen4``), ``state_arena_pages``
    (pages of the state arena; 0 = the daemon's ``--arena-pages``), ``kv_arena_mib`` (size of
    the arena of the attention blocks, shared by every engine of the tenant), ``namespace``
    (separates deployments that share a daemon or a Redis; default: the model name),
    ``timeout`` (seconds per daemon request of the worker), ``lookup_timeout`` (seconds per
    lookup of the scheduler, which waits for it), ``retry_interval`` (seconds between
    reconnection attempts; a scheduler that keeps failing waits up to 30 times longer) and
    ``staging_mib`` (the largest staging buffer a worker grows to; a job that needs more is
    sent in parts). vLLM's own keys (``VLLM_KEYS``) are vLLM's.
    """

    socket: str = statepool.DEFAULT_SOCKET_PATH
    tenant: str = ""
    state_codec: str = "fp32"
    state_plan: str = ""
    kv_codec: str = "bf16"
    state_arena_pages: int = 0
    kv_arena_mib: int = 256
    namespace: str = ""
    timeout: float = 5.0
    lookup_timeout: float = 0.5
    retry_interval: float = 1.0
    staging_mib: int = 256

    @classmethod
    def from_extra_config(cls, extra: Optional[Mapping[str, Any]]) -> "Settings":
        s = settings_from_extra(cls, extra)
        if s.timeout <= 0 or s.lookup_timeout <= 0 or s.retry_interval < 0:
            raise ValueError("statepool: timeout and lookup_timeout must be > 0, "
                             "retry_interval >= 0")
        return s

    @property
    def stepquant_bits(self) -> int:
        """6 or 4 for a STEPQuant state codec, else 0."""
        return {"stepquant6": 6, "stepquant4": 4}.get(self.state_codec, 0)
