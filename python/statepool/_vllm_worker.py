"""The worker side of statepool's vLLM offloading spec (private to statepool.vllm).

vLLM submits transfer jobs from its step (``submit_store`` / ``submit_load``) and polls them
(``get_finished``); it blocks only in ``wait``, when it must reuse a block a job still reads.
Submitting queues the job for this worker's transfer thread, which has its own daemon
connection and runs the jobs in order:

- **store**: one lookup (pool only) drops the entries the store has; the others' pages are
  copied from vLLM's KV-cache tensors into the connection's staging buffer (one copy: an
  ``index_select`` per layer and group straight into place) and published with one
  ``put_snapshots`` per arena, which encodes them (state codec, KV codec) from there;
- **load**: one ``get_snapshots`` per arena decodes every entry into the staging buffer, and one
  ``index_copy_`` per layer and group puts them into vLLM's pages; a job that does not find
  every entry fails (vLLM then recomputes its request) and leaves the pages to be recomputed.

Staging order (the ranges the daemon reads and writes): for n entries of a Mamba group of L
layers, the recurrent states ``[n][L][heads][value][key]`` (``StateRange(value_major=True)``)
and, apart, the conv states ``[n][L][conv bytes]``; for an attention group the pages as they
are, ``[n][L][head][K|V][token][head_dim]``, whose key and value rows a ``KvRange`` with the
head stride as its layer stride addresses. Every failure fails the job (reported once per kind);
nothing raises into vLLM.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    OffloadingWorker,
    TransferResult,
    get_offload_group_idx,
)

import statepool

from ._daemon_link import CALL_KINDS, Reporter, entry_kind
from ._vllm_geometry import Geometry, Group, KvGroup, StateGroup, StatepoolKeys
from ._vllm_metrics import Counters
from ._vllm_session import Session, Sessions, lookup_columns

logger = logging.getLogger("statepool.vllm")

_Get = statepool.SnapshotGetEntry
_Put = statepool.SnapshotPutEntry
_OK = statepool.Status.ok
_ALIGN = 64


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class _JobFailed(Exception):
    """A job that cannot go on (the reason was reported)."""


@dataclass
class _Item:
    """One entry of a job: a key, its group and vLLM block, and its snapshot prefix."""

    key: bytes
    group: Group
    block: int
    prefix: str


@dataclass
class _Chunk:
    """Items of one group in a span, and where they lie in the staging buffer."""

    group: Group
    items: List[_Item]
    first: int = 0   # of the state's recurrent part (state) or of the pages (KV)
    conv: int = 0    # of the conv states (state)

    @property
    def bytes(self) -> int:
        g, m = self.group, len(self.items)
        if isinstance(g, StateGroup):
            return _align(m * g.layers * g.ssm_bytes) + _align(m * g.layers * g.conv_bytes)
        return _align(m * g.entry_bytes)


@dataclass
class _Job:
    job_id: int
    store: bool
    items: List[_Item]
    error: str = ""  # set when the job could not even be read
    submitted: float = field(default_factory=time.perf_counter)


class StatepoolOffloadingWorker(OffloadingWorker):
    """vLLM's OffloadingWorker over statepool (module docstring)."""

    def __init__(self, geometry: Geometry, group_order: Sequence[int],
                 kv_caches: CanonicalKVCaches, sessions: Sessions, reporter: Reporter,
                 counters: Counters):
        self._geo = geometry
        self._order = list(group_order)  # KV-cache group id of each offloaded group, in order
        self._sessions = sessions
        self._reporter = reporter
        self._counters = counters
        # per group id, one int8 tensor [num_blocks, >= page bytes] per layer
        self._pages: Dict[int, List[torch.Tensor]] = {}
        self.refused: Dict[int, str] = dict(geometry.refused)
        for pos, refs in enumerate(kv_caches.group_data_refs):
            gid = self._order[pos] if pos < len(self._order) else -1
            group = geometry.groups.get(gid)
            if group is None:
                continue
            try:
                self._pages[gid] = self._layer_tensors(group, refs, kv_caches)
            except ValueError as e:
                self.refused[gid] = str(e)
                logger.warning("statepool vLLM offloading: group %d is not stored: %s; its "
                               "blocks miss", gid, e)
        self._lock = threading.Condition()
        self._finished: List[TransferResult] = []
        self._pending: set = set()
        self._queue: "queue.Queue[Optional[_Job]]" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="statepool-vllm-transfers",
                                        daemon=True)
        self._thread.start()

    @staticmethod
    def _layer_tensors(group: Group, refs: Sequence[Any],
                       kv_caches: CanonicalKVCaches) -> List[torch.Tensor]:
        if len(refs) != group.layers:
            raise ValueError(f"{len(refs)} page tensors for the group's {group.layers} layers")
        out = []
        for ref in refs:
            t = kv_caches.tensors[ref.tensor_idx].tensor
            if ref.page_size_bytes != group.page_bytes:
                raise ValueError(f"pages of {ref.page_size_bytes} bytes, not the "
                                 f"{group.page_bytes} of the group's KV-cache spec")
            if (t.device.type != "cpu" or t.dtype != torch.int8 or t.dim() != 2
                    or t.stride(1) != 1 or t.shape[1] < group.page_bytes):
                raise ValueError(f"a page tensor {tuple(t.shape)} {t.dtype} on {t.device} "
                                 "(expected int8 [blocks, page bytes] in CPU memory)")
            out.append(t)
        return out

    # -- vLLM's interface -------------------------------------------------------------------

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        """vLLM 0.32: (job, GPULoadStoreSpec, ours); 0.34: (job, DevicePointers, ours)."""
        return self._submit(job_id, True, dst_spec, src_spec)

    def submit_load(self, job_id: int, src_spec: Any, dst_spec: Any,
                    expedited: bool = False) -> bool:
        """vLLM 0.32: (job, ours, GPULoadStoreSpec); 0.34: (job, ours, DevicePointers,
        expedited); an expedited load is taken like any other (jobs run in order)."""
        return self._submit(job_id, False, src_spec, dst_spec)

    def get_finished(self) -> List[TransferResult]:
        with self._lock:
            done, self._finished = self._finished, []
        return done

    def wait(self, job_ids: set) -> None:
        with self._lock:
            self._lock.wait_for(lambda: not (self._pending & set(job_ids))
                                or not self._thread.is_alive())

    def shutdown(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=self._sessions.timeout + 5)
        self._sessions.close_all()
        logger.info("statepool vLLM offloading: worker (rank %d) done: %s", self._geo.rank,
                    {k: v for k, v in self._counters.snapshot().items() if v})

    def stats(self) -> Dict[str, float]:
        """The counters (statepool.vllm.COUNTERS) since the worker was made."""
        return self._counters.snapshot()

    # -- reading a job --------------------------------------------------------------------

    def _blocks(self, spec: Any) -> List[Tuple[int, int]]:
        """(group id, block id) per block of vLLM's side of a job, in order."""
        if hasattr(spec, "ptrs"):  # vLLM 0.34+: DevicePointers
            out, at = [], 0
            ptrs = [int(p) for p in spec.ptrs]
            for pos, (n, refs) in enumerate(zip(spec.group_block_counts,
                                                spec.group_data_ref_counts)):
                gid = self._order[pos]
                layer0 = self._pages.get(gid, [None])[0]
                if layer0 is None and n:
                    raise ValueError(f"blocks of group {gid}, which is not stored")
                for p in ptrs[at:at + n]:
                    offset = p - layer0.data_ptr()
                    stride = layer0.stride(0)
                    if offset < 0 or offset % stride or offset // stride >= layer0.shape[0]:
                        raise ValueError("a device pointer outside the group's first layer")
                    out.append((gid, offset // stride))
                at += n * refs
            return out
        out, at = [], 0
        ids = [int(b) for b in spec.block_ids]
        for pos, n in enumerate(spec.group_sizes):
            out.extend((self._order[pos], b) for b in ids[at:at + n])
            at += n
        return out

    def _submit(self, job_id: int, store: bool, ours: Any, engine_side: Any) -> bool:
        job = _Job(job_id, store, [])
        self._counters.add(**{"store_jobs" if store else "load_jobs": 1})
        try:
            keys = ours.keys if isinstance(ours, StatepoolKeys) else None
            if keys is None:
                raise ValueError(f"a job spec {type(ours).__name__}, not statepool's")
            blocks = self._blocks(engine_side)
            if len(blocks) != len(keys):
                raise ValueError(f"{len(keys)} keys for {len(blocks)} blocks (statepool "
                                 "stores one block per key: leave block_size and "
                                 "blocks_per_chunk unset)")
            for key, (gid, block) in zip(keys, blocks):
                group = self._geo.groups.get(gid)
                if get_offload_group_idx(key) != gid or gid not in self._pages or group is None:
                    raise ValueError(f"a key of group {get_offload_group_idx(key)} for a block "
                                     f"of group {gid}" + ("" if gid in self._pages
                                                          else " (not stored)"))
                job.items.append(_Item(key, group, block, self._geo.prefix(key, group)))
        except Exception as e:  # noqa: BLE001 - the job fails, vLLM goes on
            job.error = f"{type(e).__name__}: {e}"
        with self._lock:
            self._pending.add(job_id)
        self._queue.put(job)
        return True

    # -- the transfer thread --------------------------------------------------------------

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                break
            what = "store" if job.store else "load"
            nbytes = 0
            ok = False
            try:
                if job.error:
                    self._reporter.report("unsupported", f"a {what} job refused: {job.error}")
                else:
                    nbytes = self._store(job) if job.store else self._load(job)
                    ok = True
            except _JobFailed:
                pass
            except Exception as e:  # noqa: BLE001 - never into vLLM
                self._sessions.fail(what, e)
            seconds = time.perf_counter() - job.submitted
            self._counters.add(**({"store_seconds": seconds} if job.store
                                  else {"load_seconds": seconds}))
            if not ok:
                self._counters.add(**{"failed_store_jobs" if job.store else "failed_load_jobs": 1})
            result = TransferResult(job.job_id, ok, nbytes if ok else None,
                                    seconds if ok else None)
            with self._lock:
                self._pending.discard(job.job_id)
                self._finished.append(result)
                self._lock.notify_all()
        with self._lock:
            self._lock.notify_all()

    # -- staging ----------------------------------------------------------------------------

    def _arena(self, s: Session, group: Group) -> int:
        if isinstance(group, StateGroup):
            return s.state_arena(group)
        return s.kv_arena(self._geo.kv_groups())[0]

    def _spans(self, s: Session, items: List[_Item]) -> List[List[_Chunk]]:
        """The items (of one arena) in spans that fit the staging buffer and the daemon's
        byte cap, each span a list of chunks of one group, laid out in the buffer."""
        cap = max(1, min(s.staging.cap, s.connection.max_batch_bytes))
        items = sorted(items, key=lambda it: it.group.group_id)  # stable: vLLM's order within
        spans: List[List[_Chunk]] = []
        span: List[_Chunk] = []
        used = 0
        for it in items:
            each = _Chunk(it.group, [it]).bytes
            if span and used + each > cap:
                spans.append(span)
                span, used = [], 0
            if span and span[-1].group is it.group:
                span[-1].items.append(it)
            else:
                span.append(_Chunk(it.group, [it]))
            used += each
        if span:
            spans.append(span)
        for span in spans:
            at = 0
            for c in span:
                g, m = c.group, len(c.items)
                c.first = at
                if isinstance(g, StateGroup):
                    c.conv = at + _align(m * g.layers * g.ssm_bytes)
                at += c.bytes
        return spans

    @staticmethod
    def _span_bytes(span: List[_Chunk]) -> int:
        return sum(c.bytes for c in span)

    @staticmethod
    def _entries(sid: int, span: List[_Chunk], put: bool, header_slot: int) -> list:
        entries = []
        for c in span:
            g = c.group
            for j, it in enumerate(c.items):
                if isinstance(g, StateGroup):
                    r = statepool.StateRange(sid, c.first + j * g.layers * g.ssm_bytes,
                                             g.staged_dtype, True, sid,
                                             c.conv + j * g.layers * g.conv_bytes)
                    entries.append(_Put(it.prefix, 0, r) if put else _Get(it.prefix, 0, r))
                else:
                    k0 = c.first + j * g.entry_bytes
                    r = statepool.KvRange(sid, g.dtype, k0, None, k0 + g.value_offset,
                                          g.stream_stride, g.row_bytes)
                    entries.append(_Put(it.prefix, 0, None, header_slot, g.blocks, r) if put
                                   else _Get(it.prefix, 0, None, r))
        return entries

    def _views(self, area: torch.Tensor, c: _Chunk, layer: int):
        """(staging view, page columns) pairs of one layer of a chunk: the staging rows of
        every item and the byte range of vLLM's page they hold."""
        g, m = c.group, len(c.items)
        if isinstance(g, StateGroup):
            L = g.layers
            return [(area.as_strided((m, g.ssm_bytes), (L * g.ssm_bytes, 1),
                                     c.first + layer * g.ssm_bytes),
                     slice(g.conv_bytes, g.conv_bytes + g.ssm_bytes)),
                    (area.as_strided((m, g.conv_bytes), (L * g.conv_bytes, 1),
                                     c.conv + layer * g.conv_bytes),
                     slice(0, g.conv_bytes))]
        return [(area.as_strided((m, g.page_bytes), (g.layers * g.page_bytes, 1),
                                 c.first + layer * g.page_bytes),
                 slice(0, g.page_bytes))]

    def _stage(self, area: torch.Tensor, span: List[_Chunk]) -> int:
        """vLLM's pages -> staging; returns the bytes copied."""
        n = 0
        for c in span:
            idx = torch.tensor([it.block for it in c.items], dtype=torch.int64)
            for layer, pages in enumerate(self._pages[c.group.group_id]):
                for view, cols in self._views(area, c, layer):
                    torch.index_select(pages[:, cols], 0, idx, out=view)
                    n += view.numel()
        return n

    def _unstage(self, area: torch.Tensor, span: List[_Chunk]) -> int:
        """staging -> vLLM's pages; returns the bytes copied. A copy per page: index_copy_
        moves int8 rows element by element (a tenth of memcpy's speed), a row copy is a
        memcpy."""
        n = 0
        for c in span:
            blocks = [it.block for it in c.items]
            for layer, pages in enumerate(self._pages[c.group.group_id]):
                for view, cols in self._views(area, c, layer):
                    for j, block in enumerate(blocks):
                        pages[block, cols].copy_(view[j])
                    n += view.numel()
        return n

    def _by_arena(self, s: Session, items: List[_Item]) -> Dict[int, List[_Item]]:
        out: Dict[int, List[_Item]] = {}
        for it in items:
            out.setdefault(self._arena(s, it.group), []).append(it)
        return out

    def _entry_failure(self, what: str, r) -> None:
        self._reporter.report(entry_kind(r.status),
                              f"{what}: an entry failed ({r.status.name}): {r.message}")

    # -- jobs -------------------------------------------------------------------------------

    def _store(self, job: _Job) -> int:
        s = self._sessions.current()
        conn = s.connection
        by_arena = self._by_arena(s, job.items)
        arenas = list(by_arena)
        present, trips = lookup_columns(
            conn, [(a, [it.prefix for it in by_arena[a]]) for a in arenas], lower_tiers=False)
        existing = created = failed = stored = copied = 0
        for a, there in zip(arenas, present):
            todo, seen = [], set()
            for it, has in zip(by_arena[a], there):
                if has or it.prefix in seen:
                    existing += 1
                    continue
                seen.add(it.prefix)
                todo.append(it)
            header = s.kv_arena(self._geo.kv_groups())[1] if any(
                isinstance(it.group, KvGroup) for it in todo) else 0
            for span in self._spans(s, todo):
                sid, area = s.staging.get(conn, self._span_bytes(span))
                copied += self._stage(area.view(torch.int8), span)
                puts = conn.put_snapshots(a, self._entries(sid, span, True, header))
                trips += 1
                existing += puts.existing
                created += puts.created
                failed += puts.failed
                flat = [it for c in span for it in c.items]
                for it, r in zip(flat, puts.results):
                    if r.status != _OK:
                        self._entry_failure("store", r)
                    elif r.created:
                        stored += it.group.entry_bytes
        self._counters.add(puts=created, existing=existing, bytes_stored=stored,
                           bytes_copied=copied, round_trips=trips)
        if failed:
            raise _JobFailed()
        self._reporter.recovered(*CALL_KINDS)
        return stored

    def _load(self, job: _Job) -> int:
        # A span is written into vLLM's pages as soon as it is read: if a later span misses,
        # the job fails and vLLM recomputes the request, overwriting them.
        s = self._sessions.current()
        conn = s.connection
        trips = copied = 0
        for a, items in self._by_arena(s, job.items).items():
            for span in self._spans(s, items):
                sid, area = s.staging.get(conn, self._span_bytes(span))
                got = conn.get_snapshots(a, self._entries(sid, span, False, 0), True)
                trips += 1
                for r, it in zip(got.results, [it for c in span for it in c.items]):
                    if r.status != _OK:
                        self._counters.add(round_trips=trips, bytes_copied=copied)
                        self._entry_failure("load", r)
                        raise _JobFailed()
                    if not r.hit or (isinstance(it.group, KvGroup) and not r.kv_delivered):
                        self._counters.add(round_trips=trips, bytes_copied=copied)
                        self._reporter.report(
                            "miss", f"a load found {got.hits} of the {len(got.results)} "
                            "entries the lookup had found (evicted since, or the daemon "
                            "restarted): vLLM recomputes the request")
                        raise _JobFailed()
                copied += self._unstage(area.view(torch.int8), span)
        loaded = sum(it.group.entry_bytes for it in job.items)
        self._counters.add(gets=len(job.items), bytes_loaded=loaded, bytes_copied=copied,
                           round_trips=trips)
        self._reporter.recovered(*CALL_KINDS, "miss")
        return loaded
