"""The host pools of SGLang as statepool sees them (private to statepool.sglang).

``_KvGeometry`` (an MHA host KV pool) and ``_MambaGeometry`` (a MambaPoolHost): the checks
that a pool can be stored, the statepool layout or KV blocks of its pages, the name that keys
its snapshots, and its pages and slots as tensor views in the layout statepool stages.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Tuple

import torch

import statepool

if TYPE_CHECKING:
    from .sglang import Settings


_TORCH_TO_DTYPE = {
    torch.float32: statepool.DType.f32,
    torch.bfloat16: statepool.DType.bf16,
    torch.float16: statepool.DType.f16,
}


class _Unsupported(Exception):
    """A pool this backend cannot store (reported once, the pool's calls then fail)."""


class _KvGeometry:
    """An SGLang MHA host KV pool: per page, K and V as [layers, page_size, heads, head_dim]."""

    def __init__(self, pool: Any, kv_codec: statepool.KvCodec):
        for attr in ("kv_buffer", "layer_num", "head_num", "head_dim", "page_size", "layout",
                     "dtype"):
            if not hasattr(pool, attr):
                raise _Unsupported(f"host KV pool {type(pool).__name__} has no {attr} "
                                   "(only MHA-style pools are stored)")
        if pool.layout not in ("layer_first", "page_first", "page_first_direct", "page_head"):
            raise _Unsupported(f"host KV layout {pool.layout!r}")
        if getattr(pool, "v_head_dim", pool.head_dim) != pool.head_dim:
            raise _Unsupported("host KV pool with a value head size unlike the key head size")
        if pool.dtype not in _TORCH_TO_DTYPE:
            raise _Unsupported(f"host KV dtype {pool.dtype} (f32, bf16 and f16 are stored)")
        if pool.kv_buffer is None or pool.kv_buffer.device.type != "cpu":
            raise _Unsupported("host KV pool not in CPU memory")
        self.pool = pool
        self.layers = int(pool.layer_num)
        self.heads = int(pool.head_num)
        self.head_dim = int(pool.head_dim)
        self.page_size = int(pool.page_size)
        self.layout = pool.layout
        self.torch_dtype = pool.dtype
        self.dtype = _TORCH_TO_DTYPE[pool.dtype]
        channels = self.heads * self.head_dim
        self.blocks = statepool.KvBlocks(codec=kv_codec, layers=self.layers,
                                         key_channels=channels, value_channels=channels,
                                         tokens=self.page_size)
        self.plain_bytes = self.blocks.plain_bytes(self.dtype)
        self.encoded_bytes = self.blocks.encoded_bytes
        self.name = (f"kv:{self.layers}x{self.heads}x{self.head_dim}:page{self.page_size}:"
                     f"{self.torch_dtype}:{kv_codec.name}")
        # Entries of another geometry or codec live under other keys (and the header says
        # which geometry an entry is, in case two ever meet under one key).
        self.kind = "kv-" + hashlib.sha256(self.name.encode()).hexdigest()[:8]

    def page_views(self, index: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """K and V of the page that starts at host token index ``index``: views of the pool."""
        buf, ps = self.pool.kv_buffer, self.page_size
        if self.layout == "layer_first":       # [2, L, size, H, D]
            page = buf[:, :, index:index + ps]
            return page[0], page[1]
        if self.layout == "page_first":        # [2, size, L, H, D]
            page = buf[:, index:index + ps]
            return page[0].transpose(0, 1), page[1].transpose(0, 1)
        page = buf[:, index // ps]
        if self.layout == "page_first_direct":  # [2, pages, L, ps, H, D]
            return page[0], page[1]
        # page_head: [2, pages, H, ps, L, D]
        return page[0].permute(2, 1, 0, 3), page[1].permute(2, 1, 0, 3)

    def flat_views(self, flat: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """K and V inside a flat data page in the order the pool's get_data_page() gives."""
        L, ps, H, D = self.layers, self.page_size, self.heads, self.head_dim
        if self.layout == "layer_first":
            page = flat.view(2, L, ps, H, D)
            return page[0], page[1]
        if self.layout == "page_first":
            page = flat.view(2, ps, L, H, D)
            return page[0].transpose(0, 1), page[1].transpose(0, 1)
        if self.layout == "page_first_direct":
            page = flat.view(2, L, ps, H, D)
            return page[0], page[1]
        page = flat.view(2, H, ps, L, D)
        return page[0].permute(2, 1, 0, 3), page[1].permute(2, 1, 0, 3)


class _MambaGeometry:
    """An SGLang MambaPoolHost: per slot, the recurrent state [layers, H, A, B] (A x B the
    per-head matrix, SGLang's [value][key] for gated delta rule) and one conv state
    [layers, channels, width]. statepool's staged state is [layers][H][key][value]: the copy
    between them transposes each head's matrix."""

    def __init__(self, pool: Any, settings: Settings):
        for attr in ("temporal_buffer", "conv_buffer", "num_mamba_layers", "layout"):
            if not hasattr(pool, attr):
                raise _Unsupported(f"host state pool {type(pool).__name__} has no {attr}")
        if pool.layout not in ("page_first", "page_first_direct"):
            raise _Unsupported(f"host state layout {pool.layout!r}")
        if len(pool.conv_buffer) != 1:
            raise _Unsupported(f"{len(pool.conv_buffer)} conv states per layer (one is stored)")
        if getattr(pool, "slot_state_buffers", None):
            raise _Unsupported("registered side states beside the recurrent state")
        temporal = pool.temporal_buffer        # [slots, L, 1, H, A, B]
        conv = pool.conv_buffer[0]             # [slots, L, 1, C, W]
        if temporal.dim() != 6 or temporal.numel() == 0:
            raise _Unsupported(f"recurrent state of shape {tuple(temporal.shape)}")
        if conv.dim() != 5:
            raise _Unsupported(f"conv state of shape {tuple(conv.shape)}")
        if temporal.device.type != "cpu" or conv.device.type != "cpu":
            raise _Unsupported("host state pool not in CPU memory")
        if temporal.dtype not in (torch.float32, torch.bfloat16):
            raise _Unsupported(f"recurrent state dtype {temporal.dtype} (f32 and bf16 are stored)")
        if conv.dtype not in _TORCH_TO_DTYPE:
            raise _Unsupported(f"conv state dtype {conv.dtype}")
        self.pool = pool
        self.layers = int(temporal.shape[1])
        self.heads, self.rows, self.cols = (int(x) for x in temporal.shape[3:])
        self.conv_channels, self.conv_width = int(conv.shape[3]), int(conv.shape[4])
        if self.conv_width > 64 and self.conv_channels <= 64:
            # [width, channels] in the engine: stored raw, so any split of the bytes works
            self.conv_channels, self.conv_width = self.conv_width, self.conv_channels
        self.staged_dtype = _TORCH_TO_DTYPE[temporal.dtype]
        self.torch_dtype = temporal.dtype
        self.conv_torch_dtype = conv.dtype
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
        # The state entry is bound to its layout by the daemon; its marker (small arena) is
        # keyed by the same digest, so markers of other codecs or plans never answer for it.
        self.marker_kind = "mark-" + hashlib.sha256(self.name.encode()).hexdigest()[:8]

    def slot_views(self, index: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """The slot's recurrent state as [L, H, key, value] (a transposed view) and its conv
        state as [L, C, W]: views of the host pool."""
        t = self.pool.temporal_buffer[index].view(self.layers, self.heads, self.rows, self.cols)
        c = self.pool.conv_buffer[0][index].reshape(self.layers, self.conv_channels,
                                                    self.conv_width)
        return t.transpose(-1, -2), c
