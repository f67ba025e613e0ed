"""The page copies between SGLang's host pools and statepool (private to statepool.sglang).

``_PageCopies``, a base of ``StatepoolHiCacheStorage``: a KV page into and out of a KV entry of
the small arena, a MAMBA slot into and out of a state snapshot (with its marker), existence
queries, and the batches of SGLang's interfaces (v1 and v2 transfers, flat data pages) over
them, which take the backend's lock and report their failures instead of raising them.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer

import statepool

from ._sglang_arenas import _SmallArena
from ._sglang_connection import _Down, _Session
from ._sglang_pools import _KvGeometry, _Unsupported


class _PageCopies:
    """Copies of pages, a base of StatepoolHiCacheStorage (which provides _lock, counters,
    registered_pools, _prefix, the session's resources _kv() and _mamba(), and the failure
    handling of _Connection)."""

    # -- KV pages -------------------------------------------------------------------------

    def _kv_put(self, s: _Session, geo: _KvGeometry, small: _SmallArena, key: str,
                k: torch.Tensor, v: torch.Tensor) -> bool:
        L, ps = geo.layers, geo.page_size
        stage = small.kv_stage
        stage[:, 0].view(L, ps, geo.heads, geo.head_dim).copy_(k)
        stage[:, 1].view(L, ps, geo.heads, geo.head_dim).copy_(v)
        s.conn.put_snapshot(small.kv_slot, self._prefix(geo.kind, key), 0, kv=geo.blocks,
                            kv_staging=small.staging, kv_offset=small.kv_offset,
                            kv_dtype=geo.dtype)
        self.counters["kv_puts"] += 1
        return True

    def _kv_get(self, s: _Session, geo: _KvGeometry, small: _SmallArena, key: str,
                k: Optional[torch.Tensor], v: Optional[torch.Tensor]) -> bool:
        """Reads the page into k, v (None: existence only)."""
        prefix = self._prefix(geo.kind, key)
        if k is None:
            got = s.conn.get_snapshot(prefix, 0, small.get_slot)
        else:
            got = s.conn.get_snapshot(prefix, 0, small.get_slot, kv_staging=small.staging,
                                      kv_offset=small.kv_offset, kv_dtype=geo.dtype)
        if not got.hit or got.kv != geo.blocks or (k is not None and not got.kv_delivered):
            self.counters["kv_misses"] += 1
            return False
        if not small.header_matches(small.kv_header):
            self._report("format", f"KV entry {key} has another format or geometry: a miss")
            self.counters["kv_misses"] += 1
            return False
        if k is not None:
            L, ps = geo.layers, geo.page_size
            k.copy_(small.kv_stage[:, 0].view(L, ps, geo.heads, geo.head_dim))
            v.copy_(small.kv_stage[:, 1].view(L, ps, geo.heads, geo.head_dim))
        self.counters["kv_hits"] += 1
        return True

    def _kv_batch(self, keys: List[str], host_indices: Optional[torch.Tensor], write: bool,
                  what: str) -> List[bool]:
        results = [False] * len(keys)
        with self._lock:
            try:
                s, geo, small = self._kv()
                ps = geo.page_size
                if host_indices is None or host_indices.numel() != len(keys) * ps:
                    raise _Unsupported(f"{len(keys)} keys but "
                                       f"{0 if host_indices is None else host_indices.numel()} "
                                       f"host indices for pages of {ps}")
                starts = host_indices.reshape(-1)[::ps].tolist()
                for i, key in enumerate(keys):
                    k, v = geo.page_views(int(starts[i]))
                    if write:
                        results[i] = self._kv_put(s, geo, small, key, k, v)
                    else:
                        results[i] = self._kv_get(s, geo, small, key, k, v)
                        if not results[i]:
                            break  # SGLang takes the leading run of pages
                self._recovered("daemon", "capacity", "refused", "error")
            except _Down:
                pass
            except Exception as e:  # noqa: BLE001 - never into the engine
                self._fail(what, e)
        return results

    def _kv_exists_run(self, keys: List[str]) -> int:
        """Leading run of KV pages the store has (0 when it cannot be asked)."""
        with self._lock:
            n = 0
            try:
                s, geo, small = self._kv()
                for key in keys:
                    if not self._kv_get(s, geo, small, key, None, None):
                        break
                    n += 1
            except _Down:
                pass
            except Exception as e:  # noqa: BLE001
                self._fail("exists", e)
            return n

    # -- MAMBA pages ----------------------------------------------------------------------

    def _state_put(self, key: str, index: int) -> bool:
        s, geo, st, small = self._mamba()
        t, c = geo.slot_views(index)
        st.recurrent.copy_(t)
        st.conv.copy_(c)
        try:
            s.conn.compress(st.put_slot, st.staging, 0, geo.staged_dtype)
        except statepool.NotFinite as e:
            self._report("not_finite", f"state {key} not stored: {e}")
            return False
        s.conn.put_snapshot(st.put_slot, self._prefix("mamba", key), 0)
        s.conn.put_snapshot(small.marker_slot, self._prefix(geo.marker_kind, key), 0)
        self.counters["state_puts"] += 1
        return True

    def _state_get(self, key: str, index: int) -> bool:
        s, geo, st, small = self._mamba()
        got = s.conn.get_snapshot(self._prefix("mamba", key), 0, st.get_slot)
        if not got.hit:
            self.counters["state_misses"] += 1
            return False
        s.conn.decompress(st.get_slot, st.staging, 0, geo.staged_dtype)
        t, c = geo.slot_views(index)
        t.copy_(st.recurrent)
        c.copy_(st.conv)
        self.counters["state_hits"] += 1
        return True

    def _state_exists(self, key: str) -> bool:
        s, geo, st, small = self._mamba()
        got = s.conn.get_snapshot(self._prefix(geo.marker_kind, key), 0, small.get_slot)
        return bool(got.hit) and got.kv is None and small.header_matches(small.marker_header)

    # -- presence and transfers of SGLang's v2 interface (hybrid pools) -------------------

    def _pool_presence(self, name, keys: List[str]) -> List[bool]:
        if name == PoolName.KV:
            n = self._kv_exists_run(keys)
            return [i < n for i in range(len(keys))]
        present = [False] * len(keys)
        if name != PoolName.MAMBA:
            return present
        with self._lock:
            try:
                for i, key in enumerate(keys):
                    present[i] = self._state_exists(key)
            except _Down:
                pass
            except Exception as e:  # noqa: BLE001
                self._fail("exists (state)", e)
        return present

    def _transfers(self, transfers: List[PoolTransfer], write: bool) -> Dict[Any, List[bool]]:
        results: Dict[Any, List[bool]] = {}
        what = "batch_set_v2" if write else "batch_get_v2"
        for transfer in transfers:
            keys = transfer.keys or []
            results[transfer.name] = out = [False] * len(keys)
            pool = self.registered_pools.get(transfer.name)
            if transfer.name == PoolName.KV:
                results[transfer.name] = self._kv_batch(keys, transfer.host_indices, write, what)
                continue
            if transfer.name != PoolName.MAMBA or pool is None:
                with self._lock:
                    self._report("unsupported", f"{what}: pool {transfer.name} is not stored")
                continue
            page = getattr(pool, "page_size", 1) or 1
            hi = transfer.host_indices
            if hi is None or hi.numel() != len(keys) * page:
                with self._lock:
                    self._report("error", f"{what}: {len(keys)} keys of pool {transfer.name} but "
                                 f"{0 if hi is None else hi.numel()} host indices")
                continue
            starts = hi.reshape(-1)[::page].tolist()
            with self._lock:
                try:
                    for i, key in enumerate(keys):
                        op = self._state_put if write else self._state_get
                        out[i] = op(key, int(starts[i]))
                    self._recovered("daemon", "capacity", "refused", "error")
                except _Down:
                    pass
                except Exception as e:  # noqa: BLE001
                    self._fail(what, e)
        return results

    # -- flat data pages of the host KV pool (SGLang's generic page path) -----------------

    def _flat_op(self, key: str, flat: Optional[torch.Tensor], write: bool) -> bool:
        with self._lock:
            try:
                s, geo, small = self._kv()
                if flat is None or flat.numel() * flat.element_size() != geo.plain_bytes:
                    raise _Unsupported(f"a data page of {0 if flat is None else flat.numel()} "
                                       "values, not one page of the host KV pool")
                page = flat.view(geo.torch_dtype) if flat.dtype != geo.torch_dtype else flat
                k, v = geo.flat_views(page.reshape(-1))
                if write:
                    return self._kv_put(s, geo, small, key, k, v)
                return self._kv_get(s, geo, small, key, k, v)
            except _Down:
                return False
            except Exception as e:  # noqa: BLE001
                self._fail("set" if write else "get", e)
                return False

