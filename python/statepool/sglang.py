"""statepool as an SGLang HiCache storage backend (L3) for hybrid models: state and KV.

SGLang (0.5.23) loads it by module path, with no change to the engine::

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "statepool",
            "module_path": "statepool.sglang", "class_name": "StatepoolHiCacheStorage",
            "interface_v1": 1, "allocator": "shm", "socket": "/run/statepool/statepool.sock",
            "state_codec": "stepquant6", "kv_codec": "bf16"}'

What it stores (docs/sglang.md has the whole story):

- a **KV page** (``page_size`` tokens of every attention layer, from SGLang's host KV pool)
  becomes a hybrid prefix snapshot of statepool: its keys and values are the snapshot's KV
  blocks, encoded with the KV codec; the snapshot's state is a small constant header (format
  version and a digest of the model's KV geometry) in an arena of a tiny layout;
- a **MAMBA page** (one request's recurrent state at a page boundary, from SGLang's
  ``MambaPoolHost``: the gated-delta-rule state of every linear layer and its conv state)
  becomes a prefix snapshot of the model's state layout, compressed with the state codec.

Keys are SGLang's page keys (its chained page hashes) under ``sgl<format>/`` and a namespace
that separates models, tensor-parallel ranks and pipeline stages; every snapshot is bound by
the daemon to its layout (shape, codec, plan), so a lookup never returns another model's bytes.

How: each SGLang batch call is one daemon round trip (or a few, where the daemon's caps split
it): existence through ``lookup_snapshots``, gets and sets through ``get_snapshots`` /
``put_snapshots`` with one entry per page. With SGLang's ``"allocator": "shm"`` the host pools
are memory files that the daemon maps: it decodes straight into them and encodes straight from
them (zero copy in this process); otherwise pages go through a staging buffer (one copy). Every
thread SGLang calls from has its own connection; no lock is held across a round trip.

Failure behaviour: every call catches everything. A dead or restarting daemon, a full pool, a
refused codec or layout make the call return ``False`` / zero hits; the first failure of a
kind is logged as a warning, the next ones are not, and the recovery is logged once. After a
lost connection a thread reconnects on a later call (at most once per ``retry_interval``
seconds) and sets its arenas up again. A pool this backend cannot store is refused when SGLang
registers it, with the reason in the log; its pages then miss.

Where the code is: this module has the backend's SGLang interface and the keys; the private
modules beside it hold the settings (``_sglang_settings``), the host pools as statepool sees
them (``_sglang_pools``, with ``_sglang_shm`` finding their memory files), what a connection
sets up in the daemon (``_sglang_arenas``), the per-thread connections and failure handling
(``_sglang_connection``, over ``_daemon_link``, which statepool.vllm shares), the batched page
moves (``_sglang_pages``) and the counters and SGLang's storage metrics (``_sglang_metrics``).
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any, Callable, Dict, List, Optional, TypeVar

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

from ._daemon_link import Down, Reporter
from ._sglang_connection import _Sessions
from ._sglang_metrics import COUNTERS, _Metrics
from ._sglang_pages import _Pages
from ._sglang_pools import _KvGeometry, _MambaGeometry, _Unsupported
from ._sglang_settings import Settings

__all__ = ["StatepoolHiCacheStorage", "Settings", "COUNTERS", "KEY_PREFIX"]

logger = logging.getLogger("statepool.sglang")

# The format of what this backend stores, in every key (``sgl<format>/``): bump it when what a
# snapshot of this backend means changes, and entries of another format are never read.
_FORMAT = 2
# What every key of this format starts with: ``statepoolctl snapshots --tenant T sgl2/``.
KEY_PREFIX = f"sgl{_FORMAT}/"

_T = TypeVar("_T")


class _NotStored(Exception):
    """The call's pool is not stored (said in the log when it was registered)."""


class StatepoolHiCacheStorage(HiCacheStorage):
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
        self._head = f"sgl{_FORMAT}/{self._ns}/"
        self.mem_pool_host = None
        self.registered_pools: Dict[Any, Any] = {}
        self._kv_geo: Optional[_KvGeometry] = None
        self._kv_pool: Any = None
        self._kv_refused = "no host KV pool registered"
        self._mamba_geo: Optional[_MambaGeometry] = None
        self._mamba_pool: Any = None
        self._mamba_refused = "no MAMBA host pool registered"
        self._metrics = _Metrics()
        self._reporter = Reporter(logger, "statepool HiCache storage",
                                  lambda: self._metrics.add(failures=1))
        self._sessions = _Sessions(self.settings, self._reporter,
                                   lambda: self._metrics.add(reconnects=1))
        self._pages = _Pages(self._sessions, self._metrics, self._reporter, self.settings,
                             _FORMAT)

    # -- registration: each pool's geometry and path, decided (and logged) once -------------

    def register_mem_pool_host(self, mem_pool_host) -> None:
        self.mem_pool_host = mem_pool_host
        self._set_kv_pool(mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
        self.registered_pools[host_pool_name] = host_pool
        if host_pool_name == PoolName.KV:
            self._set_kv_pool(host_pool)
        elif host_pool_name == PoolName.MAMBA:
            self._set_mamba_pool(host_pool)
        else:
            logger.warning("statepool HiCache storage: host pool %s is not stored (KV and MAMBA "
                           "are); its pages miss", getattr(host_pool_name, "value",
                                                           host_pool_name))

    def on_host_pools_registered(self) -> None:
        """SGLang's hook after the pools are registered: nothing left to do (each thread's
        connection lends the pools' memory to the daemon at its first call)."""

    def _set_kv_pool(self, pool) -> None:
        if pool is self._kv_pool:
            return
        self._kv_pool = pool
        codec = statepool.KvCodec.__members__[self.settings.kv_codec]
        try:
            geo = _KvGeometry(pool, codec, self.settings)
        except Exception as e:  # noqa: BLE001 - a pool this backend cannot store
            self._kv_geo, self._kv_refused = None, f"{e}"
            logger.warning("statepool HiCache storage: the host KV pool is not stored: %s; "
                           "its pages miss", e)
        else:
            self._kv_geo = geo
            logger.info("statepool HiCache storage: host KV pool (%s, %d layers x %d heads x %d, "
                        "page %d, %s, kv_codec %s): %s", geo.layout, geo.layers, geo.heads,
                        geo.head_dim, geo.page_size, geo.torch_dtype, self.settings.kv_codec,
                        geo.path)
        self._sessions.invalidate()

    def _set_mamba_pool(self, pool) -> None:
        if pool is self._mamba_pool:
            return
        self._mamba_pool = pool
        try:
            geo = _MambaGeometry(pool, self.settings)
        except Exception as e:  # noqa: BLE001 - a pool this backend cannot store
            self._mamba_geo, self._mamba_refused = None, f"{e}"
            logger.warning("statepool HiCache storage: the host MAMBA pool is not stored: %s; "
                           "its pages miss", e)
        else:
            self._mamba_geo = geo
            logger.info("statepool HiCache storage: host MAMBA pool (%d layers x %d heads x "
                        "%dx%d %s, conv %dx%d %s, state_codec %s): %s", geo.layers, geo.heads,
                        geo.rows, geo.cols, geo.torch_dtype, geo.conv_channels, geo.conv_width,
                        geo.conv_torch_dtype, self.settings.state_codec, geo.path)
        self._sessions.invalidate()

    def _kv(self) -> _KvGeometry:
        geo = self._kv_geo
        if geo is None:
            raise _NotStored()
        return geo

    def _mamba(self) -> _MambaGeometry:
        geo = self._mamba_geo
        if geo is None:
            raise _NotStored()
        return geo

    # -- keys -----------------------------------------------------------------------------

    def _prefixes(self, kind: str, keys: List[str]) -> List[str]:
        head = self._head + kind + "/"
        limit = 256 - len(head)
        return [head + k if len(k) <= limit and k.isascii()
                else head + "#" + hashlib.sha256(k.encode()).hexdigest() for k in keys]

    def _prefix(self, kind: str, key: str) -> str:
        return self._prefixes(kind, [key])[0]

    def _starts(self, keys: List[str], host_indices: Optional[torch.Tensor], page: int,
                limit: int) -> List[int]:
        """The first host index of each key's page, checked against the pool."""
        if host_indices is None or host_indices.numel() != len(keys) * page:
            count = 0 if host_indices is None else host_indices.numel()
            raise _Unsupported(f"{len(keys)} keys but {count} host indices for pages of {page}")
        starts = host_indices.reshape(-1)[::page].tolist()
        if any(i % page for i in starts) or min(starts) < 0 or max(starts) + page > limit:
            raise _Unsupported(f"host indices that are not pages of the pool ({limit} entries)")
        return starts

    # -- the guard of every call: never an exception into SGLang --------------------------

    def _guard(self, what: str, call: Callable[[], _T], default: _T) -> _T:
        try:
            return call()
        except (Down, _NotStored):
            return default
        except Exception as e:  # noqa: BLE001 - never into the engine
            self._sessions.fail(what, e)
            return default

    # -- SGLang's interface: v2 (hybrid pools) --------------------------------------------

    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[PoolTransfer]] = None,
                        extra_info: Optional[HiCacheStorageExtraInfo] = None) -> PoolTransferResult:
        return self._guard("batch_exists_v2", lambda: self._exists_v2(keys, pool_transfers),
                           PoolTransferResult(0, {}, []))

    def _exists_v2(self, keys: List[str],
                   pool_transfers: Optional[List[PoolTransfer]]) -> PoolTransferResult:
        states: Optional[List[bool]] = None
        if (keys and self._mamba_geo is not None
                and any(t.name == PoolName.MAMBA for t in pool_transfers or [])):
            # The KV run and the states of its pages: one round trip.
            geo = self._kv()
            kv_pages, states = self._pages.kv_leading_and_states(
                geo, self._prefixes(geo.kind, keys), self._mamba_geo,
                self._prefixes("mamba", keys))
        else:
            kv_pages = self._kv_leading(keys)
        hits: Dict[Any, int] = {PoolName.KV: kv_pages} if kv_pages else {}
        # usable[p]: a prefix of p pages can be restored (p = 1..kv_pages)
        usable = [False] + [True] * kv_pages
        for transfer in pool_transfers or []:
            if not any(usable):
                break
            present = (states if transfer.name == PoolName.MAMBA and states is not None
                       else self._presence(transfer.name, keys[:kv_pages]))
            if transfer.hit_policy == PoolHitPolicy.ALL_PAGES:
                boundary = present.index(False) if False in present else kv_pages
                allowed = [0 < p <= boundary for p in range(kv_pages + 1)]
            elif transfer.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                # p is allowed when the last min(window, p) pages up to p are all present
                window = max(1, len(transfer.keys) if transfer.keys else 1)
                allowed, run = [False], 0
                for p in range(1, kv_pages + 1):
                    run = run + 1 if present[p - 1] else 0
                    allowed.append(run >= min(window, p))
                boundary = max((p for p in range(kv_pages + 1) if allowed[p]), default=0)
            else:
                self._reporter.report("unsupported", f"hit policy {transfer.hit_policy} of "
                                      f"pool {transfer.name}: no hits")
                allowed, boundary = [False] * (kv_pages + 1), 0
            if boundary:
                hits[transfer.name] = boundary
            usable = [u and a for u, a in zip(usable, allowed)]
        restorable = [p for p in range(1, kv_pages + 1) if usable[p]]
        return PoolTransferResult(restorable[-1] if restorable else 0, hits, restorable)

    def _presence(self, name: Any, keys: List[str]) -> List[bool]:
        if not keys:
            return []
        if name == PoolName.KV:
            n = self._kv_leading(keys)
            return [i < n for i in range(len(keys))]
        if name == PoolName.MAMBA and self._mamba_geo is not None:
            geo = self._mamba_geo
            return self._guard("exists (state)", lambda: self._pages.states_present(
                geo, self._prefixes("mamba", keys)), [False] * len(keys))
        return [False] * len(keys)

    def batch_get_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> Dict[Any, List[bool]]:
        return self._transfers(transfers, write=False)

    def batch_set_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> Dict[Any, List[bool]]:
        return self._transfers(transfers, write=True)

    def _transfers(self, transfers: List[PoolTransfer], write: bool) -> Dict[Any, List[bool]]:
        what = "batch_set_v2" if write else "batch_get_v2"
        t0 = time.perf_counter()
        results: Dict[Any, List[bool]] = {}
        pages = nbytes = 0
        for transfer in transfers:
            keys = list(transfer.keys or [])
            miss = [False] * len(keys)
            if not keys:
                results[transfer.name] = []
                continue
            if transfer.name == PoolName.KV:
                op = self._kv_set if write else self._kv_get
                results[transfer.name], moved, b = self._guard(
                    what, lambda: op(keys, transfer.host_indices), (miss, 0, 0))
            elif transfer.name == PoolName.MAMBA:
                op = self._state_set if write else self._state_get
                results[transfer.name], moved, b = self._guard(
                    what, lambda: op(keys, transfer.host_indices), (miss, 0, 0))
            else:
                results[transfer.name], moved, b = miss, 0, 0
            pages += moved
            nbytes += b
        self._metrics.sample("backup" if write else "prefetch", pages, nbytes,
                             time.perf_counter() - t0)
        return results

    # -- SGLang's interface: v1 (zero-copy KV pages) --------------------------------------

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        t0 = time.perf_counter()
        out, pages, nbytes = self._guard("batch_get_v1", lambda: self._kv_get(keys, host_indices),
                                         ([False] * len(keys), 0, 0))
        self._metrics.sample("prefetch", pages, nbytes, time.perf_counter() - t0)
        return out

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        t0 = time.perf_counter()
        out, pages, nbytes = self._guard("batch_set_v1", lambda: self._kv_set(keys, host_indices),
                                         ([False] * len(keys), 0, 0))
        self._metrics.sample("backup", pages, nbytes, time.perf_counter() - t0)
        return out

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        return self._guard("batch_exists", lambda: self._kv_leading(keys), 0)

    def exists(self, key: str) -> bool:
        return self._guard("exists", lambda: self._kv_leading([key]), 0) == 1

    # -- the operations behind them (they raise; _guard reports) ---------------------------

    def _kv_leading(self, keys: List[str]) -> int:
        if not keys:
            return 0
        geo = self._kv()
        return self._pages.kv_leading(geo, self._prefixes(geo.kind, keys))

    def _kv_get(self, keys: List[str], host_indices):
        if not keys:
            return [], 0, 0
        geo = self._kv()
        starts = self._starts(keys, host_indices, geo.page_size, geo.size)
        hits, nbytes = self._pages.kv_get(geo, self._prefixes(geo.kind, keys), starts)
        return [i < hits for i in range(len(keys))], hits, nbytes

    def _kv_set(self, keys: List[str], host_indices):
        if not keys:
            return [], 0, 0
        geo = self._kv()
        starts = self._starts(keys, host_indices, geo.page_size, geo.size)
        return self._pages.kv_set(geo, self._prefixes(geo.kind, keys), starts)

    def _state_get(self, keys: List[str], host_indices):
        geo = self._mamba()
        slots = self._starts(keys, host_indices, 1, geo.slots)
        hits, nbytes = self._pages.state_get(geo, self._prefixes("mamba", keys), slots)
        return [i < hits for i in range(len(keys))], hits, nbytes

    def _state_set(self, keys: List[str], host_indices):
        geo = self._mamba()
        slots = self._starts(keys, host_indices, 1, geo.slots)
        return self._pages.state_set(geo, self._prefixes("mamba", keys), slots)

    # -- SGLang's interface: the generic page path (flat data pages of the host KV pool) ---

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> Optional[torch.Tensor]:
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[Optional[torch.Tensor]]:
        targets = list(target_locations or [None] * len(keys))
        if not keys or len(targets) != len(keys) or any(t is None for t in targets):
            return [None] * len(keys)
        t0 = time.perf_counter()

        def run():
            geo = self._kv()
            return self._pages.kv_get_flat(geo, self._prefixes(geo.kind, keys), targets)

        hits, nbytes = self._guard("batch_get", run, (0, 0))
        self._metrics.sample("prefetch", hits, nbytes, time.perf_counter() - t0)
        return [t if i < hits else None for i, t in enumerate(targets)]

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        values = list(values or [])
        if not keys or len(values) != len(keys):
            return not keys
        t0 = time.perf_counter()

        def run():
            geo = self._kv()
            return self._pages.kv_set_flat(geo, self._prefixes(geo.kind, keys), values)

        ok, pages, nbytes = self._guard("batch_set", run, ([False], 0, 0))
        self._metrics.sample("backup", pages, nbytes, time.perf_counter() - t0)
        return all(ok)

    # -- housekeeping ---------------------------------------------------------------------

    def clear(self) -> bool:
        """Deletes this namespace's snapshots that the daemon's pool lists (and, through
        DeleteSnapshot, their copies in the host tier and Redis)."""
        def run() -> bool:
            conn = self._sessions.current().conn
            assert conn is not None
            while True:
                listed = conn.list_snapshots(self._head, 1000)
                keys = {(e.prefix, e.position) for e in listed.snapshots}
                for p, pos in keys:
                    conn.delete_snapshot(p, pos)
                if not listed.truncated or not keys:
                    return True

        return self._guard("clear", run, False)

    def get_stats(self):
        """SGLang's StorageMetrics: pages and GB/s (GiB, as SGLang's own backends count) per
        batch call that moved pages since the last call; SGLang calls it every scheduler step
        under --enable-metrics."""
        return self._metrics.drain()

    def pools(self) -> Dict[str, str]:
        """Per pool (``kv``, ``mamba``), the path its pages take (zero copy or one copy, and
        why) or why it is not stored: what the log said when SGLang registered it."""
        kv, mamba = self._kv_geo, self._mamba_geo
        return {"kv": kv.path if kv is not None else f"not stored: {self._kv_refused}",
                "mamba": mamba.path if mamba is not None else f"not stored: {self._mamba_refused}"}

    def stats(self) -> Dict[str, Any]:
        """This backend's counters since it was made (statepool.sglang.COUNTERS says what each
        one counts)."""
        return self._metrics.counters()

    def close(self) -> None:
        self._sessions.close_all()
