"""The host pools of SGLang as statepool sees them (private to statepool.sglang).

``_KvGeometry`` (an MHA host KV pool) and ``_MambaGeometry`` (a MambaPoolHost): the checks
that a pool can be stored (``_Unsupported`` says why not, at registration), the KV blocks or
state layout of its pages, the name that keys its snapshots, where its pages lie in bytes (the
ranges the daemon reads and writes), and which path moves them: **zero copy** when the pool is
in memory files the daemon can map (SGLang's ``"allocator": "shm"``), else **one copy**
through a staging buffer, in the staging order this module defines.
"""

from __future__ import annotations

import hashlib
from typing import Any, List, Optional, Tuple

import torch

import statepool

from ._sglang_settings import Settings
from ._sglang_shm import SharedRegion, shared_region

_TORCH_TO_DTYPE = {
    torch.float32: statepool.DType.f32,
    torch.bfloat16: statepool.DType.bf16,
    torch.float16: statepool.DType.f16,
}

# What the log says about a pool in private memory.
_SHM_HINT = ('add "allocator": "shm" to --hicache-storage-backend-extra-config for zero copy')


class _Unsupported(Exception):
    """A pool this backend cannot store (reported at registration; its pages then miss)."""


class _KvGeometry:
    """An SGLang MHA host KV pool: per page, K and V of every layer for ``page_size`` tokens.

    Byte addressing (``s`` the element size, ``HD`` heads x head size, ``i`` a page's first
    host index): the pool is ``kv_buffer`` with K in its first half and V in its second; the
    key row of layer ``l``, token ``t`` of the page is at ``i * index_bytes + l * layer_stride
    + t * token_stride`` from the start of K (``page_first`` [2][size][L][HD],
    ``page_first_direct`` [2][pages][L][ps][HD], ``layer_first`` [2][L][size][HD]).
    ``page_head`` [2][pages][H][ps][L][D] has no such strides (a row's heads are apart): it is
    copied through staging in statepool's packed order.
    """

    _LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")

    def __init__(self, pool: Any, kv_codec: statepool.KvCodec, settings: Settings):
        layout = getattr(pool, "layout", None)
        if layout == "page_unified":
            raise _Unsupported(
                "host KV layout 'page_unified' is not stored: SGLang 0.5.23 cannot select it "
                "(not a --hicache-mem-layout choice, and its own load and backup raise for it)")
        if layout == "page_first_kv_split":
            raise _Unsupported("host KV layout 'page_first_kv_split' belongs to MLA pools (SGLang "
                               "maps it to page_first_direct for MHA and hybrid models)")
        for attr in ("kv_buffer", "layer_num", "head_num", "head_dim", "page_size", "layout",
                     "dtype", "size"):
            if not hasattr(pool, attr):
                raise _Unsupported(f"host KV pool {type(pool).__name__} has no {attr} "
                                   "(only MHA-style pools are stored)")
        if layout not in self._LAYOUTS:
            raise _Unsupported(f"host KV layout {layout!r} (stored: {', '.join(self._LAYOUTS)})")
        if getattr(pool, "v_head_dim", pool.head_dim) != pool.head_dim:
            raise _Unsupported("host KV pool with a value head size unlike the key head size")
        if pool.dtype not in _TORCH_TO_DTYPE:
            raise _Unsupported(f"host KV dtype {pool.dtype} (f32, bf16 and f16 are stored)")
        buf = pool.kv_buffer
        if not isinstance(buf, torch.Tensor) or buf.device.type != "cpu":
            raise _Unsupported("host KV pool not one tensor in CPU memory")
        self.pool = pool
        self.layers = L = int(pool.layer_num)
        self.heads = int(pool.head_num)
        self.head_dim = int(pool.head_dim)
        self.page_size = ps = int(pool.page_size)
        self.size = int(pool.size)
        self.layout = layout
        self.torch_dtype = pool.dtype
        self.dtype = _TORCH_TO_DTYPE[pool.dtype]
        self.channels = HD = self.heads * self.head_dim
        s = pool.dtype.itemsize
        expected = {"layer_first": (2, L, self.size, self.heads, self.head_dim),
                    "page_first": (2, self.size, L, self.heads, self.head_dim),
                    "page_first_direct": (2, self.size // ps, L, ps, self.heads, self.head_dim),
                    "page_head": (2, self.size // ps, self.heads, ps, L, self.head_dim)}[layout]
        if tuple(buf.shape) != expected or not buf.is_contiguous():
            raise _Unsupported(f"host KV buffer of shape {tuple(buf.shape)}, not the "
                               f"{layout} shape {expected}")
        self.blocks = statepool.KvBlocks(codec=kv_codec, layers=L, key_channels=HD,
                                         value_channels=HD, tokens=ps)
        self.plain_bytes = self.blocks.plain_bytes(self.dtype)
        self.encoded_bytes = self.blocks.encoded_bytes
        self.name = (f"kv:{L}x{self.heads}x{self.head_dim}:page{ps}:{self.torch_dtype}:"
                     f"{kv_codec.name}")
        # Entries of another geometry or codec live under other keys.
        self.kind = "kv-" + hashlib.sha256(self.name.encode()).hexdigest()[:8]
        self.half_bytes = buf.numel() * s // 2
        # The strides of the pool and of its flat data pages (get_data_page order), in bytes.
        row = HD * s
        self.strided = layout != "page_head"
        self.index_bytes = {"layer_first": row, "page_first": L * row,
                            "page_first_direct": L * row, "page_head": L * row}[layout]
        self.layer_stride = {"layer_first": self.size * row, "page_first": row,
                             "page_first_direct": ps * row, "page_head": 0}[layout]
        self.token_stride = {"layer_first": row, "page_first": L * row,
                             "page_first_direct": row, "page_head": 0}[layout]
        self.flat_layer_stride = row if layout == "page_first" else ps * row
        self.flat_token_stride = L * row if layout == "page_first" else row
        # Zero copy: the daemon reads and writes the pool's file in place.
        self.shared: Optional[SharedRegion] = None
        if not settings.zero_copy:
            self.path = "one copy: zero_copy is off in the extra config"
        elif not self.strided:
            self.path = ("one copy: the page_head layout keeps a token's heads apart, which the "
                         "daemon cannot address; page_first or page_first_direct are zero copy")
        else:
            region = shared_region(pool, buf)
            if isinstance(region, SharedRegion):
                self.shared = region
                self.path = ("zero copy: the host KV pool is SGLang shared memory "
                             "(allocator shm), read and written in place by the daemon")
            else:
                self.path = f"one copy: the host KV pool is {region}; {_SHM_HINT}"

    # -- the one-copy path: pages in a staging buffer --------------------------------------
    # Strided layouts are staged in the pool's own order for n pages (one index_select per
    # batch); page_head in statepool's packed order [L][K, V][ps][HD] (one copy per page).

    def _pool_view(self) -> Tuple[torch.Tensor, int, bool]:
        """The pool as [2][...][HD], the axis its pages or tokens are on, and whether that
        axis counts pages (True) or tokens (False)."""
        buf, L, HD = self.pool.kv_buffer, self.layers, self.channels
        if self.layout == "layer_first":
            return buf.view(2, L, self.size, HD), 2, False
        if self.layout == "page_first":
            return buf.view(2, self.size, L, HD), 1, False
        return buf.view(2, self.size // self.page_size, L, self.page_size, HD), 1, True

    def _staged_view(self, area: torch.Tensor, n: int) -> torch.Tensor:
        L, ps, HD = self.layers, self.page_size, self.channels
        t = area[:n * self.plain_bytes].view(self.torch_dtype)
        if self.layout == "layer_first":
            return t.view(2, L, n * ps, HD)
        if self.layout == "page_first":
            return t.view(2, n * ps, L, HD)
        if self.layout == "page_first_direct":
            return t.view(2, n, L, ps, HD)
        return t.view(n, L, 2, ps, self.heads, self.head_dim)  # page_head: packed

    def staged_strides(self, n: int) -> Tuple[int, int, int]:
        """(value offset, layer stride, token stride) of n pages staged by stage()."""
        if not self.strided:
            return 0, 0, 0
        layer = (n * self.page_size * self.channels * self.torch_dtype.itemsize
                 if self.layout == "layer_first" else self.layer_stride)
        return n * self.plain_bytes // 2, layer, self.token_stride

    def stage(self, area: torch.Tensor, starts: List[int]) -> None:
        """Copies the pages that start at host indices ``starts`` into ``area`` (uint8)."""
        n = len(starts)
        out = self._staged_view(area, n)
        if not self.strided:
            buf, ps = self.pool.kv_buffer, self.page_size
            for j, i in enumerate(starts):
                out[j].copy_(buf[:, i // ps].permute(3, 0, 2, 1, 4))
            return
        view, axis, by_page = self._pool_view()
        torch.index_select(view, axis, self._index(starts, by_page), out=out)

    def unstage(self, area: torch.Tensor, starts: List[int], n: int) -> None:
        """Copies the first len(starts) of n pages staged in ``area`` into the pool."""
        staged = self._staged_view(area, n)
        h = len(starts)
        if not self.strided:
            buf, ps = self.pool.kv_buffer, self.page_size
            for j, i in enumerate(starts):
                buf[:, i // ps].permute(3, 0, 2, 1, 4).copy_(staged[j])
            return
        view, axis, by_page = self._pool_view()
        if self.layout == "layer_first":
            view.index_copy_(axis, self._index(starts, False),
                             staged.narrow(axis, 0, h * self.page_size))
            return
        # page_first(_direct): a run of consecutive pages is one contiguous block per half,
        # copied as such (index_copy_ is several times slower here)
        ps = self.page_size
        unit = 1 if by_page else ps
        j = 0
        while j < h:
            k = j + 1
            while k < h and starts[k] == starts[k - 1] + ps:
                k += 1
            at = (starts[j] // ps) * unit if by_page else starts[j]
            for half in (0, 1):
                view[half].narrow(0, at, (k - j) * unit).copy_(
                    staged[half].narrow(0, j * unit, (k - j) * unit))
            j = k

    def _index(self, starts: List[int], by_page: bool) -> torch.Tensor:
        ps = self.page_size
        if by_page:
            return torch.tensor([i // ps for i in starts], dtype=torch.int64)
        first = torch.tensor(starts, dtype=torch.int64).unsqueeze(1)
        return (first + torch.arange(ps, dtype=torch.int64)).reshape(-1)

    # -- flat data pages (SGLang's generic path): a page in get_data_page() order ----------

    def flat_page(self, flat: Optional[torch.Tensor]) -> torch.Tensor:
        """``flat`` as a 1-D tensor of the pool's dtype, checked to be one page."""
        if flat is None or flat.numel() * flat.element_size() != self.plain_bytes:
            raise _Unsupported(f"a data page of {0 if flat is None else flat.numel()} values, "
                               "not one page of the host KV pool")
        flat = flat.reshape(-1)
        return flat if flat.dtype == self.torch_dtype else flat.view(self.torch_dtype)

    def flat_to_packed(self, flat: torch.Tensor) -> torch.Tensor:
        """A page_head flat page [2][1][H][ps][L][D] as statepool's packed [L][2][ps][H][D]
        order (a view)."""
        return flat.view(2, self.heads, self.page_size, self.layers,
                         self.head_dim).permute(3, 0, 2, 1, 4)


class _MambaGeometry:
    """An SGLang MambaPoolHost: per slot, the recurrent state [L][1][H][V][K] (each head
    [value][key] for the gated delta rule and KDA) and one conv state [L][1][C][W]; statepool's
    state layout is [L][H][K][V] with the conv state [L][C][W], and the daemon reads the
    engine's value-major heads directly (``StateRange(value_major=True)``). A slot's temporal
    bytes are at ``slot * temporal_bytes`` of the temporal tensor, its conv bytes at
    ``slot * conv_bytes`` of the conv tensor."""

    def __init__(self, pool: Any, settings: Settings):
        for attr in ("temporal_buffer", "conv_buffer", "layout"):
            if not hasattr(pool, attr):
                raise _Unsupported(f"host state pool {type(pool).__name__} has no {attr}")
        if pool.layout not in ("page_first", "page_first_direct"):
            raise _Unsupported(f"host state layout {pool.layout!r}")
        convs = list(pool.conv_buffer)
        if len(convs) != 1:
            raise _Unsupported(f"{len(convs)} conv states per layer (a conv-only model such as "
                               "ZAYA1 or Inkling?); statepool stores a recurrent state and one "
                               "conv state")
        if getattr(pool, "slot_state_buffers", None):
            raise _Unsupported(f"{len(pool.slot_state_buffers)} side state(s) beside the "
                               "recurrent state (registered slot states); not stored")
        temporal = pool.temporal_buffer        # [slots, L, 1, H, V, K]
        conv = convs[0]                        # [slots, L, 1, C, W]
        if temporal.dim() != 6 or temporal.numel() == 0:
            raise _Unsupported(f"recurrent state of shape {tuple(temporal.shape)} (empty or not "
                               "[slots, layers, 1, heads, value, key])")
        if conv.dim() != 5:
            raise _Unsupported(f"conv state of shape {tuple(conv.shape)}")
        if temporal.device.type != "cpu" or conv.device.type != "cpu":
            raise _Unsupported("host state pool not in CPU memory")
        if not temporal.is_contiguous() or not conv.is_contiguous():
            raise _Unsupported("host state buffers not contiguous")
        if temporal.dtype not in (torch.float32, torch.bfloat16):
            raise _Unsupported(f"recurrent state dtype {temporal.dtype} (f32 and bf16 are stored)")
        if conv.dtype not in _TORCH_TO_DTYPE:
            raise _Unsupported(f"conv state dtype {conv.dtype}")
        if conv.shape[0] != temporal.shape[0]:
            raise _Unsupported("conv and recurrent buffers of different slot counts")
        self.pool = pool
        self.slots = int(temporal.shape[0])
        self.layers = int(temporal.shape[1])
        self.heads, self.rows, self.cols = (int(x) for x in temporal.shape[3:])
        self.conv_channels, self.conv_width = int(conv.shape[3]), int(conv.shape[4])
        if self.conv_width > 64 and self.conv_channels <= 64:
            # KDA's [width, channels]: stored raw, so any split of the bytes works
            self.conv_channels, self.conv_width = self.conv_width, self.conv_channels
        self.staged_dtype = _TORCH_TO_DTYPE[temporal.dtype]
        self.torch_dtype = temporal.dtype
        self.conv_torch_dtype = conv.dtype
        self.temporal_bytes = self.layers * self.heads * self.rows * self.cols * \
            temporal.dtype.itemsize
        self.conv_bytes = self.layers * self.conv_channels * self.conv_width * conv.dtype.itemsize
        self.entry_bytes = self.temporal_bytes + self.conv_bytes
        codec = statepool.CodecId.__members__[settings.state_codec]
        base = statepool.StateLayout(
            arch=statepool.Arch.gdn, num_layers=self.layers, num_heads=self.heads,
            key_dim=self.cols, value_dim=self.rows, conv_channels=self.conv_channels,
            conv_width=self.conv_width, conv_dtype=_TORCH_TO_DTYPE[conv.dtype],
            codec=statepool.CodecId.fp32, name="sglang-state")
        plan = None
        if codec in (statepool.CodecId.stepquant6, statepool.CodecId.stepquant4):
            bits = 6 if codec == statepool.CodecId.stepquant6 else 4
            plan = (statepool.Plan.load(settings.state_plan) if settings.state_plan
                    else statepool.Plan.nominal(base, bits))
        self.layout = base.with_codec(codec, plan)
        self.name = (f"state:{self.layers}x{self.heads}x{self.rows}x{self.cols}:{temporal.dtype}:"
                     f"conv{self.conv_channels}x{self.conv_width}:{conv.dtype}:{codec.name}:"
                     f"{plan.digest if plan is not None else ''}")
        self.shared_temporal: Optional[SharedRegion] = None
        self.shared_conv: Optional[SharedRegion] = None
        if not settings.zero_copy:
            self.path = "one copy: zero_copy is off in the extra config"
        else:
            t, c = shared_region(pool, temporal), shared_region(pool, conv)
            if isinstance(t, SharedRegion) and isinstance(c, SharedRegion):
                self.shared_temporal, self.shared_conv = t, c
                self.path = ("zero copy: the host state pool is SGLang shared memory "
                             "(allocator shm), read and written in place by the daemon")
            else:
                self.path = (f"one copy: the host state pool is "
                             f"{t if isinstance(t, str) else c}; {_SHM_HINT}")

    def check_slots(self, slots: List[int]) -> None:
        if slots and (min(slots) < 0 or max(slots) >= self.slots):
            raise _Unsupported(f"a host slot outside the pool's {self.slots}")

    # -- the one-copy path: [n][temporal] then [n][conv] in a staging buffer -----------------

    def conv_area_offset(self, n: int) -> int:
        return (n * self.temporal_bytes + 63) // 64 * 64

    def staged_bytes(self, n: int) -> int:
        return self.conv_area_offset(n) + n * self.conv_bytes

    def _staged_views(self, area: torch.Tensor, n: int) -> Tuple[torch.Tensor, torch.Tensor]:
        at = self.conv_area_offset(n)
        t = area[:n * self.temporal_bytes].view(self.torch_dtype).view(n, -1)
        c = area[at:at + n * self.conv_bytes].view(self.conv_torch_dtype).view(n, -1)
        return t, c

    def _pool_views(self) -> Tuple[torch.Tensor, torch.Tensor]:
        return (self.pool.temporal_buffer.view(self.slots, -1),
                self.pool.conv_buffer[0].view(self.slots, -1))

    def stage(self, area: torch.Tensor, slots: List[int]) -> None:
        t, c = self._staged_views(area, len(slots))
        pt, pc = self._pool_views()
        for j, slot in enumerate(slots):  # a slot's bytes are one block: a copy each
            t[j].copy_(pt[slot])
            c[j].copy_(pc[slot])

    def unstage(self, area: torch.Tensor, slots: List[int], n: int) -> None:
        """Copies the first len(slots) of n staged states into those slots."""
        t, c = self._staged_views(area, n)
        pt, pc = self._pool_views()
        for j, slot in enumerate(slots):
            pt[slot].copy_(t[j])
            pc[slot].copy_(c[j])
