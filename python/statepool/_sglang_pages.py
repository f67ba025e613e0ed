"""The pages of SGLang's host pools moved in batches (private to statepool.sglang).

``_Pages`` turns one batch call of SGLang's into as few daemon round trips as the daemon's caps
allow: an existence query is one ``lookup_snapshots`` (answered from the indexes, nothing
read), a get one ``get_snapshots`` that decodes every page straight into its range, a set one
``put_snapshots`` whose pages already stored are skipped before a byte of them is read.

Where the ranges point: **zero copy**, into SGLang's host pool itself (its memory files lent to
the daemon, ``Session.memory_id``); **one copy**, into this connection's staging buffer, which
one vectorized copy fills from the pool (sets: only the pages the store lacks, found by a
lookup first) or empties into it (gets: only the pages read). Offsets are integer arithmetic
over the pool's strides (``_KvGeometry``, ``_MambaGeometry``); no per-page tensor work on the
zero-copy path. Every method raises on a failed call (the backend reports it) and reports the
failures of single pages itself.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import torch

import statepool

from ._daemon_link import CALL_KINDS, Reporter, entry_kind
from ._sglang_arenas import _KvArena, _StateArena
from ._sglang_connection import _Session, _Sessions
from ._sglang_metrics import _Metrics
from ._sglang_pools import _KvGeometry, _MambaGeometry
from ._sglang_settings import Settings

_Get = statepool.SnapshotGetEntry
_Put = statepool.SnapshotPutEntry
_KvRange = statepool.KvRange
_StateRange = statepool.StateRange
_ABSENT = statepool.SnapshotTier.none
_OK = statepool.Status.ok


def _spans(n: int, each: int, conn: statepool.Connection,
           limit: Optional[int] = None) -> Iterator[Tuple[int, int]]:
    """[a, b) spans of n entries of ``each`` bytes that fit the daemon's caps (and ``limit``
    entries per span)."""
    per = max(1, min(conn.max_batch_keys or n, conn.max_batch_bytes // max(1, each)))
    if limit is not None:
        per = min(per, limit)
    for a in range(0, n, per):
        yield a, min(n, a + per)


def _requests(n: int, conn: statepool.Connection) -> int:
    """Requests the client library sends for n keys (it splits by the daemon's key cap)."""
    cap = conn.max_batch_keys or n
    return -(-n // cap)


def _leading(results: Sequence, kv: bool) -> int:
    """Entries read from the first on (a hit whose KV blocks were delivered, for KV)."""
    n = 0
    for r in results:
        if not r.hit or r.status != _OK or (kv and not r.kv_delivered):
            break
        n += 1
    return n


class _Pages:
    """The batch operations on one backend's pools (see the module docstring)."""

    def __init__(self, sessions: _Sessions, metrics: _Metrics, reporter: Reporter,
                 settings: Settings, version: int):
        self.sessions = sessions
        self.metrics = metrics
        self.reporter = reporter
        self.settings = settings
        self.version = version

    # -- what a session sets up at first use ----------------------------------------------

    def _kv(self, geo: _KvGeometry) -> Tuple[_Session, statepool.Connection, _KvArena]:
        s = self.sessions.current()
        assert s.conn is not None
        if s.kv_arena is None:
            s.kv_arena = _KvArena(s.conn, geo, self.settings, self.version)
        return s, s.conn, s.kv_arena

    def _state(self, geo: _MambaGeometry) -> Tuple[_Session, statepool.Connection, _StateArena]:
        s = self.sessions.current()
        assert s.conn is not None
        if s.state_arena is None:
            s.state_arena = _StateArena(s.conn, geo, self.settings)
        return s, s.conn, s.state_arena

    def _done(self, failed: Sequence[str] = ()) -> None:
        self.reporter.recovered(*(k for k in CALL_KINDS if k not in failed))

    def _entry_failure(self, s: _Session, what: str, r) -> str:
        """Reports a page that failed alone; returns its failure kind."""
        status, message = r.status, r.message
        kind = entry_kind(status)
        if kind == "refused" and "loan is broken" in message:
            s.forget_memory()  # register SGLang's memory again at the next call
        self.reporter.report(kind, f"{what}: a page failed ({status.name}): {message}")
        return kind

    # -- existence ------------------------------------------------------------------------

    def kv_leading(self, geo: _KvGeometry, prefixes: List[str]) -> int:
        """How many pages from the first on the store has (host tier and Redis included)."""
        s, conn, arena = self._kv(geo)
        t0 = time.perf_counter()
        found = conn.lookup_snapshots(arena.id, prefixes, 0, True, True)
        self.metrics.add(kv_lookups=len(prefixes), kv_lookup_hits=found.leading,
                         lookup_seconds=time.perf_counter() - t0,
                         round_trips=_requests(len(prefixes), conn))
        self._done()
        return found.leading

    def kv_leading_and_states(self, geo: _KvGeometry, prefixes: List[str],
                              state_geo: _MambaGeometry,
                              state_prefixes: List[str]) -> Tuple[int, List[bool]]:
        """kv_leading and states_present of the pages before the KV run ends, in one round
        trip (the state keys ride along: LookupSnapshots' ``also``)."""
        s, conn, arena = self._kv(geo)
        _, _, state_arena = self._state(state_geo)
        t0 = time.perf_counter()
        found = conn.lookup_snapshots(arena.id, prefixes, 0, True, True,
                                      [(state_arena.id, state_prefixes, 0)])
        present = [t != _ABSENT for t in found.also[0][:found.leading]]
        self.metrics.add(kv_lookups=len(prefixes), kv_lookup_hits=found.leading,
                         state_lookups=found.leading, state_lookup_hits=sum(present),
                         lookup_seconds=time.perf_counter() - t0,
                         round_trips=_requests(2 * len(prefixes), conn))
        self._done()
        return found.leading, present

    def states_present(self, geo: _MambaGeometry, prefixes: List[str]) -> List[bool]:
        s, conn, arena = self._state(geo)
        t0 = time.perf_counter()
        found = conn.lookup_snapshots(arena.id, prefixes, 0, True, False).found
        present = [t != _ABSENT for t in found]
        self.metrics.add(state_lookups=len(prefixes), state_lookup_hits=sum(present),
                         lookup_seconds=time.perf_counter() - t0,
                         round_trips=_requests(len(prefixes), conn))
        self._done()
        return present

    # -- KV pages at host indices (batch_get_v1 / batch_set_v1 / v2 KV) -------------------

    def kv_get(self, geo: _KvGeometry, prefixes: List[str],
               starts: List[int]) -> Tuple[int, int]:
        """Reads the pages into the host pool pages that start at ``starts``; returns the
        leading run read (SGLang takes no more) and its bytes."""
        s, conn, arena = self._kv(geo)
        t0 = time.perf_counter()
        n, each = len(prefixes), geo.plain_bytes
        mem = s.memory_id(geo.shared, "SGLang host KV pool", self.reporter)
        hits = nbytes = trips = copied = 0
        if mem is not None:
            dt, ib, ls, ts = geo.dtype, geo.index_bytes, geo.layer_stride, geo.token_stride
            k0 = geo.shared.offset
            v0 = k0 + geo.half_bytes
            entries = [_Get(p, 0, None, _KvRange(mem, dt, k0 + i * ib, None, v0 + i * ib, ls, ts))
                       for p, i in zip(prefixes, starts)]
            hits, trips = self._get_run(s, conn, arena.id, entries, each, True, "KV get")
            nbytes = hits * each
        else:
            for a, b in _spans(n, each, conn, s.staging.fit(each, n)):
                m = b - a
                sid, area = s.staging.get(conn, m * each)
                got = conn.get_snapshots(arena.id, self._staged_kv(geo, sid, prefixes[a:b],
                                                                   None), True)
                trips += _requests(b - a, conn)
                h = _leading(got.results, True)
                geo.unstage(area, starts[a:a + h], m)
                hits += h
                nbytes += h * each
                copied += h * each
                if h < m:
                    self._get_failures(s, "KV get", got.results[h:])
                    break
        seconds = time.perf_counter() - t0
        self.metrics.add(kv_hits=hits, kv_misses=n - hits, bytes_read=nbytes, bytes_copied=copied,
                         get_seconds=seconds, round_trips=trips)
        self._done()
        return hits, nbytes

    def _staged_kv(self, geo: _KvGeometry, sid: int, prefixes: Sequence[str],
                   slot: Optional[int]) -> list:
        """Entries whose KV ranges are pages 0..m-1 of the staging buffer ``sid`` (get
        entries, or put entries copying the header ``slot``)."""
        m, dt, each = len(prefixes), geo.dtype, geo.plain_bytes
        if geo.strided:
            half, ls, ts = geo.staged_strides(m)
            step = geo.page_size * geo.index_bytes
            ranges = [_KvRange(sid, dt, j * step, None, half + j * step, ls, ts) for j in range(m)]
        else:
            ranges = [_KvRange(sid, dt, j * each, None, 0, 0, 0) for j in range(m)]
        if slot is None:
            return [_Get(p, 0, None, r) for p, r in zip(prefixes, ranges)]
        return [_Put(p, 0, None, slot, geo.blocks, r) for p, r in zip(prefixes, ranges)]

    def _get_run(self, s: _Session, conn: statepool.Connection, arena_id: int, entries: list,
                 each: int, kv: bool, what: str) -> Tuple[int, int]:
        """Gets whose ranges need no staging, ``each`` bytes an entry, until the first page
        not read; returns the leading run read and the requests sent."""
        hits = trips = 0
        for a, b in _spans(len(entries), each, conn):
            got = conn.get_snapshots(arena_id, entries[a:b], True)
            trips += _requests(b - a, conn)
            h = _leading(got.results, kv)
            hits += h
            if h < b - a:
                self._get_failures(s, what, got.results[h:])
                break
        return hits, trips

    def _get_failures(self, s: _Session, what: str, rest: Sequence) -> None:
        for r in rest:
            if r.status != _OK:
                self._entry_failure(s, what, r)
                return

    def kv_set(self, geo: _KvGeometry, prefixes: List[str],
               starts: List[int]) -> Tuple[List[bool], int, int]:
        """Stores the host pool pages that start at ``starts``; returns per page whether the
        store has it now, the pages created and the bytes read."""
        s, conn, arena = self._kv(geo)
        t0 = time.perf_counter()
        each = geo.plain_bytes
        mem = s.memory_id(geo.shared, "SGLang host KV pool", self.reporter)
        if mem is not None:
            dt, ib, ls, ts = geo.dtype, geo.index_bytes, geo.layer_stride, geo.token_stride
            k0 = geo.shared.offset
            v0 = k0 + geo.half_bytes
            slot, blocks = arena.header_slot_id, geo.blocks
            entries = [_Put(p, 0, None, slot, blocks,
                            _KvRange(mem, dt, k0 + i * ib, None, v0 + i * ib, ls, ts))
                       for p, i in zip(prefixes, starts)]
            ok, counts = self._put_all(s, conn, arena.id, entries, each, "KV set")
        else:
            ok, counts = self._put_staged(
                s, conn, arena.id, prefixes, each, "KV set",
                lambda sid, idx: self._staged_kv(geo, sid, [prefixes[j] for j in idx],
                                                 arena.header_slot_id),
                lambda area, idx: geo.stage(area, [starts[j] for j in idx]))
        created, existing, failed, nbytes, copied, trips = counts
        seconds = time.perf_counter() - t0
        self.metrics.add(kv_puts=created, kv_existing=existing, kv_put_failures=failed,
                         bytes_written=nbytes, bytes_copied=copied, set_seconds=seconds,
                         round_trips=trips)
        return ok, created, nbytes

    def _put_all(self, s: _Session, conn: statepool.Connection, arena_id: int, entries: list,
                 each: int, what: str) -> Tuple[List[bool], Tuple[int, ...]]:
        """Sends put entries whose ranges need no staging; per page: stored (or there)."""
        ok: List[bool] = []
        created = existing = failed = nbytes = trips = 0
        kinds: List[str] = []
        for a, b in _spans(len(entries), each, conn):
            puts = conn.put_snapshots(arena_id, entries[a:b])
            trips += _requests(b - a, conn)
            created += puts.created
            existing += puts.existing
            failed += puts.failed
            nbytes += puts.bytes
            for r in puts.results:
                good = r.status == _OK
                ok.append(good)
                if not good:
                    kinds.append(self._entry_failure(s, what, r))
        self._done(kinds)
        return ok, (created, existing, failed, nbytes, 0, trips)

    def _put_staged(self, s: _Session, conn: statepool.Connection, arena_id: int,
                    prefixes: List[str], each: int, what: str,
                    make_entries: Callable[[int, List[int]], list],
                    stage: Callable[[torch.Tensor, List[int]], None],
                    staged_bytes: Optional[Callable[[int], int]] = None
                    ) -> Tuple[List[bool], Tuple[int, ...]]:
        """The one-copy set: a lookup first (pool only: what a put would skip), then the pages
        the pool lacks (each key once) staged and sent, ``make_entries(staging id, indices)``
        and ``stage(area, indices)`` for a span of them (``staged_bytes(m)`` bytes for m,
        default m * each)."""
        n = len(prefixes)
        found = conn.lookup_snapshots(arena_id, prefixes, 0, False, False).found
        trips = _requests(n, conn)
        ok = [t != _ABSENT for t in found]
        existing = sum(ok)
        first = {}
        for j in range(n):
            if not ok[j] and prefixes[j] not in first:
                first[prefixes[j]] = j
        todo = list(first.values())
        created = failed = nbytes = copied = 0
        kinds: List[str] = []
        for a, b in _spans(len(todo), each, conn, s.staging.fit(each, len(todo))):
            idx = todo[a:b]
            sid, area = s.staging.get(conn, staged_bytes(b - a) if staged_bytes else (b - a) * each)
            stage(area, idx)
            copied += (b - a) * each
            puts = conn.put_snapshots(arena_id, make_entries(sid, idx))
            trips += _requests(b - a, conn)
            created += puts.created
            existing += puts.existing
            failed += puts.failed
            nbytes += puts.bytes
            for j, r in zip(idx, puts.results):
                ok[j] = r.status == _OK
                if not ok[j]:
                    kinds.append(self._entry_failure(s, what, r))
        for j in range(n):  # the later copies of a key offered twice
            if not ok[j] and prefixes[j] in first and first[prefixes[j]] != j:
                ok[j] = ok[first[prefixes[j]]]
                existing += ok[j]
        self._done(kinds)
        return ok, (created, existing, failed, nbytes, copied, trips)

    # -- KV pages as flat tensors (SGLang's generic path: batch_get / batch_set) -------------

    def _flat_entries(self, geo: _KvGeometry, sid: int, prefixes: Sequence[str],
                      slot: Optional[int]) -> list:
        m, dt, each = len(prefixes), geo.dtype, geo.plain_bytes
        if geo.strided:
            ls, ts, half = geo.flat_layer_stride, geo.flat_token_stride, each // 2
            ranges = [_KvRange(sid, dt, j * each, None, j * each + half, ls, ts)
                      for j in range(m)]
        else:
            ranges = [_KvRange(sid, dt, j * each, None, 0, 0, 0) for j in range(m)]
        if slot is None:
            return [_Get(p, 0, None, r) for p, r in zip(prefixes, ranges)]
        return [_Put(p, 0, None, slot, geo.blocks, r) for p, r in zip(prefixes, ranges)]

    def _stage_flat(self, geo: _KvGeometry, area: torch.Tensor, pages: List[torch.Tensor]) -> None:
        each = geo.plain_bytes
        out = area[:len(pages) * each].view(geo.torch_dtype)
        if geo.strided:
            torch.cat(pages, out=out)
            return
        packed = out.view(len(pages), geo.layers, 2, geo.page_size, geo.heads, geo.head_dim)
        for j, page in enumerate(pages):
            packed[j].copy_(geo.flat_to_packed(page))

    def kv_set_flat(self, geo: _KvGeometry, prefixes: List[str],
                    values: List[torch.Tensor]) -> Tuple[List[bool], int, int]:
        s, conn, arena = self._kv(geo)
        t0 = time.perf_counter()
        pages = [geo.flat_page(v) for v in values]
        ok, counts = self._put_staged(
            s, conn, arena.id, prefixes, geo.plain_bytes, "KV set",
            lambda sid, idx: self._flat_entries(geo, sid, [prefixes[j] for j in idx],
                                                arena.header_slot_id),
            lambda area, idx: self._stage_flat(geo, area, [pages[j] for j in idx]))
        created, existing, failed, nbytes, copied, trips = counts
        seconds = time.perf_counter() - t0
        self.metrics.add(kv_puts=created, kv_existing=existing, kv_put_failures=failed,
                         bytes_written=nbytes, bytes_copied=copied, set_seconds=seconds,
                         round_trips=trips)
        return ok, created, nbytes

    def kv_get_flat(self, geo: _KvGeometry, prefixes: List[str],
                    targets: List[torch.Tensor]) -> Tuple[int, int]:
        """Reads the pages into the flat ``targets``; returns the leading run read and its
        bytes."""
        s, conn, arena = self._kv(geo)
        t0 = time.perf_counter()
        outs = [geo.flat_page(t) for t in targets]
        for t, o in zip(targets, outs):
            if not t.is_contiguous() or o.data_ptr() != t.data_ptr():
                raise ValueError("a flat target page that is not one contiguous tensor")
        n, each = len(prefixes), geo.plain_bytes
        hits = trips = 0
        for a, b in _spans(n, each, conn, s.staging.fit(each, n)):
            m = b - a
            sid, area = s.staging.get(conn, m * each)
            got = conn.get_snapshots(arena.id, self._flat_entries(geo, sid, prefixes[a:b], None),
                                     True)
            trips += _requests(b - a, conn)
            h = _leading(got.results, True)
            staged = area[:m * each].view(geo.torch_dtype).view(m, -1)
            for j in range(h):
                if geo.strided:
                    outs[a + j].copy_(staged[j])
                else:
                    geo.flat_to_packed(outs[a + j]).copy_(
                        staged[j].view(geo.layers, 2, geo.page_size, geo.heads, geo.head_dim))
            hits += h
            if h < m:
                self._get_failures(s, "KV get", got.results[h:])
                break
        seconds = time.perf_counter() - t0
        self.metrics.add(kv_hits=hits, kv_misses=n - hits, bytes_read=hits * each,
                         bytes_copied=hits * each, get_seconds=seconds, round_trips=trips)
        self._done()
        return hits, hits * each

    # -- MAMBA pages (states) at host slots (batch_get_v2 / batch_set_v2) -----------------

    def _shared_state_ids(self, s: _Session, geo: _MambaGeometry) -> Optional[Tuple[int, int]]:
        t = s.memory_id(geo.shared_temporal, "SGLang host state pool (recurrent)", self.reporter)
        c = s.memory_id(geo.shared_conv, "SGLang host state pool (conv)", self.reporter)
        return None if t is None or c is None else (t, c)

    def _staged_states(self, geo: _MambaGeometry, sid: int, prefixes: Sequence[str],
                       put: bool) -> list:
        m, dt, tb, cb = len(prefixes), geo.staged_dtype, geo.temporal_bytes, geo.conv_bytes
        c0 = geo.conv_area_offset(m)
        ranges = [_StateRange(sid, j * tb, dt, True, sid, c0 + j * cb) for j in range(m)]
        if put:
            return [_Put(p, 0, r) for p, r in zip(prefixes, ranges)]
        return [_Get(p, 0, r) for p, r in zip(prefixes, ranges)]

    def state_get(self, geo: _MambaGeometry, prefixes: List[str],
                  slots: List[int]) -> Tuple[int, int]:
        """Reads the states into the host slots; returns the leading run read and its
        bytes."""
        geo.check_slots(slots)
        s, conn, arena = self._state(geo)
        t0 = time.perf_counter()
        n, each = len(prefixes), geo.entry_bytes
        ids = self._shared_state_ids(s, geo)
        hits = trips = copied = 0
        if ids is not None:
            mt, mc = ids
            dt, tb, cb = geo.staged_dtype, geo.temporal_bytes, geo.conv_bytes
            t0b, c0b = geo.shared_temporal.offset, geo.shared_conv.offset
            entries = [_Get(p, 0, _StateRange(mt, t0b + i * tb, dt, True, mc, c0b + i * cb))
                       for p, i in zip(prefixes, slots)]
            hits, trips = self._get_run(s, conn, arena.id, entries, each, False, "state get")
        else:
            for a, b in _spans(n, each, conn, s.staging.fit(each, n)):
                m = b - a
                sid, area = s.staging.get(conn, geo.staged_bytes(m))
                got = conn.get_snapshots(arena.id,
                                         self._staged_states(geo, sid, prefixes[a:b], False),
                                         True)
                trips += _requests(b - a, conn)
                h = _leading(got.results, False)
                geo.unstage(area, slots[a:a + h], m)
                hits += h
                copied += h * each
                if h < m:
                    self._get_failures(s, "state get", got.results[h:])
                    break
        seconds = time.perf_counter() - t0
        self.metrics.add(state_hits=hits, state_misses=n - hits, bytes_read=hits * each,
                         bytes_copied=copied, get_seconds=seconds, round_trips=trips)
        self._done()
        return hits, hits * each

    def state_set(self, geo: _MambaGeometry, prefixes: List[str],
                  slots: List[int]) -> Tuple[List[bool], int, int]:
        geo.check_slots(slots)
        s, conn, arena = self._state(geo)
        t0 = time.perf_counter()
        each = geo.entry_bytes
        ids = self._shared_state_ids(s, geo)
        if ids is not None:
            mt, mc = ids
            dt, tb, cb = geo.staged_dtype, geo.temporal_bytes, geo.conv_bytes
            t0b, c0b = geo.shared_temporal.offset, geo.shared_conv.offset
            entries = [_Put(p, 0, _StateRange(mt, t0b + i * tb, dt, True, mc, c0b + i * cb))
                       for p, i in zip(prefixes, slots)]
            ok, counts = self._put_all(s, conn, arena.id, entries, each, "state set")
        else:
            ok, counts = self._put_staged(
                s, conn, arena.id, prefixes, each, "state set",
                lambda sid, idx: self._staged_states(geo, sid, [prefixes[j] for j in idx], True),
                lambda area, idx: geo.stage(area, [slots[j] for j in idx]), geo.staged_bytes)
        created, existing, failed, nbytes, copied, trips = counts
        seconds = time.perf_counter() - t0
        self.metrics.add(state_puts=created, state_existing=existing, state_put_failures=failed,
                         bytes_written=nbytes, bytes_copied=copied, set_seconds=seconds,
                         round_trips=trips)
        return ok, created, nbytes
