"""Connections to the daemon and what each sets up there (private to statepool.vllm).

Each thread that talks to the daemon (vLLM's scheduler thread, which runs the manager; each
worker's transfer thread) has a ``Session`` of its own (``threading.local``): a connection, the
arenas opened on it, the slot holding the KV entries' header and a staging buffer. A session
that loses its connection drops all of it and connects again on a later call, at most once per
``retry_interval`` (the scheduler's sessions back off further while failures go on: a hung
daemon costs the scheduler one ``lookup_timeout`` per back-off period, not one per step). The
per-thread sessions, the reconnection and back-off, the failure kinds and their reporting
(``Reporter``: the first failure of a kind logged once, whatever the thread, and its recovery;
``Down``: no connection now) are ``_daemon_link``'s, shared with statepool.sglang; this module
adds what a vLLM session sets up. ``lookup_columns`` asks about several arenas' keys in one
request.
"""

from __future__ import annotations

import hashlib
from typing import Dict, List, Optional, Sequence, Tuple

import torch

import statepool

from . import _daemon_link as link
from ._vllm_geometry import FORMAT, KvGroup, StateGroup
from ._vllm_settings import Settings

# The header that is the state of every KV entry: float32 values, each an integer below 2^16.
_MAGIC = 0x5356  # "SV"
_KIND_KV = 1
_HEADER_KEY_DIM = 16
# An entry's KV blocks take pages of about 1/_PAGES_PER_ENTRY of their encoded size.
_PAGES_PER_ENTRY = 32


def _header_words() -> List[float]:
    digest = hashlib.sha256(b"statepool.vllm kv entry").digest()
    return [float(_MAGIC), float(FORMAT), float(_KIND_KV)] + [
        float(int.from_bytes(digest[2 * i:2 * i + 2], "little")) for i in range(4)]


class Session(link.Session):
    """One thread's connection and what is set up on it; dropped whole when it is lost."""

    def __init__(self, settings: Settings):
        super().__init__(settings.staging_mib * 2**20)
        self.settings = settings
        self._state_arenas: Dict[str, int] = {}
        self._kv_arena: Optional[Tuple[int, int]] = None
        self._header_slot: Optional[statepool.Slot] = None

    def state_arena(self, group: StateGroup) -> int:
        """The id of this tenant's arena of the group's layout (opened at first use)."""
        arena_id = self._state_arenas.get(group.layout_key)
        if arena_id is None:
            conn = self.connection
            info = conn.register_layout(group.layout)
            arena = conn.open_arena(info, self.settings.state_arena_pages)
            arena_id = arena.id
            arena.close()  # only its id is used: no mapping of it kept in this process
            self._state_arenas[group.layout_key] = arena_id
        return arena_id

    def kv_arena(self, groups: Sequence[KvGroup]) -> Tuple[int, int]:
        """(arena id, header slot id) of the arena whose hybrid entries hold the KV blocks:
        an arena of a tiny layout, every entry's state the same header, copied by the daemon
        from a slot of this connection."""
        if self._kv_arena is None:
            conn = self.connection
            encoded = max((g.blocks.encoded_bytes for g in groups), default=0)
            value_dim = 16
            while (value_dim < 4096
                   and _HEADER_KEY_DIM * value_dim * 4 * _PAGES_PER_ENTRY < encoded):
                value_dim *= 2
            layout = statepool.StateLayout(arch=statepool.Arch.gdn, num_layers=1, num_heads=1,
                                           key_dim=_HEADER_KEY_DIM, value_dim=value_dim,
                                           codec=statepool.CodecId.fp32, name="vllm-kv")
            info = conn.register_layout(layout)
            pages = max(4, self.settings.kv_arena_mib * 2**20 // info.page_bytes)
            arena = conn.open_arena(info, pages)
            slot = conn.allocate(arena, 1)[0]
            words = _header_words()
            with conn.open_staging(info.state_bytes_f32) as staging:
                view = torch.from_dlpack(staging.view("float32", (info.state_bytes_f32 // 4,), 0))
                view.zero_()
                view[:len(words)] = torch.tensor(words, dtype=torch.float32)
                del view
                conn.compress(slot, staging, 0, statepool.DType.f32)
            self._kv_arena = (arena.id, slot.id)
            self._header_slot = slot  # freed with the connection
            arena.close()
        return self._kv_arena

    def drop_resources(self) -> None:
        self._state_arenas = {}
        self._kv_arena = None
        self._header_slot = None
        super().drop_resources()


class Sessions(link.Sessions):
    """The sessions of one manager or worker, one per calling thread."""

    integration = "statepool.vllm"

    def _new_session(self) -> Session:
        return Session(self.settings)


_ABSENT = statepool.SnapshotTier.none


def lookup_columns(conn: statepool.Connection, columns: Sequence[Tuple[int, List[str]]],
                   lower_tiers: bool) -> Tuple[List[List[bool]], int]:
    """Which keys of each column (an arena id and prefixes) have a snapshot for the arena's
    layout, from the daemon's indexes; the longest column asks and the others ride along
    (LookupSnapshots' ``also``): one request while every key fits the daemon's key cap.
    Returns the answers per column and the requests sent."""
    present: List[List[bool]] = [[] for _ in columns]
    asked = [i for i, (_, prefixes) in enumerate(columns) if prefixes]
    if not asked:
        return present, 0
    total = sum(len(columns[i][1]) for i in asked)
    cap = conn.max_batch_keys or total
    if total <= cap:
        asked.sort(key=lambda i: -len(columns[i][1]))
        first = asked[0]
        also = [(columns[i][0], columns[i][1], 0) for i in asked[1:]]
        found = conn.lookup_snapshots(columns[first][0], columns[first][1], 0, lower_tiers,
                                      False, also)
        present[first] = [t != _ABSENT for t in found.found]
        for i, tiers in zip(asked[1:], found.also):
            present[i] = [t != _ABSENT for t in tiers]
        return present, 1
    requests = 0
    for i in asked:  # the client splits each column by the key cap itself
        arena_id, prefixes = columns[i]
        found = conn.lookup_snapshots(arena_id, prefixes, 0, lower_tiers, False)
        present[i] = [t != _ABSENT for t in found.found]
        requests += -(-len(prefixes) // cap)
    return present, requests
