"""The settings of statepool's SGLang backend (private to statepool.sglang, re-exported there).

Below every other ``_sglang_*`` module: they take a ``Settings``, none imports the backend.
The parsing and the checks shared with statepool.vllm are ``_daemon_link.settings_from_extra``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import statepool

from ._daemon_link import settings_from_extra


@dataclass
class Settings:
    """The backend's settings, from SGLang's ``storage_config.extra_config``.

    Keys (all optional): ``socket`` (the daemon's Unix socket), ``tenant`` ('' = the
    daemon's default), ``state_codec`` (a statepool codec name: ``fp32`` and ``bf16`` are
    lossless for states of that dtype; ``stepquant6``, ``stepquant4``, ``int8``, ...),
    ``state_plan`` (a STEPQuant plan file from ``statepool-quant calibrate``; without it a
    stepquant codec uses the nominal plan), ``kv_codec`` (``bf16``, ``fp8``, ``kivi2``,
    ``kivi4``, ``flexgen4``), ``state_arena_pages`` (pages of the state arena; 0 = the
    daemon's ``--arena-pages``), ``kv_arena_mib`` (size of the arena that holds the KV
    entries: the tenant's arena of the KV geometry, shared by every engine of the tenant), ``namespace`` (separates deployments that share a daemon or a Redis;
    default: the model name), ``timeout`` (seconds per daemon call), ``retry_interval``
    (seconds between reconnection attempts), ``zero_copy`` (false: copy through a staging
    buffer even where the daemon could use SGLang's host pools in place) and ``staging_mib``
    (the largest staging buffer one connection of the one-copy path grows to; a batch that
    needs more is sent in parts). SGLang's own keys (``allocator``, ``interface_v1``,
    ``prefetch_threshold``, ...) are SGLang's and ignored here.
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
    retry_interval: float = 1.0
    zero_copy: bool = True
    staging_mib: int = 256

    @classmethod
    def from_extra_config(cls, extra: Optional[dict]) -> "Settings":
        return settings_from_extra(cls, extra)
