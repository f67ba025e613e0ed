"""The arenas of one connection (private to statepool.sglang), and the header format.

``_SmallArena``: the arena of a tiny layout whose snapshots' state is the header defined here
(magic, format version, kind, digest of the geometry); it holds the KV entries (header + KV
blocks) and the state markers. ``_StateArena``: the arena of the model's state layout. Each
comes with its staging buffer and the tensor views of it that the page copies use.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, List, Optional

import torch

import statepool

from ._sglang_pools import _KvGeometry, _MambaGeometry

if TYPE_CHECKING:
    from .sglang import Settings


# The header that is the state of every small-arena snapshot (KV entries and state markers):
# float32 values, each an integer below 2^16 (exact in fp32, never NaN/Inf). The format
# version is statepool.sglang._FORMAT, passed in by the backend.
_MAGIC = 0x5350  # "SP"
_KIND_KV = 1
_KIND_STATE_MARKER = 2
_HEADER_WORDS = 3 + 8
_SMALL_KEY_DIM = 16


def _digest_words(text: str) -> List[int]:
    d = hashlib.sha256(text.encode()).digest()
    return [int.from_bytes(d[2 * i:2 * i + 2], "little") for i in range(8)]


def _header(kind: int, geometry: str, version: int) -> List[float]:
    words = [_MAGIC, version, kind] + _digest_words(geometry)
    return [float(w) for w in words]


def _tensor(view: statepool.View) -> torch.Tensor:
    return torch.from_dlpack(view)


class _SmallArena:
    """The arena of the tiny header layout: KV entries (header + KV blocks) and state markers."""

    def __init__(self, conn: statepool.Connection, kv: Optional[_KvGeometry], settings: Settings,
                 version: int):
        # Page size: about 1/16 of an encoded KV page, so an entry wastes little beside its
        # KV pages, and at least 1 KiB (the header).
        value_dim = 16
        if kv is not None:
            while value_dim < 4096 and _SMALL_KEY_DIM * value_dim * 4 * 16 < kv.encoded_bytes:
                value_dim *= 2
        self.layout = statepool.StateLayout(arch=statepool.Arch.gdn, num_layers=1, num_heads=1,
                                            key_dim=_SMALL_KEY_DIM, value_dim=value_dim,
                                            codec=statepool.CodecId.fp32, name="sglang-kv")
        self.info = conn.register_layout(self.layout)
        page = self.info.page_bytes
        self.arena = conn.open_arena(self.info, max(4, settings.kv_arena_mib * 2**20 // page))
        self.header_bytes = self.info.state_bytes_f32
        self.kv_offset = (self.header_bytes + 63) // 64 * 64
        kv_bytes = kv.plain_bytes if kv is not None else 0
        self.staging = conn.open_staging(self.kv_offset + kv_bytes)
        words = self.header_bytes // 4
        self.header_out = torch.zeros(words, dtype=torch.float32)
        self.header_in = _tensor(self.staging.view("float32", (words,), 0))
        self.kv_stage = None
        if kv is not None:
            view = self.staging.view(str(kv.torch_dtype).replace("torch.", ""),
                                     (kv.layers, 2, kv.page_size, kv.heads * kv.head_dim),
                                     self.kv_offset)
            self.kv_stage = _tensor(view)
        slots = conn.allocate(self.arena, 3)
        self.kv_slot, self.marker_slot, self.get_slot = slots
        self.kv_header: Optional[torch.Tensor] = None
        self.marker_header: Optional[torch.Tensor] = None
        if kv is not None:
            self.kv_header = self._write_header(conn, self.kv_slot, _KIND_KV, kv.name, version)

    def _write_header(self, conn, slot, kind: int, geometry: str, version: int) -> torch.Tensor:
        words = torch.zeros_like(self.header_out)
        h = _header(kind, geometry, version)
        words[:len(h)] = torch.tensor(h, dtype=torch.float32)
        self.header_in.copy_(words)
        conn.compress(slot, self.staging, 0, statepool.DType.f32)
        return words

    def set_marker(self, conn, geometry: str, version: int) -> None:
        self.marker_header = self._write_header(conn, self.marker_slot, _KIND_STATE_MARKER,
                                                geometry, version)

    def header_matches(self, expected: torch.Tensor) -> bool:
        self.arena.decode(self.get_slot, self.header_out, statepool.DType.f32)
        return bool(torch.equal(self.header_out, expected))


class _StateArena:
    def __init__(self, conn: statepool.Connection, geo: _MambaGeometry, settings: Settings):
        self.info = conn.register_layout(geo.layout)
        self.arena = conn.open_arena(self.info, settings.state_arena_pages)
        self.staging = conn.open_staging(self.info.state_bytes(geo.staged_dtype))
        L, H, K, V = geo.layers, geo.heads, geo.cols, geo.rows
        dname = str(geo.torch_dtype).replace("torch.", "")
        self.recurrent = _tensor(self.staging.view(dname, (L, H, K, V), 0))
        conv_at = L * H * K * V * geo.torch_dtype.itemsize
        self.conv = _tensor(self.staging.view(str(geo.conv_torch_dtype).replace("torch.", ""),
                                              (L, geo.conv_channels, geo.conv_width), conv_at))
        self.put_slot, self.get_slot = conn.allocate(self.arena, 2)

