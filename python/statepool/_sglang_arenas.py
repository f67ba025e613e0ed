"""What one connection of the backend sets up in the daemon (private to statepool.sglang).

``_KvArena``: the arena of a tiny layout whose hybrid snapshots hold the KV pages; every entry's
state is the same small header (magic, format version, digest of the KV geometry), written once
into a slot of this connection and copied by the daemon into each entry (``SnapshotPutEntry(
slot=...)``), so that a get reads only the KV range. ``_StateArena``: the arena of the model's
state layout. ``register_region``: a memory file of SGLang's lent to the daemon. (The staging
buffer of the one-copy path is ``_daemon_link.StagingArea``.)
"""

from __future__ import annotations

import hashlib
from typing import List

import torch

import statepool

from ._sglang_pools import _KvGeometry, _MambaGeometry
from ._sglang_settings import Settings
from ._sglang_shm import SharedRegion

# The header that is the state of every KV entry: float32 values, each an integer below 2^16
# (exact in fp32, never NaN/Inf).
_MAGIC = 0x5350  # "SP"
_KIND_KV = 1
_HEADER_KEY_DIM = 16
# An entry's KV blocks take pages of about 1/_PAGES_PER_ENTRY of their encoded size (at
# least 1 KiB): little waste beside them, and a header page the daemon copies cheaply.
_PAGES_PER_ENTRY = 32


def _digest_words(text: str) -> List[int]:
    d = hashlib.sha256(text.encode()).digest()
    return [int.from_bytes(d[2 * i:2 * i + 2], "little") for i in range(8)]


def header_words(geometry: str, version: int) -> List[float]:
    return [float(w) for w in [_MAGIC, version, _KIND_KV] + _digest_words(geometry)]


class _KvArena:
    """The KV entries' arena on one connection, and the slot holding their header."""

    def __init__(self, conn: statepool.Connection, kv: _KvGeometry, settings: Settings,
                 version: int):
        value_dim = 16
        while (value_dim < 4096
               and _HEADER_KEY_DIM * value_dim * 4 * _PAGES_PER_ENTRY < kv.encoded_bytes):
            value_dim *= 2
        self.layout = statepool.StateLayout(arch=statepool.Arch.gdn, num_layers=1, num_heads=1,
                                            key_dim=_HEADER_KEY_DIM, value_dim=value_dim,
                                            codec=statepool.CodecId.fp32, name="sglang-kv")
        info = conn.register_layout(self.layout)
        arena = conn.open_arena(info, max(4, settings.kv_arena_mib * 2**20 // info.page_bytes))
        self.id = arena.id
        self.header_slot = conn.allocate(arena, 1)[0]
        self.header_slot_id = self.header_slot.id
        words = header_words(kv.name, version)
        with conn.open_staging(info.state_bytes_f32) as staging:
            view = torch.from_dlpack(staging.view("float32", (info.state_bytes_f32 // 4,), 0))
            view.zero_()
            view[:len(words)] = torch.tensor(words, dtype=torch.float32)
            del view
            conn.compress(self.header_slot, staging, 0, statepool.DType.f32)
        arena.close()  # only its id is used: no mapping of it kept in this process


class _StateArena:
    """The state arena of the model's layout on one connection."""

    def __init__(self, conn: statepool.Connection, geo: _MambaGeometry, settings: Settings):
        info = conn.register_layout(geo.layout)
        arena = conn.open_arena(info, settings.state_arena_pages)
        self.id = arena.id
        arena.close()  # only its id is used: no mapping of it kept in this process


def register_region(conn: statepool.Connection, region: SharedRegion,
                    name: str) -> statepool.Staging:
    """Lends the daemon SGLang's memory file of ``region`` (all of it) on this connection."""
    staging, _sealed = conn.register_memory(region.fd, region.file_bytes, name)
    return staging
