"""The scheduler side of statepool's vLLM offloading spec (private to statepool.vllm).

vLLM's offloading scheduler asks the manager about one block key at a time
(``lookup``), in bursts per request and step. The manager answers each burst from one daemon
request: at a request's first lookup in a step it asks about every key of the request from that
key's position on (the positions vLLM records in the request's context: the keys its prefix and
suffix lookups of the step will ask about), for every tensor-parallel rank, answered from the
daemon's indexes (pool, host tier, Redis; nothing is read), and keeps the answers in the
request's context until the step ends (``on_schedule_end``). A key is a hit when every rank's
entry is there.

What to store and load needs no round trip: ``prepare_store`` hands the workers the keys not
being stored already, ``prepare_load`` the keys; both as ``StatepoolKeys``. The daemon keeps its
own LRU order and evicts what it must; nothing here pins entries (a load whose entry was evicted
in between fails, and vLLM recomputes the request). A dead or hung daemon makes lookups miss
(one warning); the scheduler never sees an exception.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable
from typing import Dict, List, Optional, Sequence, Set, Tuple

from vllm.v1.kv_offload.base import (
    LookupResult,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    get_offload_group_idx,
)

from ._daemon_link import CALL_KINDS, Reporter
from ._vllm_geometry import Geometry, StateGroup, StatepoolKeys
from ._vllm_metrics import Counters
from ._vllm_session import Sessions, lookup_columns


class _Answers:
    """One request's lookup answers of one scheduler step (kept in its ReqContext)."""

    __slots__ = ("step", "present")

    def __init__(self, step: int):
        self.step = step
        self.present: Dict[bytes, bool] = {}


def _request_keys(ctx: ReqContext, key: bytes) -> List[bytes]:
    """The request's keys vLLM has recorded (ReqContext's offload key positions, 0.32 and
    0.34), from ``key``'s position on, in position order; just ``key`` without them."""
    positions = getattr(ctx, "_offload_key_positions", None)
    if not isinstance(positions, dict) or key not in positions:
        return [key]
    start = positions[key]
    return [k for k, _ in sorted(((k, p) for k, p in positions.items() if p >= start),
                                 key=lambda kp: kp[1])]


class StatepoolOffloadingManager(OffloadingManager):
    """vLLM's OffloadingManager over statepool (module docstring)."""

    def __init__(self, geometries: Sequence[Geometry], sessions: Sessions, reporter: Reporter,
                 counters: Counters):
        self._geometries = list(geometries)  # one per tensor-parallel rank
        self._groups = geometries[0].groups   # every rank stores the same groups
        self._sessions = sessions
        self._reporter = reporter
        self._counters = counters
        self._step = 0
        self._storing: Set[bytes] = set()

    # -- lookups ------------------------------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        self._counters.add(lookups=1)
        if get_offload_group_idx(key) not in self._groups:
            return LookupResult.MISS
        answers = req_context.get_state(_Answers)
        if answers is None or answers.step != self._step:
            answers = _Answers(self._step)
            req_context.set_state(answers)
        hit = answers.present.get(key)
        if hit is None:
            keys = [k for k in _request_keys(req_context, key)
                    if k not in answers.present and get_offload_group_idx(k) in self._groups]
            if key not in keys:
                keys.append(key)
            answers.present.update(self._ask(keys))
            hit = answers.present[key]
        if hit:
            self._counters.add(lookup_hits=1)
            return LookupResult.HIT
        return LookupResult.MISS

    def _ask(self, keys: List[bytes]) -> Dict[bytes, bool]:
        """Whether every rank's entry of each key is in the store: one daemon request (or one
        per column over the daemon's key cap). A failure answers no."""
        t0 = time.perf_counter()
        try:
            s = self._sessions.current()
            conn = s.connection
            # one column per arena: its prefixes, and which key each one is
            columns: Dict[int, Tuple[List[str], List[int]]] = {}
            for geo in self._geometries:
                kv_groups = geo.kv_groups()
                for i, key in enumerate(keys):
                    group = geo.groups[get_offload_group_idx(key)]
                    arena = (s.state_arena(group) if isinstance(group, StateGroup)
                             else s.kv_arena(kv_groups)[0])
                    prefixes, owners = columns.setdefault(arena, ([], []))
                    prefixes.append(geo.prefix(key, group))
                    owners.append(i)
            arenas = list(columns)
            present, requests = lookup_columns(
                conn, [(a, columns[a][0]) for a in arenas], lower_tiers=True)
        except Exception as e:  # noqa: BLE001 - never into the scheduler
            self._sessions.fail("lookup", e)
            return {k: False for k in keys}
        hit = [True] * len(keys)
        for a, answers in zip(arenas, present):
            for i, there in zip(columns[a][1], answers):
                hit[i] = hit[i] and there
        self._counters.add(lookup_keys_sent=sum(len(c[0]) for c in columns.values()),
                           lookup_requests=requests, lookup_seconds=time.perf_counter() - t0)
        self._reporter.recovered(*CALL_KINDS)
        return dict(zip(keys, hit))

    def on_schedule_end(self, context) -> None:
        self._step += 1  # the next step asks the daemon again

    # -- loads and stores ---------------------------------------------------------------------

    def prepare_load(self, keys: Collection[OffloadKey],
                     req_context: ReqContext) -> StatepoolKeys:
        self._counters.add(load_keys=len(keys))
        return StatepoolKeys(list(keys))

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Nothing: the daemon's LRU order moves with the reads (vLLM 0.32 never calls it)."""

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Nothing to release: entries are not pinned for a load."""

    def prepare_store(self, keys: Collection[OffloadKey],
                      req_context: ReqContext) -> Optional[PrepareStoreOutput]:
        answers = req_context.get_state(_Answers)
        known = answers.present if answers is not None else {}
        todo = [k for k in keys
                if get_offload_group_idx(k) in self._groups and k not in self._storing
                and not known.get(k, False)]
        self._storing.update(todo)
        self._counters.add(store_keys=len(todo))
        return PrepareStoreOutput(keys_to_store=todo, store_spec=StatepoolKeys(todo),
                                  evicted_keys=[])

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext,
                       success: bool = True) -> None:
        # A failed store is a later miss: lookups ask the daemon, not this set.
        self._storing.difference_update(keys)

    # -- requests, events, housekeeping -------------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Nothing: a request's answers live in its context."""

    def take_events(self) -> Iterable[OffloadingEvent]:
        """None: the store is shared by every engine of the tenant and the daemon evicts on
        its own, so this engine cannot say truthfully which blocks statepool holds."""
        return ()

    def reset_cache(self) -> None:
        """vLLM's reset_prefix_cache(reset_connector=True): forgets the stores in flight and
        every request's answers. The entries stay: the store is shared (statepoolctl deletes
        them)."""
        self._storing.clear()
        self._step += 1

    def get_stats(self):
        return self._counters.vllm_stats()

    def stats(self) -> Dict[str, float]:
        """The counters (statepool.vllm.COUNTERS) since the manager was made."""
        return self._counters.snapshot()

    def shutdown(self) -> None:
        self._sessions.close_all()
