"""statepool as an SGLang HiCache storage backend (L3) for hybrid models: state and KV.

SGLang (0.5.23) loads it by module path, with no change to the engine::

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "statepool",
            "module_path": "statepool.sglang", "class_name": "StatepoolHiCacheStorage",
            "interface_v1": 1, "socket": "/run/statepool/statepool.sock",
            "state_codec": "stepquant6", "kv_codec": "bf16"}'

What it stores (docs/sglang.md has the whole story):

- a **KV page** (``page_size`` tokens of every attention layer, from SGLang's host KV pool)
  becomes a hybrid prefix snapshot of statepool: its keys and values are the snapshot's KV
  blocks, encoded with the KV codec; the snapshot's state is a small fixed header (format
  version and a digest of the model's KV geometry) in an arena of a tiny layout;
- a **MAMBA page** (one request's recurrent state at a page boundary, from SGLang's
  ``MambaPoolHost``: the gated-delta-rule state of every linear layer and its conv state)
  becomes a prefix snapshot of the model's state layout, compressed with the state codec;
  a header-only marker beside it in the small arena answers existence queries without
  copying the state.

Keys are SGLang's page keys (its chained page hashes) under a namespace that separates
models, tensor-parallel ranks and pipeline stages; every snapshot is bound by the daemon to
its layout (shape, codec, plan), so a lookup never returns another model's bytes.

Failure behaviour: every call catches everything. A dead or restarting daemon, a full
pool, a refused codec or layout make the call return ``False`` / zero hits; the first
failure of a kind is logged as a warning, the next ones are not, and the recovery is
logged once. After a lost connection the backend reconnects on a later call (at most once
per ``retry_interval`` seconds) and sets its arenas up again.

Where the code is: this module has the settings and the backend's SGLang interface (with the
namespace of its keys and the per-connection set-up of each pool); the private modules beside
it hold the host pools as statepool sees them (``_sglang_pools``), the arenas and the header
format of their snapshots (``_sglang_arenas``), the connection and its failure handling
(``_sglang_connection``) and the page copies (``_sglang_pages``).
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

import statepool

from ._sglang_arenas import _SmallArena, _StateArena
from ._sglang_connection import _Connection, _Down, _Session
from ._sglang_pages import _PageCopies
from ._sglang_pools import _KvGeometry, _MambaGeometry, _Unsupported

__all__ = ["StatepoolHiCacheStorage", "Settings"]

# The format version in the header of every small-arena snapshot (_sglang_arenas has the rest).
_FORMAT = 1       # bump when what a snapshot of this backend means changes


@dataclass
class Settings:
    """The backend's settings, from SGLang's ``storage_config.extra_config``.

    Keys (all optional): ``socket`` (the daemon's Unix socket), ``tenant`` ('' = the
    daemon's default), ``state_codec`` (a statepool codec name: ``fp32`` and ``bf16`` are
    lossless for states of that dtype; ``stepquant6``, ``stepquant4``, ``int8``, ...),
    ``state_plan`` (a STEPQuant plan file from ``statepool-quant calibrate``; without it a
    stepquant codec uses the nominal plan), ``kv_codec`` (``bf16``, ``fp8``, ``kivi2``,
    ``kivi4``, ``flexgen4``), ``state_arena_pages`` (pages of the state arena; 0 = the
    daemon's ``--arena-pages``), ``kv_arena_mib`` (size of the small arena that holds the
    KV entries), ``namespace`` (separates deployments that share a daemon or a Redis;
    default: the model name), ``timeout`` (seconds per daemon call) and
    ``retry_interval`` (seconds between reconnection attempts).
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

    @classmethod
    def from_extra_config(cls, extra: Optional[dict]) -> "Settings":
        extra = dict(extra or {})
        s = cls()
        for name in cls.__dataclass_fields__:
            if name in extra and extra[name] is not None:
                default = getattr(s, name)
                setattr(s, name, type(default)(extra[name]))
        if s.state_codec not in statepool.CodecId.__members__:
            raise ValueError(
                f"statepool: unknown state_codec {s.state_codec!r}; one of "
                f"{sorted(statepool.CodecId.__members__)}")
        if s.kv_codec not in statepool.KvCodec.__members__:
            raise ValueError(
                f"statepool: unknown kv_codec {s.kv_codec!r}; one of "
                f"{sorted(statepool.KvCodec.__members__)}")
        if s.kv_arena_mib <= 0 or s.state_arena_pages < 0:
            raise ValueError("statepool: kv_arena_mib must be > 0 and state_arena_pages >= 0")
        return s



class StatepoolHiCacheStorage(_PageCopies, _Connection, HiCacheStorage):
    """SGLang HiCache storage backed by statepool prefix snapshots (module docstring)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        self.storage_config = storage_config
        self.settings = Settings.from_extra_config(
            storage_config.extra_config if storage_config is not None else None)
        sc = storage_config
        ns = self.settings.namespace or (sc.model_name if sc is not None else "") or ""
        if sc is not None:
            ns += (f"|tp{sc.tp_rank}/{sc.tp_size}|pp{sc.pp_rank}/{sc.pp_size}"
                   f"|cp{sc.attn_cp_rank}/{sc.attn_cp_size}|dp{sc.dp_rank}")
        self._ns = hashlib.sha256(ns.encode()).hexdigest()[:16]
        self.mem_pool_host = None
        self.registered_pools: Dict[Any, Any] = {}
        self._lock = threading.RLock()
        self._session: Optional[_Session] = None
        self._next_connect = 0.0
        self._connects = 0
        self._reported: Dict[str, str] = {}
        self._kv_geo: Optional[_KvGeometry] = None
        self._mamba_geo: Optional[_MambaGeometry] = None
        self.counters = {"kv_puts": 0, "kv_hits": 0, "kv_misses": 0, "state_puts": 0,
                         "state_hits": 0, "state_misses": 0, "failures": 0, "reconnects": 0}

    # -- registration ---------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host) -> None:
        with self._lock:
            self.mem_pool_host = mem_pool_host
            self._kv_geo = None
            self._drop_resources()

    def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
        with self._lock:
            self.registered_pools[host_pool_name] = host_pool
            if host_pool_name == PoolName.MAMBA:
                self._mamba_geo = None
                self._drop_resources()

    def _drop_resources(self) -> None:
        if self._session is not None:
            self._session.small = None
            self._session.state = None

    # -- each pool's resources on the session (set up on first use) -----------------------

    def _kv(self) -> Tuple[_Session, _KvGeometry, _SmallArena]:
        s = self._connected()
        if s is None:
            raise _Down()
        if self._kv_geo is None:
            if self.mem_pool_host is None:
                raise _Unsupported("no host KV pool registered")
            self._kv_geo = _KvGeometry(self.mem_pool_host,
                                       statepool.KvCodec.__members__[self.settings.kv_codec])
        if s.small is None:
            s.small = _SmallArena(s.conn, self._kv_geo, self.settings, _FORMAT)
        if s.small.kv_stage is None:
            raise _Unsupported("the small arena was set up without KV pages")
        return s, self._kv_geo, s.small

    def _mamba(self) -> Tuple[_Session, _MambaGeometry, _StateArena, _SmallArena]:
        try:
            s, _, small = self._kv()
        except _Unsupported:  # no (storable) KV pool: the markers still need the small arena
            s, _, small = self._small_only()
        if self._mamba_geo is None:
            pool = self.registered_pools.get(PoolName.MAMBA)
            if pool is None:
                raise _Unsupported("no MAMBA host pool registered")
            self._mamba_geo = _MambaGeometry(pool, self.settings)
        if s.state is None:
            s.state = _StateArena(s.conn, self._mamba_geo, self.settings)
            small.set_marker(s.conn, self._mamba_geo.name, _FORMAT)
        return s, self._mamba_geo, s.state, small

    def _small_only(self) -> Tuple[_Session, None, _SmallArena]:
        s = self._connected()
        if s is None:
            raise _Down()
        if s.small is None:
            s.small = _SmallArena(s.conn, None, self.settings, _FORMAT)
        return s, None, s.small

    # -- keys -----------------------------------------------------------------------------

    def _prefix(self, kind: str, key: str) -> bytes:
        p = f"sgl/{self._ns}/{kind}/{key}".encode()
        if len(p) > 256:
            digest = hashlib.sha256(key.encode()).hexdigest()
            p = f"sgl/{self._ns}/{kind}/#{digest}".encode()
        return p

    # -- SGLang's interface: v2 (hybrid pools) --------------------------------------------

    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[PoolTransfer]] = None,
                        extra_info: Optional[HiCacheStorageExtraInfo] = None) -> PoolTransferResult:
        try:
            kv_pages = self._kv_exists_run(keys)
            hits: Dict[Any, int] = {PoolName.KV: kv_pages} if kv_pages else {}
            restorable = list(range(1, kv_pages + 1))
            for transfer in pool_transfers or []:
                if not restorable:
                    break
                present = self._pool_presence(transfer.name, keys[:kv_pages])
                if transfer.hit_policy == PoolHitPolicy.ALL_PAGES:
                    boundary = present.index(False) if False in present else kv_pages
                    allowed = set(range(1, boundary + 1))
                elif transfer.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                    trailing = max(1, len(transfer.keys) if transfer.keys else 1)
                    allowed = {p for p in range(1, kv_pages + 1)
                               if all(present[max(0, p - trailing):p])}
                    boundary = max(allowed, default=0)
                else:
                    with self._lock:
                        self._report("unsupported", f"hit policy {transfer.hit_policy} of "
                                     f"pool {transfer.name}: no hits")
                    allowed, boundary = set(), 0
                if boundary:
                    hits[transfer.name] = boundary
                restorable = [p for p in restorable if p in allowed]
            return PoolTransferResult(restorable[-1] if restorable else 0, hits, restorable)
        except Exception as e:  # noqa: BLE001
            with self._lock:
                self._fail("batch_exists_v2", e)
            return PoolTransferResult(0, {}, [])

    def batch_get_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> Dict[Any, List[bool]]:
        try:
            return self._transfers(transfers, write=False)
        except Exception as e:  # noqa: BLE001
            with self._lock:
                self._fail("batch_get_v2", e)
            return {t.name: [False] * len(t.keys or []) for t in transfers}

    def batch_set_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> Dict[Any, List[bool]]:
        try:
            return self._transfers(transfers, write=True)
        except Exception as e:  # noqa: BLE001
            with self._lock:
                self._fail("batch_set_v2", e)
            return {t.name: [False] * len(t.keys or []) for t in transfers}

    # -- SGLang's interface: v1 (zero-copy KV pages) --------------------------------------

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        return self._kv_batch(keys, host_indices, False, "batch_get_v1")

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        return self._kv_batch(keys, host_indices, True, "batch_set_v1")

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        return self._kv_exists_run(keys)

    # -- SGLang's interface: the generic page path (flat data pages of the host KV pool) ---

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> Optional[torch.Tensor]:
        if target_location is None:
            return None
        return target_location if self._flat_op(key, target_location, False) else None

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[Optional[torch.Tensor]]:
        targets = target_locations or [None] * len(keys)
        return [self.get(key, t) for key, t in zip(keys, targets)]

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self._flat_op(key, value, True)

    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        return all(self.set(key, value) for key, value in zip(keys, values or []))

    def exists(self, key: str) -> bool:
        return self._kv_exists_run([key]) == 1

    # -- housekeeping ---------------------------------------------------------------------

    def clear(self) -> bool:
        """Deletes this namespace's snapshots that the daemon's pool lists (and, through
        DeleteSnapshot, their copies in the host tier and Redis)."""
        with self._lock:
            try:
                s = self._connected()
                if s is None:
                    return False
                prefix = f"sgl/{self._ns}/".encode()
                while True:
                    listed = s.conn.list_snapshots(prefix, 1000)
                    keys = {(e.prefix, e.position) for e in listed.snapshots}
                    for p, pos in keys:
                        s.conn.delete_snapshot(p, pos)
                    if not listed.truncated or not keys:
                        return True
            except Exception as e:  # noqa: BLE001
                self._fail("clear", e)
                return False

    def get_stats(self):
        return None

    def stats(self) -> Dict[str, int]:
        """This backend's counters (puts, hits, misses, failures, reconnects)."""
        with self._lock:
            return dict(self.counters)

    def close(self) -> None:
        with self._lock:
            if self._session is not None:
                self._session.close()
                self._session = None

