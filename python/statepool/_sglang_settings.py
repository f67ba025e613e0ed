"""The settings of statepool's SGLang backend (private to statepool.sglang, re-exported there).

Below every other ``_sglang_*`` module: they take a ``Settings``, none imports the backend.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional

import statepool


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        if value.strip().lower() in ("1", "true", "yes", "on"):
            return True
        if value.strip().lower() in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(f"not a boolean: {value!r}")
    return bool(value)


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
        extra = dict(extra or {})
        s = cls()
        for f in fields(cls):
            value = extra.get(f.name)
            if value is None:
                continue
            default = getattr(s, f.name)
            setattr(s, f.name, _as_bool(value) if isinstance(default, bool)
                    else type(default)(value))
        if s.state_codec not in statepool.CodecId.__members__:
            raise ValueError(
                f"statepool: unknown state_codec {s.state_codec!r}; one of "
                f"{sorted(statepool.CodecId.__members__)}")
        if s.kv_codec not in statepool.KvCodec.__members__:
            raise ValueError(
                f"statepool: unknown kv_codec {s.kv_codec!r}; one of "
                f"{sorted(statepool.KvCodec.__members__)}")
        if s.kv_arena_mib <= 0 or s.state_arena_pages < 0 or s.staging_mib <= 0:
            raise ValueError("statepool: kv_arena_mib and staging_mib must be > 0, "
                             "state_arena_pages >= 0")
        return s
