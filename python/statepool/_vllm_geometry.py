"""vLLM's KV-cache groups as statepool stores them (private to statepool.vllm).

One statepool snapshot per ``OffloadKey`` (a block hash and a KV-cache group):

- a **Mamba group** (every gated-delta-rule layer of the group, e.g. 12 of Qwen3-Next-80B's 36)
  becomes a state snapshot of a ``StateLayout`` with the group's layers: the recurrent state of
  each layer, ``[heads][value][key]`` as vLLM keeps it (value-major), under the state codec;
  the conv state beside it as opaque bytes (``[layer][channels][width]`` of the right size, in
  vLLM's own order: statepool stores conv states raw);
- an **attention group** (its layers' pages of ``block_size`` tokens) becomes the KV blocks of a
  hybrid snapshot under the KV codec. vLLM's CPU attention page of one layer is
  ``[head][K|V][token][head_dim]`` (each head: ``block_size`` key rows, then as many value
  rows), so the KV blocks treat every (layer, head) as one KvBlocks layer of ``head_dim``
  channels: a row is then a contiguous run of channels, which is what a ``KvRange`` addresses.

Keys: ``vl<format>/<namespace digest>/<group tag>/<block hash>``, position 0. The namespace
digest covers the ``namespace`` setting (default: the model name) and the tensor-parallel rank;
the group tag covers the group's index, its layers, shapes, dtypes, page format and codec
(and plan). So entries of other models, ranks, layouts or codecs never mix, while every engine
of the same model and settings (and every data-parallel replica) shares them.

vLLM hands an OffloadingSpec no per-group KV-cache specs (its OffloadingConfig has layer names
and block sizes only), so the spec reads them from the ``KVCacheConfig`` that the connector is
being built with: handed over by ``StatepoolConnector`` (``building_with``), or, under vLLM's
own OffloadingConnector, found as the ``kv_cache_config`` argument of the constructor that is
building the spec (``find_kv_cache_config``).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import re
import sys
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from vllm.v1.kv_cache_interface import (
    AttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from vllm.v1.kv_offload.base import LoadStoreSpec, get_offload_block_hash
from vllm.v1.kv_offload.config import OffloadingConfig

import statepool

from ._vllm_settings import Settings

# The format of what this spec stores, in every key: bump it when what an entry means changes;
# entries of another format are then never read.
FORMAT = 1
KEY_PREFIX = f"vl{FORMAT}/"

_TORCH_TO_DTYPE = {
    torch.float32: statepool.DType.f32,
    torch.bfloat16: statepool.DType.bf16,
    torch.float16: statepool.DType.f16,
}

# The attention page format of vLLM's CPU backend (cpu_attn.py): per layer and block
# [head][K rows of block_size][V rows of block_size][head_dim].
CPU_ATTENTION_PAGES = "cpu-hkvnd"


class Refused(Exception):
    """A group this spec cannot store (said once in the log; its keys miss)."""


# -- the KVCacheConfig the connector is built with -------------------------------------------

_BUILDING: contextvars.ContextVar[Optional[KVCacheConfig]] = contextvars.ContextVar(
    "statepool_vllm_building", default=None)


@contextlib.contextmanager
def building_with(kv_cache_config: KVCacheConfig) -> Iterator[None]:
    """While a ``StatepoolConnector`` builds its spec: the KV-cache config it is built with."""
    token = _BUILDING.set(kv_cache_config)
    try:
        yield
    finally:
        _BUILDING.reset(token)


def find_kv_cache_config(max_frames: int = 12) -> Tuple[Optional[KVCacheConfig], bool]:
    """(the KVCacheConfig the spec is being built with, whether StatepoolConnector handed it
    over). Without StatepoolConnector: the ``kv_cache_config`` argument of the nearest caller
    that has one (vLLM's OffloadingConnector.__init__ builds the spec with it in scope, in
    0.32 and 0.34); (None, False) when there is none."""
    handed = _BUILDING.get()
    if handed is not None:
        return handed, True
    frame = sys._getframe(1)
    for _ in range(max_frames):
        if frame is None:
            break
        candidate = frame.f_locals.get("kv_cache_config")
        if isinstance(candidate, KVCacheConfig):
            return candidate, False
        frame = frame.f_back
    return None, False


# -- the groups ---------------------------------------------------------------------------------


def _digest(text: str, n: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


@dataclass(frozen=True)
class StateGroup:
    """A Mamba (gated-delta-rule) group: per layer and block, the conv state (``conv_bytes``)
    then the recurrent state (``ssm_bytes``, ``[heads][value][key]``), unpadded."""

    group_id: int
    layer_names: Tuple[str, ...]
    conv_bytes: int
    ssm_bytes: int
    staged_dtype: statepool.DType
    layout: statepool.StateLayout
    layout_key: str  # names the layout (shape, codec, plan) among this spec's layouts
    tag: str
    description: str

    @property
    def layers(self) -> int:
        return len(self.layer_names)

    @property
    def page_bytes(self) -> int:
        """Unpadded bytes of one layer's page (what vLLM's CanonicalKVCacheRef says)."""
        return self.conv_bytes + self.ssm_bytes

    @property
    def entry_bytes(self) -> int:
        """Bytes of vLLM's pages one snapshot holds (every layer)."""
        return self.layers * self.page_bytes


@dataclass(frozen=True)
class KvGroup:
    """An attention group: per layer and block one page of vLLM's CPU format
    ``[head][K|V][token][head_dim]``, stored as KV blocks of ``layers * heads`` streams."""

    group_id: int
    layer_names: Tuple[str, ...]
    heads: int
    head_size: int
    block_size: int
    dtype: statepool.DType
    blocks: statepool.KvBlocks
    tag: str
    description: str

    @property
    def layers(self) -> int:
        return len(self.layer_names)

    @property
    def element_bytes(self) -> int:
        return 4 if self.dtype == statepool.DType.f32 else 2

    @property
    def page_bytes(self) -> int:
        return 2 * self.block_size * self.heads * self.head_size * self.element_bytes

    @property
    def entry_bytes(self) -> int:
        return self.layers * self.page_bytes

    @property
    def stream_stride(self) -> int:
        """Bytes from one (layer, head) stream's keys to the next's: one head of a page."""
        return 2 * self.block_size * self.head_size * self.element_bytes

    @property
    def row_bytes(self) -> int:
        return self.head_size * self.element_bytes

    @property
    def value_offset(self) -> int:
        """Bytes from a head's first key row to its first value row."""
        return self.block_size * self.row_bytes


Group = Union[StateGroup, KvGroup]


def _group_spec(kv_cache_config: KVCacheConfig, group_id: int):
    spec = kv_cache_config.kv_cache_groups[group_id].kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        specs = list(spec.kv_cache_specs.values())
        if not specs or any(s != specs[0] for s in specs):
            raise Refused("layers of different KV-cache specs in one group")
        spec = specs[0]
    return spec


def _layer_index(name: str, fallback: int) -> int:
    m = re.search(r"\.(\d+)\.", name)
    return int(m.group(1)) if m else fallback


def _state_ordinals(config: OffloadingConfig, kv_cache_config: KVCacheConfig) -> Dict[str, int]:
    """Every Mamba layer's index among the model's Mamba layers (what a plan's layers are)."""
    names: List[str] = []
    for g in config.groups:
        try:
            if isinstance(_group_spec(kv_cache_config, g.group_id), MambaSpec):
                names.extend(g.layer_names)
        except Refused:
            continue
    order = sorted(range(len(names)), key=lambda i: (_layer_index(names[i], i), i))
    return {names[i]: n for n, i in enumerate(order)}


def _sliced_plan(plan: statepool.Plan, ordinals: Sequence[int], heads: int, rank: int,
                 tp_size: int) -> statepool.Plan:
    """The model plan's rows of some layers and of this rank's heads (vLLM gives rank r the
    value heads [r*H, (r+1)*H), H per rank)."""
    if plan.num_heads == heads:
        h0 = 0
    elif plan.num_heads == heads * tp_size:
        h0 = rank * heads
    else:
        raise Refused(f"the plan has {plan.num_heads} heads per layer; the model has {heads} "
                      f"per rank (tensor parallel {tp_size})")
    if any(o >= plan.num_layers for o in ordinals):
        raise Refused(f"the plan has {plan.num_layers} layers; the model has more gated-delta-"
                      "rule layers")
    per_unit = plan.key_dim if plan.arch == statepool.Arch.kda else 1
    widths, impact = plan.widths, plan.impact
    w, im = [], []
    for o in ordinals:
        for h in range(h0, h0 + heads):
            unit = o * plan.num_heads + h
            w.extend(widths[unit * per_unit:(unit + 1) * per_unit])
            im.extend(impact[unit * plan.key_dim:(unit + 1) * plan.key_dim])
    return statepool.Plan(arch=plan.arch, num_layers=len(ordinals), num_heads=heads,
                          key_dim=plan.key_dim, value_dim=plan.value_dim,
                          budget_bits=plan.budget_bits, widths=w, impact=im,
                          source=f"{plan.source} | layers {list(ordinals)} heads "
                                 f"{h0}..{h0 + heads - 1} (statepool.vllm)")


def _state_group(group_id: int, names: Tuple[str, ...], spec: MambaSpec, settings: Settings,
                 plan: Optional[statepool.Plan], ordinals: Dict[str, int], rank: int,
                 tp_size: int) -> StateGroup:
    if len(spec.shapes) != 2 or len(spec.dtypes) != 2:
        raise Refused(f"a Mamba state of {len(spec.shapes)} parts (statepool stores a conv state "
                      "and a recurrent state: gated delta rule, KDA)")
    conv_shape, ssm_shape = (tuple(int(x) for x in s) for s in spec.shapes)
    conv_dtype, ssm_dtype = spec.dtypes
    if len(conv_shape) != 2 or len(ssm_shape) != 3:
        raise Refused(f"Mamba state shapes {conv_shape}, {ssm_shape} (expected a 2-D conv state "
                      "and a [heads][value][key] recurrent state)")
    if ssm_dtype not in (torch.float32, torch.bfloat16):
        raise Refused(f"recurrent state dtype {ssm_dtype} (f32 and bf16 are stored)")
    if conv_dtype not in _TORCH_TO_DTYPE:
        raise Refused(f"conv state dtype {conv_dtype}")
    heads, value_dim, key_dim = ssm_shape
    channels, width = max(conv_shape), min(conv_shape)
    codec = statepool.CodecId.__members__[settings.state_codec]
    arch = plan.arch if plan is not None else statepool.Arch.gdn
    base = statepool.StateLayout(
        arch=arch, num_layers=len(names), num_heads=heads, key_dim=key_dim,
        value_dim=value_dim, conv_channels=channels, conv_width=width,
        conv_dtype=_TORCH_TO_DTYPE[conv_dtype], codec=statepool.CodecId.fp32,
        name=f"vllm-state-{len(names)}x{heads}x{value_dim}x{key_dim}")
    group_plan = None
    if settings.stepquant_bits and plan is not None:
        group_plan = _sliced_plan(plan, [ordinals[n] for n in names], heads, rank, tp_size)
    elif settings.stepquant_bits:
        group_plan = statepool.Plan.nominal(base, settings.stepquant_bits)
    layout = base.with_codec(codec, group_plan)
    itemsize = torch.empty((), dtype=ssm_dtype).element_size()
    conv_itemsize = torch.empty((), dtype=conv_dtype).element_size()
    plan_digest = group_plan.digest if group_plan is not None else ""
    layout_key = (f"{arch.name}:{len(names)}x{heads}x{value_dim}x{key_dim}:conv{channels}x{width}"
                  f":{conv_dtype}:{codec.name}:{plan_digest}")
    description = (f"state|g{group_id}|{','.join(names)}|conv{conv_shape}:{conv_dtype}|"
                   f"ssm{ssm_shape}:{ssm_dtype}|{codec.name}|{plan_digest}")
    return StateGroup(
        group_id=group_id, layer_names=names,
        conv_bytes=conv_shape[0] * conv_shape[1] * conv_itemsize,
        ssm_bytes=heads * value_dim * key_dim * itemsize,
        staged_dtype=_TORCH_TO_DTYPE[ssm_dtype], layout=layout, layout_key=layout_key,
        tag=f"s{group_id}-{_digest(description)}", description=description)


def _kv_group(group_id: int, names: Tuple[str, ...], spec: AttentionSpec, block_size: int,
              settings: Settings, page_format: Optional[str]) -> KvGroup:
    if isinstance(spec, MLAAttentionSpec) or not isinstance(spec, (FullAttentionSpec,
                                                                    SlidingWindowSpec)):
        raise Refused(f"attention spec {type(spec).__name__} (full and sliding-window "
                      "attention are stored)")
    if page_format is None:
        raise Refused("attention pages of a backend other than vLLM's CPU backend (its page "
                      "format is the one this spec knows)")
    if int(getattr(spec, "kv_quant_mode", 0) or 0) != 0:
        raise Refused("a quantized KV cache (kv_quant_mode); statepool's KV codecs take "
                      "plain values")
    if spec.dtype not in _TORCH_TO_DTYPE:
        raise Refused(f"KV cache dtype {spec.dtype} (f32, bf16 and f16 are stored)")
    head_size_v = getattr(spec, "head_size_v", None) or spec.head_size
    if head_size_v != spec.head_size:
        raise Refused("value heads unlike the key heads")
    heads = int(spec.num_kv_heads)
    if getattr(spec, "num_head_slots", None) not in (None, heads):
        raise Refused("padded head slots")
    if spec.block_size != block_size:
        raise Refused(f"block size {spec.block_size} unlike the offloaded {block_size}")
    codec = statepool.KvCodec.__members__[settings.kv_codec]
    dtype = _TORCH_TO_DTYPE[spec.dtype]
    blocks = statepool.KvBlocks(codec=codec, layers=len(names) * heads,
                                key_channels=spec.head_size, value_channels=spec.head_size,
                                tokens=block_size)
    group = KvGroup(group_id=group_id, layer_names=names, heads=heads, head_size=spec.head_size,
                    block_size=block_size, dtype=dtype, blocks=blocks, tag="", description="")
    if group.page_bytes != spec.real_page_size_bytes:
        raise Refused(f"a page of {spec.real_page_size_bytes} bytes, not the "
                      f"{group.page_bytes} of [head][K|V][token][head_dim]")
    blocks.plain_bytes(dtype)  # ValueError names a shape statepool refuses
    description = (f"kv|g{group_id}|{','.join(names)}|{heads}x{spec.head_size}|"
                   f"block{block_size}|{spec.dtype}|{page_format}|{codec.name}")
    return KvGroup(group_id=group_id, layer_names=names, heads=heads, head_size=spec.head_size,
                   block_size=block_size, dtype=dtype, blocks=blocks,
                   tag=f"k{group_id}-{_digest(description)}", description=description)


def attention_page_format(kv_cache_layout: Optional[str]) -> Optional[str]:
    """The attention page format this spec knows on this platform, or None."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu() and kv_cache_layout in (None, "LBHNC"):
        return CPU_ATTENTION_PAGES
    return None


class Geometry:
    """One tensor-parallel rank's groups (by KV-cache group id) and its keys."""

    def __init__(self, config: OffloadingConfig, kv_cache_config: KVCacheConfig,
                 settings: Settings, plan: Optional[statepool.Plan], rank: int):
        self.rank = rank
        tp_size = config.parallel.tp_size
        namespace = settings.namespace or config.model.name
        self.namespace = _digest(f"{namespace}|tp{rank}/{tp_size}", 16)
        self.groups: Dict[int, Group] = {}
        self.refused: Dict[int, str] = {}
        page_format = attention_page_format(config.kv_cache_layout)
        ordinals = _state_ordinals(config, kv_cache_config)
        for g in config.groups:
            names = tuple(g.layer_names)
            try:
                spec = _group_spec(kv_cache_config, g.group_id)
                if isinstance(spec, MambaSpec):
                    group: Group = _state_group(g.group_id, names, spec, settings, plan,
                                                ordinals, rank, tp_size)
                elif isinstance(spec, AttentionSpec):
                    group = _kv_group(g.group_id, names, spec, g.tokens_per_block, settings,
                                      page_format)
                else:
                    raise Refused(f"KV-cache spec {type(spec).__name__}")
            except (Refused, ValueError) as e:
                self.refused[g.group_id] = str(e)
            else:
                self.groups[g.group_id] = group

    def prefix(self, key: bytes, group: Group) -> str:
        block_hash = get_offload_block_hash(key)
        text = block_hash.hex() if len(block_hash) <= 96 else hashlib.sha256(
            block_hash).hexdigest()
        return f"{KEY_PREFIX}{self.namespace}/{group.tag}/{text}"

    def state_groups(self) -> List[StateGroup]:
        return [g for g in self.groups.values() if isinstance(g, StateGroup)]

    def kv_groups(self) -> List[KvGroup]:
        return [g for g in self.groups.values() if isinstance(g, KvGroup)]


class StatepoolKeys(LoadStoreSpec):
    """What the manager hands the worker for a job (through vLLM, pickled): the offload keys,
    in vLLM's order (by group, then by block), one per block of the job."""

    def __init__(self, keys: Sequence[bytes]):
        self.keys = [bytes(k) for k in keys]

    def __repr__(self) -> str:
        return f"StatepoolKeys({len(self.keys)} keys)"
