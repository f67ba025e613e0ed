"""statepool's C++ client library (use the statepool package, which re-exports it)"""

# Type stubs of the pybind11 module statepool._core (python/src/*.cpp). Parameter names,
# defaults, keyword-only markers and overloads follow the pybind11 definitions exactly, and
# docstrings repeat the C++ ones; tests/python/test_stubs.py checks both against the module.

import builtins
import sys
from collections.abc import Sequence
from typing import Any, ClassVar, Final, overload

from typing_extensions import Self, TypeAlias

DTypeLike: TypeAlias = Any
"""Stub-only alias (import it under TYPE_CHECKING): what Staging.view() takes as ``dtype``: a statepool.DType, a name ('uint8', 'float32'/'float'/'f32', 'float16'/'half', 'bfloat16'/'bf16', optionally 'torch.'-prefixed), a numpy dtype or scalar type, or a torch dtype. Other dtype parameters take DType only."""

_BufferLike: TypeAlias = Any
# A C-contiguous host buffer borrowed for one call: anything with the buffer protocol (numpy
# array, bytearray, memoryview, statepool.View) or __dlpack__ (a torch CPU tensor).

_DeviceBufferLike: TypeAlias = Any
# C-contiguous device memory borrowed for one call (a module built with CUDA): a CUDA tensor or
# a device statepool.View (__dlpack__ / __dlpack_device__), or anything with
# __cuda_array_interface__ (CuPy, Numba).

if sys.version_info >= (3, 13):
    from types import CapsuleType as _PyCapsule
else:
    _PyCapsule: TypeAlias = Any  # a PyCapsule named "dltensor"

DEFAULT_SOCKET_PATH: Final = "/run/statepool/statepool.sock"
"""Where statepoold listens unless configured otherwise (connect()'s default socket_path)."""

HAVE_CUDA: bool
"""True when the module was built with CUDA: Pending.synchronize()/wait() on device work, Arena.decode() of device arenas, DeviceDecoder and DeviceDecodeStep work (they raise RuntimeError otherwise), and arenas and staging buffers of the cuda backend are mapped here as device memory."""

# --- enums (pybind11 enums: not enum.Enum subclasses, and not iterable; the members are
# class attributes and __members__ maps their names to them) ---------------------------------

class _Enum:
    """What every pybind11 enum of the module has besides its members (stub only)."""

    def __eq__(self, other: object) -> bool:
        """True for the same member (a member never equals an int)."""
    def __ne__(self, other: object) -> bool:
        """Not __eq__."""
    def __hash__(self) -> int:
        """Hash of the value."""
    def __index__(self) -> int:
        """The member's value."""
    def __getstate__(self) -> int:
        """Pickling: the value."""
    def __setstate__(self, state: int) -> None:
        """Unpickling from the value."""
    def __repr__(self) -> str:
        """'<Enum.name: value>'."""
    def __str__(self) -> str:
        """'Enum.name'."""

class Status(_Enum):
    """Reply status of the daemon (protocol/statepool.fbs)."""

    ok: ClassVar[Status]
    """Success."""
    invalid_argument: ClassVar[Status]
    """A field is out of range or inconsistent (statepool.InvalidArgument)."""
    not_found: ClassVar[Status]
    """Unknown layout, arena, staging buffer or plan (statepool.NotFound)."""
    quota_exceeded: ClassVar[Status]
    """A per-tenant or per-connection limit would be exceeded (statepool.QuotaExceeded)."""
    pool_exhausted: ClassVar[Status]
    """No capacity left: the pool, the arena's free pages, or the staging capacity (statepool.PoolExhausted)."""
    not_owner: ClassVar[Status]
    """The slot is allocated to another lease (statepool.NotOwner)."""
    unsupported_version: ClassVar[Status]
    """No common protocol version (statepool.UnsupportedVersion)."""
    protocol_error: ClassVar[Status]
    """The daemon found a malformed frame or message (statepool.ProtocolError)."""
    lease_busy: ClassVar[Status]
    """The lease token is held by another live connection (statepool.LeaseBusy)."""
    unknown_tenant: ClassVar[Status]
    """The tenant is not configured in the daemon (statepool.UnknownTenant)."""
    permission_denied: ClassVar[Status]
    """Not allowed: peer uid, tenant, another tenant's arena, or Drain by a non-operator (statepool.PermissionDenied)."""
    draining: ClassVar[Status]
    """The daemon is draining (statepool.Draining)."""
    not_finite: ClassVar[Status]
    """A state to compress holds NaN or Inf; the page is unchanged (statepool.NotFinite)."""
    internal: ClassVar[Status]
    """A bug or an operating-system failure in the daemon (statepool.Internal)."""
    not_hello: ClassVar[Status]
    """The first request of a connection must be Hello (statepool.NotHello)."""
    too_many_connections: ClassVar[Status]
    """The daemon, the uid or the tenant has no connection left (statepool.TooManyConnections)."""
    in_use: ClassVar[Status]
    """close_arena(): the arena still has held pages, pinned or busy snapshots, or other connections that opened it (statepool.InUse)."""
    __members__: ClassVar[dict[str, Status]]
    """The members by name."""
    def __init__(self, value: int) -> None:
        """The member whose value is ``value``."""
    @property
    def name(self) -> str:
        """The member's name."""
    @property
    def value(self) -> int:
        """The member's value (the protocol's number)."""
    def __int__(self) -> int:
        """The member's value."""

class Arch(_Enum):
    """Gated-delta-rule family: gdn (a gate per head) or kda (a gate per key channel)."""

    gdn: ClassVar[Arch]
    """Gated DeltaNet: a gate per head."""
    kda: ClassVar[Arch]
    """Kimi Delta Attention: a gate per key channel."""
    __members__: ClassVar[dict[str, Arch]]
    """The members by name."""
    def __init__(self, value: int) -> None:
        """The member whose value is ``value``."""
    @property
    def name(self) -> str:
        """The member's name."""
    @property
    def value(self) -> int:
        """The member's value."""
    def __int__(self) -> int:
        """The member's value."""

class DType(_Enum):
    """Element type of full-precision data."""

    f32: ClassVar[DType]
    """float32."""
    bf16: ClassVar[DType]
    """bfloat16."""
    f16: ClassVar[DType]
    """float16 (conv states only: f16 staging is refused)."""
    __members__: ClassVar[dict[str, DType]]
    """The members by name."""
    def __init__(self, value: int) -> None:
        """The member whose value is ``value``."""
    @property
    def name(self) -> str:
        """The member's name."""
    @property
    def value(self) -> int:
        """The member's value."""
    def __int__(self) -> int:
        """The member's value."""

class CodecId(_Enum):
    """Codec of the recurrent state (docs/codecs.md)."""

    fp32: ClassVar[CodecId]
    """float32 values: a copy, exact."""
    bf16: ClassVar[CodecId]
    """bfloat16 values (round to nearest even)."""
    fp16: ClassVar[CodecId]
    """float16 values (round to nearest even)."""
    int4: ClassVar[CodecId]
    """4-bit codes, symmetric absmax per group of group_size values, fp16 scales."""
    int6: ClassVar[CodecId]
    """6-bit codes, symmetric absmax per group of group_size values, fp16 scales."""
    int8: ClassVar[CodecId]
    """8-bit codes, symmetric absmax per group of group_size values, fp16 scales."""
    stepquant4: ClassVar[CodecId]
    """STEPQuant at a 4-bit budget: per-unit widths from a calibration plan (needs a Plan)."""
    stepquant6: ClassVar[CodecId]
    """STEPQuant at a 6-bit budget: per-unit widths from a calibration plan (needs a Plan)."""
    dsq4: ClassVar[CodecId]
    """Dual-scale baseline at 4 bits: fp16 row and column scales per head, no plan."""
    dsq6: ClassVar[CodecId]
    """Dual-scale baseline at 6 bits: fp16 row and column scales per head, no plan."""
    __members__: ClassVar[dict[str, CodecId]]
    """The members by name."""
    def __init__(self, value: int) -> None:
        """The member whose value is ``value``."""
    @property
    def name(self) -> str:
        """The member's name."""
    @property
    def value(self) -> int:
        """The member's value."""
    def __int__(self) -> int:
        """The member's value."""

class KvCodec(_Enum):
    """Codec of a hybrid snapshot's KV blocks (docs/codecs.md, "KV-cache codecs")."""

    bf16: ClassVar[KvCodec]
    """bfloat16, 2 B per value (round to nearest even, saturating at the largest finite bf16)."""
    fp8: ClassVar[KvCodec]
    """OCP FP8 E4M3, 1 B per value, saturating at +-448; no per-tensor scale."""
    kivi2: ClassVar[KvCodec]
    """KIVI at 2 bits: asymmetric groups of 32, keys per channel, values per token; the newest 128 tokens stay FP16."""
    kivi4: ClassVar[KvCodec]
    """KIVI at 4 bits (as kivi2)."""
    flexgen4: ClassVar[KvCodec]
    """4-bit asymmetric groups of 32 channels of one token, keys and values alike."""
    __members__: ClassVar[dict[str, KvCodec]]
    """The members by name."""
    def __init__(self, value: int) -> None:
        """The member whose value is ``value``."""
    @property
    def name(self) -> str:
        """The member's name."""
    @property
    def value(self) -> int:
        """The member's value."""
    def __int__(self) -> int:
        """The member's value."""

class StepQuantVariant(_Enum):
    """STEPQuant ablation: both axes, spatial only, temporal only, both axes without the refit."""

    full: ClassVar[StepQuantVariant]
    """The codec as calibrated (both axes)."""
    spatial_only: ClassVar[StepQuantVariant]
    """Every non-pivot unit at the budget width, with the impact-weighted fit."""
    temporal_only: ClassVar[StepQuantVariant]
    """The plan's widths with plain per-row absmax scales, no column scales."""
    no_refit: ClassVar[StepQuantVariant]
    """As calibrated, without the least-squares refit of the column scales."""
    __members__: ClassVar[dict[str, StepQuantVariant]]
    """The members by name."""
    def __init__(self, value: int) -> None:
        """The member whose value is ``value``."""
    @property
    def name(self) -> str:
        """The member's name."""
    @property
    def value(self) -> int:
        """The member's value."""
    def __int__(self) -> int:
        """The member's value."""

# --- views ---------------------------------------------------------------------------------

class View:
    """
    A zero-copy view of memory shared with the daemon: a staging buffer or arena pages.

    Host memory offers the buffer protocol (``numpy.asarray(view)``, ``memoryview(view)``) and
    DLPack (``torch.from_dlpack(view)``, ``numpy.from_dlpack(view)``); device memory (the cuda
    backend) offers DLPack and ``__cuda_array_interface__``. Whatever is made from a view keeps
    the memory mapped; the buffer it views cannot be closed while such objects exist.
    bfloat16 views have no numpy equivalent: use DLPack (PyTorch) for them.

    Stub note: the buffer protocol is a C-level slot; Python 3.12+ shows it as ``__buffer__``
    (typed below for those versions, so View is a ``collections.abc.Buffer``); Python 3.11 has
    no ``__buffer__`` and no way to type it, so pass views where a buffer is expected as usual.
    Writable, C-contiguous; BufferError for device memory and for bfloat16 views.
    """

    @property
    def shape(self) -> tuple[int, ...]:
        """Dimensions, C order."""
    @property
    def dtype(self) -> str:
        """Element type: 'uint8', 'float32', 'float16' or 'bfloat16'."""
    @property
    def nbytes(self) -> int:
        """Bytes viewed."""
    @property
    def device(self) -> str:
        """'cpu' or 'cuda:N'."""
    @property
    def data_ptr(self) -> int:
        """Address of the first element (a device address for device memory)."""
    def __len__(self) -> int:
        """The first dimension (0 for a view without dimensions)."""
    def __repr__(self) -> str:
        """'<statepool.View dtype[dims] on device>'."""
    def __dlpack__(self, stream: object = None) -> _PyCapsule:
        """
        DLPack capsule of the view (zero-copy). ``stream`` is accepted and ignored: the daemon's
        work on this memory is complete when its reply arrives, so there is nothing to order.
        """
    def __dlpack_device__(self) -> tuple[int, int]:
        """(device type, device id) as DLPack numbers them: (1, 0) for host memory."""
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA array interface (version 3) of device memory."""
    if sys.version_info >= (3, 12):
        def __buffer__(self, flags: int, /) -> memoryview:
            """The buffer protocol (host memory; not bfloat16)."""
        def __release_buffer__(self, buffer: memoryview, /) -> None:
            """Releases a buffer made by __buffer__."""

# --- kernels: plans, layouts, page codecs --------------------------------------------------

class Plan:
    """
    A STEPQuant calibration plan (docs/plans.md): per-unit bit widths, FP16 pivots and per-row
    impact factors for one model shape. Made by ``statepool-quant calibrate`` and loaded with
    ``Plan.load(path)``, or built from its fields (validated).
    """

    def __init__(
        self,
        *,
        arch: Arch,
        num_layers: int,
        num_heads: int,
        key_dim: int,
        value_dim: int,
        budget_bits: int,
        widths: Sequence[int],
        impact: Sequence[float],
        source: str = "",
    ) -> None:
        """Builds a plan; ValueError names the first problem (docs/plans.md lists the rules). widths: one per unit (GDN: [layer][head], KDA: [layer][head][row]) in the budget's candidates or 16 (pivot); impact: one > 0 per key row."""
    @staticmethod
    def load(path: str) -> Plan:
        """Reads a plan file; ValueError for a bad file, OSError-like RuntimeError for an I/O failure, both naming the path."""
    @staticmethod
    def from_bytes(data: bytes) -> Plan:
        """Parses a serialized plan (the contents of a plan file)."""
    @staticmethod
    def nominal(layout: StateLayout, budget_bits: int) -> Plan:
        """The nominal plan of a layout's shape (its codec is ignored): every unit at ``budget_bits``
(6 or 4), the default share of FP16 pivots, impact factors 1 — what the capacity planner
sizes pages with. For trying STEPQuant before calibrating; a calibrated plan
(``statepool-quant calibrate``) is what keeps the accuracy."""
    def to_bytes(self) -> bytes:
        """The plan file's bytes."""
    def save(self, path: str) -> None:
        """Writes the plan file atomically (temporary file, fsync, rename)."""
    @property
    def arch(self) -> Arch:
        """Gated-delta-rule family of the model."""
    @property
    def num_layers(self) -> int:
        """Linear-attention layers."""
    @property
    def num_heads(self) -> int:
        """Heads per layer."""
    @property
    def key_dim(self) -> int:
        """Key dimension (rows of a head's state)."""
    @property
    def value_dim(self) -> int:
        """Value dimension (columns of a head's state)."""
    @property
    def budget_bits(self) -> int:
        """The bit budget: 6 (stepquant6) or 4 (stepquant4)."""
    @property
    def widths(self) -> list[int]:
        """Width per unit (a copy)."""
    @property
    def impact(self) -> list[float]:
        """Impact factor per key row (a copy)."""
    @property
    def source(self) -> str:
        """Free text: model, trace, tool version."""
    @property
    def page_format(self) -> int:
        """STEPQuant page format the plan was calibrated with (1: before 2026-12-05)."""
    @property
    def digest(self) -> str:
        """16 hex characters that layouts name the plan by."""
    @property
    def units(self) -> int:
        """Heads (GDN) or key rows (KDA): len(widths) of a valid plan."""
    @property
    def pivots(self) -> int:
        """FP16 pivot units (width 16)."""
    @property
    def average_width(self) -> float:
        """Average nominal bits per value (pivots count 16)."""
    def __repr__(self) -> str:
        """'<statepool.Plan digest arch N-bit, U units, P pivots>'."""

class StateLayout:
    """
    The shape of one request's whole recurrent state (every linear-attention layer) and the codec
    that stores it; one arena page holds one such state. Staged (full-precision) states are
    ``[num_layers][num_heads][key_dim][value_dim]`` in float32 or bfloat16, followed by the conv
    state ``[num_layers][conv_channels][conv_width]`` in ``conv_dtype``.
    """

    def __init__(
        self,
        *,
        arch: Arch = Arch.gdn,
        num_layers: int,
        num_heads: int,
        key_dim: int,
        value_dim: int,
        conv_channels: int = 0,
        conv_width: int = 0,
        conv_dtype: DType = DType.bf16,
        codec: CodecId = CodecId.fp32,
        group_size: int = 0,
        variant: StepQuantVariant = StepQuantVariant.full,
        plan: Plan | None = None,
        name: str = "",
    ) -> None:
        """Builds and validates a layout (ValueError names the field). stepquant4/6 need a plan of the same shape; group_size 0 means 128."""
    @property
    def name(self) -> str:
        """The layout's name ('' for none)."""
    @property
    def arch(self) -> Arch:
        """Gated-delta-rule family."""
    @property
    def num_layers(self) -> int:
        """Linear-attention layers."""
    @property
    def num_heads(self) -> int:
        """Heads per layer."""
    @property
    def key_dim(self) -> int:
        """Key dimension (rows of a head's state)."""
    @property
    def value_dim(self) -> int:
        """Value dimension (columns of a head's state)."""
    @property
    def conv_channels(self) -> int:
        """Channels of the conv state per layer (0: none)."""
    @property
    def conv_width(self) -> int:
        """Width of the conv state (0: none)."""
    @property
    def conv_dtype(self) -> DType:
        """Element type of the conv state (stored raw)."""
    @property
    def codec(self) -> CodecId:
        """Codec of the recurrent state."""
    @property
    def group_size(self) -> int:
        """Group size of the int codecs (0 means 128)."""
    @property
    def variant(self) -> StepQuantVariant:
        """STEPQuant ablation variant."""
    @property
    def plan(self) -> Plan | None:
        """The STEPQuant plan, or None."""
    def with_codec(self, codec: CodecId, plan: Plan | None = None) -> StateLayout:
        """The same shape stored with another codec."""
    def __eq__(self, arg0: StateLayout, /) -> bool:  # type: ignore[override]
        """Same shape and codec (plans compared too); TypeError for a non-StateLayout."""
    __hash__: ClassVar[None]  # type: ignore[assignment]
    """Unhashable (it defines __eq__)."""
    def __repr__(self) -> str:
        """"<statepool.StateLayout 'name' arch LxHxKxV conv CxW codec>"."""

class PageCodec:
    """
    The page format of a layout, to encode and decode pages in this process with the same code
    as the daemon. Thread-safe; encode/decode release the GIL.
    """

    def __init__(self, layout: StateLayout) -> None:
        """The page codec of ``layout``."""
    @property
    def layout(self) -> StateLayout:
        """The layout (a copy)."""
    @property
    def page_bytes(self) -> int:
        """Exact bytes of one page."""
    @property
    def fp32_bytes(self) -> int:
        """Bytes of the same state with every value in float32."""
    @property
    def compression_ratio(self) -> float:
        """fp32_bytes / page_bytes."""
    @property
    def head_count(self) -> int:
        """num_layers * num_heads."""
    def head_offset(self, layer: int, head: int) -> int:
        """Byte offset of the encoded head in a page (heads in layer-major order, then the conv state at conv_offset)."""
    @property
    def conv_offset(self) -> int:
        """Byte offset of the conv state in a page."""
    def staged_bytes(self, dtype: DType = DType.f32) -> int:
        """Bytes of a staged state whose recurrent part is in dtype (f32 or bf16)."""
    def encode(self, staged: _BufferLike, dtype: DType, page: _BufferLike) -> None:
        """page <- staged. NotFinite (page unchanged) for a NaN/Inf state; ValueError for wrong sizes. Buffers: numpy arrays, torch CPU tensors, statepool.View, bytearray."""
    def decode(self, page: _BufferLike, dtype: DType, staged: _BufferLike) -> None:
        """staged <- page."""

# --- client: results -----------------------------------------------------------------------

class LayoutInfo:
    """A layout registered with the daemon."""

    @property
    def id(self) -> int:
        """The daemon's id of the layout."""
    @property
    def page_bytes(self) -> int:
        """Exact bytes of one page."""
    @property
    def fp32_bytes(self) -> int:
        """Bytes of the same state with every value in float32."""
    @property
    def state_bytes_f32(self) -> int:
        """Bytes of a staged state, recurrent part in float32."""
    @property
    def state_bytes_bf16(self) -> int:
        """Bytes of a staged state, recurrent part in bfloat16."""
    @property
    def layout(self) -> StateLayout:
        """What was registered."""
    @property
    def compression_ratio(self) -> float:
        """fp32_bytes / page_bytes (0 if page_bytes is 0)."""
    def state_bytes(self, dtype: DType = DType.f32) -> int:
        """state_bytes_f32 or state_bytes_bf16 (0 for f16: the daemon does not accept f16 staging)."""
    def __repr__(self) -> str:
        """'<statepool.LayoutInfo id=... page_bytes=... fp32_bytes=...>'."""

class PlanInfo:
    """A STEPQuant plan the daemon holds."""

    @property
    def digest(self) -> str:
        """What layouts name the plan by (16 hex characters)."""
    @property
    def units(self) -> int:
        """Heads (GDN) or key rows (KDA)."""
    @property
    def pivots(self) -> int:
        """FP16 pivot units."""
    @property
    def average_bits(self) -> float:
        """Nominal bits per value over the units."""
    @property
    def created(self) -> bool:
        """False when the daemon had it already."""

class ArenaStats:
    """One arena in stats()."""

    @property
    def arena_id(self) -> int:
        """The arena's id."""
    @property
    def tenant(self) -> str:
        """The tenant that owns it."""
    @property
    def layout_id(self) -> int:
        """The id of its layout."""
    @property
    def layout_name(self) -> str:
        """The name of its layout."""
    @property
    def codec(self) -> CodecId:
        """The codec of its pages."""
    @property
    def backend(self) -> str:
        """'host' or 'cuda'."""
    @property
    def page_bytes(self) -> int:
        """Exact bytes of one page."""
    @property
    def page_stride(self) -> int:
        """Bytes one page takes in the arena."""
    @property
    def pages_total(self) -> int:
        """Pages in the arena."""
    @property
    def pages_used(self) -> int:
        """Pages allocated."""
    @property
    def bytes_total(self) -> int:
        """Mapping size, page_count * page_stride."""
    @property
    def fp32_bytes_used(self) -> int:
        """FP32-equivalent bytes of the used pages."""
    @property
    def snapshot_pages(self) -> int:
        """Of pages_used, those holding prefix-state snapshots."""
    @property
    def stored_bytes_used(self) -> int:
        """Page bytes of the used pages."""
    @property
    def compression_ratio(self) -> float:
        """fp32_bytes_used / stored_bytes_used (0 when no page is used)."""

class TenantStats:
    """One tenant in stats()."""

    @property
    def tenant(self) -> str:
        """The tenant's name."""
    @property
    def quota_bytes(self) -> int:
        """0 = unlimited."""
    @property
    def reserved_bytes(self) -> int:
        """Arena bytes held (counted against the quota)."""
    @property
    def pages_used(self) -> int:
        """Pages used in its arenas."""
    @property
    def stored_bytes(self) -> int:
        """Page bytes of the used pages."""
    @property
    def fp32_bytes(self) -> int:
        """FP32-equivalent bytes of the used pages."""
    @property
    def snapshots(self) -> int:
        """Prefix-state snapshots it published."""
    @property
    def snapshot_bytes(self) -> int:
        """Page bytes of those snapshots."""
    @property
    def pinned_snapshots(self) -> int:
        """Pinned snapshots it published."""
    @property
    def snapshot_hits(self) -> int:
        """get_snapshot hits by the tenant since the daemon started."""
    @property
    def snapshot_misses(self) -> int:
        """get_snapshot misses by the tenant since the daemon started."""
    @property
    def snapshot_evictions(self) -> int:
        """Its snapshots evicted to make room, since the daemon started."""
    @property
    def snapshot_demotions(self) -> int:
        """Its snapshots evicted from the pool while lower tiers keep them."""
    @property
    def snapshot_hits_host(self) -> int:
        """Of snapshot_hits, those the host tier served."""
    @property
    def snapshot_hits_remote(self) -> int:
        """Of snapshot_hits, those the remote store served."""
    @property
    def compression_ratio(self) -> float:
        """fp32_bytes / stored_bytes (0 when nothing is stored)."""

class Stats:
    """The daemon's state (the Stats request)."""

    @property
    def arenas(self) -> list[ArenaStats]:
        """Every arena."""
    @property
    def tenants(self) -> list[TenantStats]:
        """Every tenant."""
    @property
    def clients_connected(self) -> int:
        """Connections open now."""
    @property
    def leases_active(self) -> int:
        """Leases held by a live connection."""
    @property
    def leases_orphaned(self) -> int:
        """Leases whose connection dropped, waiting for the grace period."""
    @property
    def pages_reclaimed_total(self) -> int:
        """Pages freed by grace-period expiry since start."""
    @property
    def pool_capacity_bytes(self) -> int:
        """Bytes of the pool."""
    @property
    def pool_reserved_bytes(self) -> int:
        """Bytes of the pool held by arenas."""
    @property
    def uptime_seconds(self) -> float:
        """Seconds since the daemon started."""

class CodecFit:
    """How many more requests fit under one codec."""

    @property
    def codec(self) -> CodecId:
        """The codec."""
    @property
    def nominal_plan(self) -> bool:
        """stepquant without an arena: sized with nominal plan bytes."""
    @property
    def page_stride(self) -> int:
        """Bytes one slot takes in an arena."""
    @property
    def arena_free_pages(self) -> int:
        """Free pages in the tenant's arena(s) of this codec."""
    @property
    def new_arena_pages(self) -> int:
        """Pages a new arena could take now."""
    @property
    def requests(self) -> int:
        """(arena_free_pages + new_arena_pages) / slots."""
    @property
    def limited_by(self) -> str:
        """arena, pool, quota or max_arena_pages."""

class Fits:
    """What fits now for this connection's tenant."""

    @property
    def tenant(self) -> str:
        """The tenant."""
    @property
    def pool_capacity_bytes(self) -> int:
        """Bytes of the pool."""
    @property
    def pool_free_bytes(self) -> int:
        """Capacity minus all arenas."""
    @property
    def quota_free_bytes(self) -> int | None:
        """None: no quota."""
    @property
    def max_arena_pages(self) -> int:
        """The daemon's limit on pages per arena."""
    @property
    def codecs(self) -> list[CodecFit]:
        """One entry per codec asked about."""

class KvBlocks:
    """
    The attention layers' KV blocks of a hybrid prefix snapshot (docs/prefix-store.md, "Hybrid
    entries"): the keys and values of ``layers`` attention layers over ``tokens`` tokens, stored
    under one KV codec. In a staging buffer the values are the streams layer 0 keys, layer 0
    values, layer 1 keys, ... back to back, each ``[tokens][channels]`` row-major (channels =
    kv_heads * head_dim, head-major); ``value_channels`` 0 means keys only (an MLA latent), one
    stream per layer. Not validated when built: the daemon refuses ill-formed blocks
    (InvalidArgument); plain_bytes() and encoded_bytes raise ValueError for them.
    """

    def __init__(
        self,
        *,
        codec: KvCodec,
        layers: int,
        key_channels: int,
        value_channels: int = 0,
        tokens: int,
    ) -> None:
        """Describes KV blocks (no validation: see the class)."""
    @property
    def codec(self) -> KvCodec:
        """The KV codec of every stream."""
    @codec.setter
    def codec(self, value: KvCodec) -> None: ...
    @property
    def layers(self) -> int:
        """Full-attention layers (1..1024)."""
    @layers.setter
    def layers(self, value: int) -> None: ...
    @property
    def key_channels(self) -> int:
        """Channels of a layer's keys: kv_heads * head_dim (1..2^20)."""
    @key_channels.setter
    def key_channels(self, value: int) -> None: ...
    @property
    def value_channels(self) -> int:
        """Channels of a layer's values (0: keys only; at most 2^20)."""
    @value_channels.setter
    def value_channels(self, value: int) -> None: ...
    @property
    def tokens(self) -> int:
        """Tokens of every stream, token 0 the oldest (1..2^32)."""
    @tokens.setter
    def tokens(self, value: int) -> None: ...
    def plain_bytes(self, dtype: DType) -> int:
        """Bytes of the plain values in ``dtype``: the staging range put_snapshot() reads and get_snapshot() writes. ValueError (naming the problem) for ill-formed blocks."""
    @property
    def encoded_bytes(self) -> int:
        """Bytes of every stream encoded, metadata included (what an entry stores: kv_bytes). ValueError for ill-formed blocks."""
    def __eq__(self, arg0: KvBlocks, /) -> bool:  # type: ignore[override]
        """Same codec and shape (False for a non-KvBlocks)."""
    __hash__: ClassVar[None]  # type: ignore[assignment]
    """Unhashable (it defines __eq__)."""
    def __repr__(self) -> str:
        """'KvBlocks(codec=KvCodec.kivi2, layers=..., key_channels=..., value_channels=..., tokens=...)'."""

class SnapshotPut:
    """What put_snapshot() did."""

    @property
    def created(self) -> bool:
        """False: the key had a snapshot for this layout already (nothing copied)."""
    @property
    def evicted(self) -> int:
        """Older snapshots evicted from the arena to make room."""
    @property
    def page_bytes(self) -> int:
        """Bytes of the page copied."""
    @property
    def kv(self) -> KvBlocks | None:
        """The key's entry's KV blocks (the new entry's, or those of the one that stood), or None for a state-only entry."""
    @property
    def kv_bytes(self) -> int:
        """Encoded bytes of those KV blocks (0 without)."""
    @property
    def pages(self) -> int:
        """Pages of the arena the entry holds: 1 + its KV blocks' pages."""
    def __repr__(self) -> str:
        """SnapshotPut(created=..., evicted=...), with kv=..., kv_bytes=..., pages=... for a hybrid entry."""

class SnapshotGet:
    """What get_snapshot() found; true on a hit."""

    @property
    def hit(self) -> bool:
        """True: the slot now holds the snapshot's state."""
    @property
    def other_layouts(self) -> int:
        """On a miss: snapshots of the key for other layouts."""
    @property
    def page_bytes(self) -> int:
        """Bytes of the slot's page."""
    @property
    def tier(self) -> str:
        """On a hit: the tier that served it, pool, host or remote."""
    @property
    def kv(self) -> KvBlocks | None:
        """On a hit of a hybrid entry: its KV blocks (with or without kv_staging); else None."""
    @property
    def kv_bytes(self) -> int:
        """Encoded bytes of those KV blocks (0 without)."""
    @property
    def kv_delivered(self) -> bool:
        """True: the KV blocks were decoded into the kv_staging range."""
    def __bool__(self) -> bool:
        """hit."""
    def __repr__(self) -> str:
        """SnapshotGet(hit=...), with kv=..., kv_bytes=..., kv_delivered=... for a hybrid entry."""

class SnapshotInfo:
    """One snapshot in list_snapshots()."""

    @property
    def prefix(self) -> bytes:
        """The key's prefix bytes."""
    @property
    def position(self) -> int:
        """The key's token position."""
    @property
    def layout_id(self) -> int:
        """The layout it is bound to."""
    @property
    def layout_name(self) -> str:
        """That layout's name."""
    @property
    def codec(self) -> CodecId:
        """That layout's codec."""
    @property
    def tenant(self) -> str:
        """The publisher."""
    @property
    def arena_id(self) -> int:
        """The publisher's arena that holds the page."""
    @property
    def page_bytes(self) -> int:
        """Bytes of its page."""
    @property
    def fp32_bytes(self) -> int:
        """The same state with every value in FP32."""
    @property
    def pinned(self) -> bool:
        """Never evicted."""
    @property
    def hits(self) -> int:
        """get_snapshot hits on it."""
    @property
    def age_seconds(self) -> float:
        """Since it was published."""
    @property
    def idle_seconds(self) -> float:
        """Since it was published or last read."""
    @property
    def kv(self) -> KvBlocks | None:
        """A hybrid entry's KV blocks, or None."""
    @property
    def kv_bytes(self) -> int:
        """Encoded bytes of its KV blocks (0 without)."""
    @property
    def pages(self) -> int:
        """Pages of the arena it holds: 1 + its KV blocks' pages."""
    @property
    def layout_digest(self) -> str:
        """Names its layout across daemons (16 hex digits): export_snapshot()'s layout_digest."""

class SnapshotExport:
    """What export_snapshot() found; true when found."""

    @property
    def found(self) -> bool:
        """True: the key has a snapshot (for the layout asked for)."""
    @property
    def value_bytes(self) -> int:
        """Bytes of the value: written into the staging buffer, or needed there."""
    @property
    def layout_digest(self) -> str:
        """The digest of the entry's layout."""
    @property
    def kv(self) -> KvBlocks | None:
        """A hybrid entry's KV blocks (in the value), or None."""
    def __bool__(self) -> bool:
        """found."""
    def __repr__(self) -> str:
        """SnapshotExport(found=...), with value_bytes=..., layout_digest='...' when found and kv=... for a hybrid entry."""

class SnapshotImport:
    """What import_snapshot() did."""

    @property
    def created(self) -> bool:
        """False: the key had a snapshot for this layout already (nothing copied)."""
    @property
    def evicted(self) -> int:
        """Older snapshots evicted from the arena to make room."""
    @property
    def arena_id(self) -> int:
        """This tenant's arena that holds it."""
    @property
    def prefix(self) -> bytes:
        """The key's prefix bytes (the value's key)."""
    @property
    def position(self) -> int:
        """The key's token position."""
    @property
    def kv(self) -> KvBlocks | None:
        """The entry's KV blocks, or None for a state-only entry."""
    @property
    def pages(self) -> int:
        """Pages of the arena the entry holds: 1 + its KV blocks' pages."""
    def __repr__(self) -> str:
        """SnapshotImport(created=..., evicted=..., arena_id=..., prefix=b'...', position=..., pages=...), with kv=... for a hybrid entry."""

class SnapshotList:
    """What list_snapshots() returns."""

    @property
    def snapshots(self) -> list[SnapshotInfo]:
        """The snapshots found, in key order."""
    @property
    def truncated(self) -> bool:
        """More matched than the limit."""
    @property
    def snapshot_namespace(self) -> str:
        """The namespace this tenant's keys live in."""

class Pending:
    """An operation the daemon may still run on its device."""

    @property
    def bytes(self) -> int:
        """As compress() / decompress() return (0 for copy)."""
    @property
    def event(self) -> builtins.bytes | None:  # builtins.: the property bytes shadows it
        """The 64 bytes of a cudaIpcEventHandle_t that completes with the work, or None when the work was done already (host backend)."""
    def synchronize(self) -> None:
        """
        Blocks this thread (the GIL released) until the daemon's device work is done. Returns at once
        when there is no event (the host backend: the work was done when the reply came). Call it
        before the next request on the connection that returned this Pending. RuntimeError (no event
        waited for) in a module built without CUDA.
        """
    def wait(self, stream: int) -> None:
        """
        Makes CUDA stream ``stream`` wait for the daemon's device work, without blocking this thread
        (cudaStreamWaitEvent on the daemon's IPC event): an int handle such as
        torch.cuda.current_stream().cuda_stream, 0 the legacy default stream. Nothing to do when there
        is no event. Call it before the next request on the connection that returned this Pending.
        RuntimeError (for an event) in a module built without CUDA.
        """

class ArenaClose:
    """What close_arena() gave back."""

    @property
    def bytes(self) -> int:
        """The arena's bytes, charged to no quota any more."""
    @property
    def snapshots_dropped(self) -> int:
        """Its unpinned snapshots, evicted from the pool."""
    def __repr__(self) -> str:
        """ArenaClose(bytes=..., snapshots_dropped=...)."""

# --- client: slots, staging, arenas ----------------------------------------------------------

class Slot:
    """
    One allocated page of an arena, owned by this connection's lease. Freed on the daemon when
    the object is garbage-collected, when a ``with`` block ends, or by free(); release() keeps it
    allocated (to adopt it again after a reconnect with the lease token).
    """

    @property
    def id(self) -> int:
        """The slot id (the page's index in its arena)."""
    @property
    def arena_id(self) -> int:
        """The arena's id."""
    @property
    def valid(self) -> bool:
        """False once freed or released."""
    def release(self) -> int:
        """Gives up ownership without freeing; returns the slot id."""
    def free(self) -> None:
        """Frees the slot on the daemon now."""
    def __enter__(self) -> Self:
        """The slot itself."""
    def __exit__(self, *args: object) -> None:
        """Frees the slot unless it was freed or released already."""
    def __repr__(self) -> str:
        """'<statepool.Slot arena=... id=...>'."""

class Staging:
    """
    A staging buffer shared with the daemon: full-precision states are written here before
    compress() and read from here after decompress(). view() gives zero-copy numpy/PyTorch access.
    Closed on the daemon when garbage-collected, when a ``with`` block ends, or by close().
    """

    @property
    def id(self) -> int:
        """The daemon's id of the buffer."""
    @property
    def size(self) -> int:
        """Bytes (at least what was asked for)."""
    @property
    def fd(self) -> int:
        """The received descriptor (owned by the buffer; dup() it to keep it longer)."""
    @property
    def valid(self) -> bool:
        """False once closed."""
    @property
    def memory_space(self) -> str:
        """'host' or 'device'."""
    @property
    def device_ptr(self) -> int:
        """Device address when device memory is mapped here, else 0."""
    def view(
        self,
        dtype: DTypeLike | None = None,
        shape: int | Sequence[int] | None = None,
        offset: int = 0,
    ) -> View:
        """
        A zero-copy view of the buffer: ``dtype`` elements (default uint8) in ``shape`` (default:
        the rest of the buffer) from byte ``offset``. numpy.asarray(view), torch.from_dlpack(view).
        """
    def close(self) -> None:
        """Closes the buffer on the daemon now. BufferError while views of it are alive."""
    def __enter__(self) -> Self:
        """The buffer itself."""
    def __exit__(self, *args: object) -> None:
        """close() unless closed already (BufferError while views of it are alive)."""
    def __repr__(self) -> str:
        """'<statepool.Staging id=... size=...>'."""

class Arena:
    """
    A mapped arena: page_count pages of page_bytes each, page_stride apart. Owns the received
    descriptor and the mapping (close() or the end of a ``with`` block unmaps it locally; arenas
    live on in the daemon). page(slot) views one page; decode(slot, out) decodes it here.
    """

    @property
    def id(self) -> int:
        """The arena's id."""
    @property
    def layout_id(self) -> int:
        """The id of its layout."""
    @property
    def page_bytes(self) -> int:
        """Exact bytes of one page."""
    @property
    def page_stride(self) -> int:
        """Bytes from one page to the next."""
    @property
    def page_count(self) -> int:
        """Pages in the arena."""
    @property
    def bytes(self) -> int:
        """Size of the whole region, page_count * page_stride."""
    @property
    def backend(self) -> str:
        """'host' or 'cuda'."""
    @property
    def created(self) -> bool:
        """False when an existing arena of the tenant was opened."""
    @property
    def mapped(self) -> bool:
        """True when host memory is mapped here."""
    @property
    def fd(self) -> int:
        """The received descriptor (owned by the arena; dup() it to keep it longer); -1 when the handle kind is not a descriptor."""
    @property
    def memory_space(self) -> str:
        """'host' or 'device'."""
    @property
    def device_ptr(self) -> int:
        """Device address when device memory is mapped here, else 0."""
    @property
    def has_codec(self) -> bool:
        """True when a PageCodec for the layout is available (the layout was registered through the same Connection, or the arena was opened from a LayoutInfo)."""
    @property
    def codec(self) -> PageCodec:
        """The arena's page format (a PageCodec)."""
    def page(self, slot: Slot | int) -> View:
        """A uint8 view of one page (a Slot or a slot id)."""
    def pages(self) -> View:
        """A uint8 view of the whole mapping, shape (page_count, page_stride)."""
    def decode(
        self,
        slot: Slot | int,
        out: _BufferLike | _DeviceBufferLike,
        dtype: DType = DType.f32,
        *,
        stream: int = 0,
    ) -> None:
        """
        Decodes page ``slot`` here, with the daemon's codec code, into ``out``: the staged state,
        codec.staged_bytes(dtype) bytes. A host arena decodes on the CPU into a C-contiguous host
        buffer (numpy array, CPU tensor). A device arena (cuda backend, mapped here; a module built
        with CUDA) decodes with the daemon's CUDA kernels into device memory on the arena's device (a
        CUDA tensor, a device View: DLPack or __cuda_array_interface__) on CUDA stream ``stream`` (an
        int handle such as torch.cuda.Stream.cuda_stream; 0 the legacy default stream) and returns
        when it is done; DeviceDecoder decodes without waiting.
        """
    def close(self) -> None:
        """Unmaps the arena here (the daemon keeps it). BufferError while views are alive."""
    def __enter__(self) -> Self:
        """The arena itself."""
    def __exit__(self, *args: object) -> None:
        """Unmaps the arena here (BufferError while views are alive)."""
    def __repr__(self) -> str:
        """'<statepool.Arena id=... pages=... page_bytes=... backend=...>'."""

# --- client: the fused decode step ---------------------------------------------------------

class StepResult:
    """What one fused step could not store."""

    @property
    def rejected_heads(self) -> int:
        """Heads whose new state was not finite (their page bytes are unchanged)."""
    @property
    def first_rejected_request(self) -> int:
        """The batch index of the first rejected (request, head), when rejected_heads > 0."""
    @property
    def first_rejected_head(self) -> int:
        """The head of the first rejected (request, head), when rejected_heads > 0."""
    @property
    def ok(self) -> bool:
        """No head was rejected."""
    def __bool__(self) -> bool:
        """ok."""

class DecodeStep:
    """The fused gated-delta-rule step on an arena's pages, run here every token without the daemon
(docs/client.md, "The fused decode step"): one call advances one layer of a batch of requests
by one token, unpacking, updating and repacking each request's compressed page in place.
Host arenas only (the host backend). Keeps the arena mapped while it exists."""

    def __init__(self, arena: Arena, threads: int = 0) -> None:
        """``threads``: 0 = every core, 1 = the calling thread only. RuntimeError when the arena is not host memory mapped here, or was not opened from a registered layout."""
    @property
    def threads(self) -> int:
        """Threads a call uses, the caller's included."""
    @property
    def codec(self) -> PageCodec:
        """The arena's page format."""
    def run(
        self,
        layer: int,
        slots: Sequence[Slot | int],
        q: _BufferLike,
        k: _BufferLike,
        v: _BufferLike,
        log_decay: _BufferLike,
        beta: _BufferLike,
        out: _BufferLike,
        *,
        qk_heads: int = 0,
    ) -> StepResult:
        """One step of ``layer`` for the requests whose pages are ``slots`` (Slot objects or ids, in
batch order). float32 C-contiguous buffers (numpy arrays, CPU tensors): q and k
[batch][qk_heads][K] (L2-normalised, q scaled by 1/sqrt(K)), v [batch][H][V], log_decay
[batch][H] (GDN) or [batch][H][K] (KDA), beta [batch][H], out [batch][H][V] (written).
``qk_heads`` 0 means H. ValueError when a size does not fit (nothing written); a head whose
new state is not finite keeps its old bytes and is counted in the StepResult."""

# --- client: CUDA (a module built with CUDA; RuntimeError otherwise) ------------------------

class DeviceDecoder:
    """
    Decodes pages of a device arena (the cuda backend, mapped here) on the engine's CUDA stream
    with the daemon's own kernels, without a round trip: byte for byte what the daemon's
    decompress() writes. The page format's tables are uploaded once, when it is made; decode()
    only enqueues. Keeps the arena mapped while it exists (Arena.close() refuses). Needs a
    module built with CUDA (HAVE_CUDA).
    """

    def __init__(self, arena: Arena, dtype: DType = DType.f32) -> None:
        """``dtype``: the staged recurrent part's type (f32 or bf16). ValueError for an arena that is not device memory mapped here or has no page format."""
    @property
    def dtype(self) -> DType:
        """The staged recurrent part's type."""
    @property
    def staged_bytes(self) -> int:
        """Bytes decode() writes: the staged state (codec.staged_bytes(dtype))."""
    def decode(self, slot: Slot | int, out: _DeviceBufferLike, *, stream: int = 0) -> None:
        """
        Enqueues on CUDA stream ``stream`` (an int handle, 0 the legacy default stream): ``out`` <-
        the staged state of page ``slot`` (a Slot of the arena or an id). ``out`` is device memory on
        the arena's device, C-contiguous, staged_bytes bytes: a CUDA tensor or a device View (DLPack)
        or anything with __cuda_array_interface__. Returns without waiting: keep ``out`` and this
        decoder alive until the stream has run it. IndexError for a slot outside the arena.
        """

class DeviceDecodeStep:
    """
    The fused gated-delta-rule step on a device arena's pages (the cuda backend, mapped here), on
    the engine's CUDA stream, with no round trip to the daemon: one launch per call advances one
    layer of a batch of requests by one token, decoding, updating and re-encoding each request's
    page in place; bit for bit the host DecodeStep. Keeps the arena mapped while it exists. Needs
    a module built with CUDA (HAVE_CUDA).
    """

    def __init__(self, arena: Arena) -> None:
        """Uploads the page format's tables to the arena's device. ValueError for an arena that is not device memory mapped here or has no page format."""
    @property
    def codec(self) -> PageCodec:
        """The arena's page format."""
    def run(
        self,
        layer: int,
        slots: _DeviceBufferLike,
        q: _DeviceBufferLike,
        k: _DeviceBufferLike,
        v: _DeviceBufferLike,
        log_decay: _DeviceBufferLike,
        beta: _DeviceBufferLike,
        out: _DeviceBufferLike,
        *,
        rejected: _DeviceBufferLike | None = None,
        qk_heads: int = 0,
        stream: int = 0,
    ) -> None:
        """
        Enqueues one step of ``layer`` on CUDA stream ``stream`` (an int handle, 0 the legacy default
        stream) for the requests whose pages are ``slots``: a device array of int32 (or uint32) slot
        ids, one per request, distinct. Every other buffer is C-contiguous float32 device memory on
        the arena's device (CUDA tensors, or __cuda_array_interface__): q and k [batch][qk_heads][K]
        (L2-normalised, q scaled by 1/sqrt(K)), v [batch][H][V], log_decay [batch][H] (GDN) or
        [batch][H][K] (KDA), beta [batch][H], out [batch][H][V] (written). ``rejected``: None or a
        uint8 device array [batch][H], written with 0 (stored), 1 (a non-finite new state: the head
        kept its bytes), 2 (a slot outside the arena: nothing touched) or 3 (an earlier request
        of the batch has the slot: only the first is stepped). ``qk_heads`` 0 means H.
        ValueError/TypeError for what the host can check (the layer, a size or type that does not
        fit, host memory), before anything is launched. Returns without waiting.
        """

# --- client: connections -------------------------------------------------------------------

def connect(
    socket_path: str = "/run/statepool/statepool.sock",
    *,
    tenant: str = "",
    lease_token: str = "",
    client_name: str = "",
    timeout: float = 10.0,
    max_reply_bytes: int = 16777216,
    map_device_memory: bool = True,
    legacy_ipc: bool = False,
) -> Connection:
    """
    Connects to statepoold and says Hello. ``socket_path``: the daemon's Unix socket ('@name' for an
    abstract one); ``tenant``: '' for the daemon's default; ``lease_token``: from an earlier
    connection's lease_token, to get its slots back within the grace period; ``timeout``: seconds
    each call may take (0 waits forever). TransportError when the daemon cannot be reached.
    """

def connect_fd(
    fd: int,
    *,
    tenant: str = "",
    lease_token: str = "",
    client_name: str = "",
    timeout: float = 10.0,
) -> Connection:
    """Says Hello on an already connected stream socket (e.g. socket.detach() of one end of a socketpair); the descriptor is owned from then on."""

class Connection:
    """
    One connection to statepoold, with its lease (statepool.connect()). Every method that talks to
    the daemon releases the GIL; several threads may share one connection (its requests are
    serialized). Daemon refusals raise a statepool.DaemonError subclass (QuotaExceeded, ...);
    transport failures raise statepool.TransportError, after which the connection is unusable.
    """

    @property
    def lease_token(self) -> str:
        """The lease's token: connect(lease_token=...) gets its slots back within the grace period."""
    @property
    def lease_resumed(self) -> bool:
        """True when connect()'s lease_token named a lease still within its grace period."""
    @property
    def resumed_slots(self) -> int:
        """Slots that came back with a resumed lease (take them over with adopt())."""
    @property
    def grace_period(self) -> float:
        """Seconds the daemon keeps this lease's slots after the connection drops."""
    @property
    def protocol_version(self) -> int:
        """The protocol version agreed on in Hello."""
    @property
    def server(self) -> str:
        """Daemon name and version."""
    @property
    def max_frame_bytes(self) -> int:
        """Largest frame the daemon accepts, in bytes."""
    @property
    def healthy(self) -> bool:
        """False once the connection is broken (after a TransportError, or after the daemon answered protocol_error / not_hello / unsupported_version) or closed."""
    def register_layout(self, layout: StateLayout) -> LayoutInfo:
        """Registers (or finds) a layout; installs a stepquant layout's plan first if needed."""
    def install_plan(self, plan: Plan) -> PlanInfo:
        """Sends a STEPQuant plan (idempotent)."""
    @overload
    def open_arena(self, layout: LayoutInfo, pages: int = 0) -> Arena:
        """
        Opens (or creates) an arena of the tenant for a layout with at least ``pages`` pages and maps
        it; 0 takes any existing one or the daemon's default size.
        """
    @overload
    def open_arena(self, layout_id: int, pages: int = 0) -> Arena:
        """open_arena() by the id of a registered layout."""
    @overload
    def close_arena(self, arena: Arena) -> ArenaClose:
        """
        Gives an arena's memory back to the daemon: its bytes leave the tenant's quota and the pool,
        its unpinned snapshots are dropped, and its id is never used again (later calls naming it
        raise NotFound). The arena is unmapped here first, whatever the daemon answers (after an
        error it still exists in the daemon: retry by id, or open_arena() maps it again).
        BufferError, before anything is sent, while views, a DecodeStep or a device decoder of it
        are alive. InUse while a lease holds one of its pages (free every Slot first), while it
        holds a pinned snapshot or one being read or published, or while another connection that
        opened it is still connected.
        """
    @overload
    def close_arena(self, arena_id: int) -> ArenaClose:
        """close_arena() by id, for an arena this process has not mapped (or has unmapped)."""
    def open_staging(self, bytes: int) -> Staging:
        """Opens a staging buffer of at least ``bytes`` bytes."""
    @overload
    def allocate(self, arena: Arena, count: int = 1) -> list[Slot]:
        """Allocates ``count`` slots of an arena, all or none (PoolExhausted when full)."""
    @overload
    def allocate(self, arena_id: int, count: int = 1) -> list[Slot]:
        """allocate() by the arena's id (an arena this process has not opened: the slots are used by id)."""
    def adopt(self, arena_id: int, slot_id: int) -> Slot:
        """Takes ownership of a slot this lease holds (released, or back with a resumed lease)."""
    @overload
    def free(self, slots: Sequence[Slot]) -> int:
        """Frees Slot objects, one request per arena; returns how many."""
    @overload
    def free(self, arena_id: int, slot_ids: Sequence[int]) -> int:
        """Frees slot ids of one arena (released ones)."""
    @overload
    def compress(
        self, slot: Slot, staging: Staging, offset: int = 0, dtype: DType = DType.f32, *, after: bytes | None = None
    ) -> int:
        """
        page[slot] <- the state staged at staging[offset:]. Returns the page bytes written. NotFinite
        (the page unchanged) when the state holds NaN or Inf. ``after`` (cuda backend): the 64-byte
        IPC handle of an interprocess event recorded on the engine's stream after it wrote the state
        (``torch.cuda.Event(interprocess=True)``, ``.record()``, ``.ipc_handle()``); the daemon's
        stream waits for it. The same ``after`` exists on decompress, copy and their _async forms.
        """
    @overload
    def compress(
        self,
        arena_id: int,
        slot_id: int,
        staging_id: int,
        offset: int = 0,
        dtype: DType = DType.f32,
        *, after: bytes | None = None,
    ) -> int:
        """compress() by ids: arena, slot and staging buffer."""
    @overload
    def decompress(
        self, slot: Slot, staging: Staging, offset: int = 0, dtype: DType = DType.f32, *, after: bytes | None = None
    ) -> int:
        """staging[offset:] <- the state of page[slot]. Returns the state bytes written."""
    @overload
    def decompress(
        self,
        arena_id: int,
        slot_id: int,
        staging_id: int,
        offset: int = 0,
        dtype: DType = DType.f32,
        *, after: bytes | None = None,
    ) -> int:
        """decompress() by ids: arena, slot and staging buffer."""
    @overload
    def copy(self, src: Slot, dst: Slot, *, after: bytes | None = None) -> None:
        """Copies a whole page (both slots of one arena)."""
    @overload
    def copy(self, arena_id: int, src_id: int, dst_id: int, *, after: bytes | None = None) -> None:
        """copy() by ids: the arena and its two slots."""
    def compress_async(
        self,
        arena_id: int,
        slot_id: int,
        staging_id: int,
        offset: int = 0,
        dtype: DType = DType.f32,
        *, after: bytes | None = None,
    ) -> Pending:
        """compress() without waiting for the device (cuda backend): see Pending."""
    def decompress_async(
        self,
        arena_id: int,
        slot_id: int,
        staging_id: int,
        offset: int = 0,
        dtype: DType = DType.f32,
        *, after: bytes | None = None,
    ) -> Pending:
        """decompress() without waiting for the device (cuda backend): see Pending."""
    def copy_async(self, arena_id: int, src_id: int, dst_id: int, *, after: bytes | None = None) -> Pending:
        """copy() without waiting for the device (cuda backend): see Pending."""
    def stats(self) -> Stats:
        """The daemon's arenas, tenants, leases and pool."""
    def plan_capacity(
        self,
        model_config: str,
        *,
        weight_bits: int = 0,
        kv: str = "",
        codecs: Sequence[CodecId] = [],
        slots: int = 0,
        context: int = 0,
        gpu_memory: int = 0,
        reserved: float | None = None,
        tp: int = 0,
        concurrency: int | None = None,
    ) -> dict[str, Any]:
        """
        The daemon's capacity plan for a model (the text of its config.json), as the dict of
        docs/capacity.md (what ``statepoolctl plan --json`` prints, plus "fits_now"). Zero/empty/None
        arguments take the planner's defaults.
        """
    @overload
    def put_snapshot(
        self,
        slot: Slot,
        prefix: bytes | str,
        position: int,
        kv: KvBlocks | None = None,
        kv_staging: Staging | None = None,
        kv_offset: int = 0,
        kv_dtype: DType = DType.bf16,
    ) -> SnapshotPut:
        """
        Publishes the state in ``slot`` under the key (prefix: the engine's prefix hash, 1..256 bytes,
        str or bytes; position: the token position). Idempotent: a key that has a snapshot for this
        layout keeps it (created is False). docs/prefix-store.md.

        With ``kv`` (KvBlocks), a hybrid entry: the daemon reads the KV values from this connection's
        staging buffer ``kv_staging`` at byte ``kv_offset`` (kv.plain_bytes(kv_dtype) bytes of
        ``kv_dtype``: f32, bf16 or f16), encodes them with kv.codec and keeps them in further pages of
        the arena (the result's pages and kv_bytes). NotFinite for a NaN/Inf value, InvalidArgument
        for ill-formed blocks or blocks that need more pages than the arena has; in both cases
        nothing is published. ValueError, before anything is sent, for kv without kv_staging or the
        reverse.
        """
    @overload
    def put_snapshot(
        self,
        arena_id: int,
        slot_id: int,
        prefix: bytes | str,
        position: int,
        kv: KvBlocks | None = None,
        kv_staging: Staging | None = None,
        kv_offset: int = 0,
        kv_dtype: DType = DType.bf16,
    ) -> SnapshotPut:
        """put_snapshot() by ids: the arena and a slot of this lease (a released or adopted one)."""
    @overload
    def get_snapshot(
        self,
        prefix: bytes | str,
        position: int,
        slot: Slot,
        kv_staging: Staging | None = None,
        kv_offset: int = 0,
        kv_dtype: DType = DType.bf16,
    ) -> SnapshotGet:
        """
        Copies the key's snapshot for the slot's layout into ``slot``; a miss (false result) leaves it
        unchanged.

        With ``kv_staging`` (a staging buffer of this connection), a hit on a hybrid entry also decodes
        its KV blocks into it at byte ``kv_offset``, as ``kv_dtype`` values (kv.plain_bytes(kv_dtype)
        bytes; a range too small is InvalidArgument and leaves the slot unchanged); kv_delivered says
        so. Without it the result still names the blocks (kv, kv_bytes) and kv_delivered is False.
        """
    @overload
    def get_snapshot(
        self,
        prefix: bytes | str,
        position: int,
        arena_id: int,
        slot_id: int,
        kv_staging: Staging | None = None,
        kv_offset: int = 0,
        kv_dtype: DType = DType.bf16,
    ) -> SnapshotGet:
        """get_snapshot() by ids: the arena and a slot of this lease (a released or adopted one)."""
    def export_snapshot(
        self,
        prefix: bytes | str,
        position: int,
        staging: Staging | None = None,
        offset: int = 0,
        layout_digest: str = "",
    ) -> SnapshotExport:
        """
        Writes the key's snapshot into ``staging`` (a staging buffer of this connection) at byte
        ``offset`` as one self-checking value: header, page, KV blocks, CRC-32, the format of
        ``statepoolctl snapshot-get`` files (docs/prefix-store.md, "Moving snapshots"). With
        ``layout_digest`` (SnapshotInfo.layout_digest) the entry of that layout, else the key's
        first. Without ``staging`` only asks: found and value_bytes (the range it needs). A miss is
        no error (found False); a range too small is InvalidArgument. export_snapshot_bytes() does
        it all in one call.
        """
    def import_snapshot(self, staging: Staging, offset: int, bytes: int) -> SnapshotImport:
        """
        Publishes a value made by export_snapshot() (by this daemon or another), ``bytes`` bytes of
        ``staging`` from byte ``offset``, under the value's key in this tenant's namespace, into the
        tenant's arena of the value's layout (same layout, codec and plan: an engine of the model must
        have opened one, else NotFound). As put_snapshot(): idempotent, evicting. InvalidArgument,
        naming the problem (checksum mismatch, truncated, another format), for a value it refuses;
        nothing is published then.
        """
    def export_snapshot_bytes(
        self, prefix: bytes | str, position: int, layout_digest: str = ""
    ) -> bytes | None:
        """
        The key's snapshot as one self-checking value (the bytes of a ``statepoolctl snapshot-get``
        file), or None when it has none: asks the size, opens a staging buffer of it, exports,
        copies the bytes out and closes the buffer. RuntimeError where staging buffers are not host
        memory (the cuda backend).
        """
    def import_snapshot_bytes(self, data: bytes) -> SnapshotImport:
        """
        Publishes a value from export_snapshot_bytes() (or a ``statepoolctl snapshot-get`` file) as
        import_snapshot() does, through a staging buffer it opens and closes. ValueError for empty
        ``data``; RuntimeError where staging buffers are not host memory (the cuda backend).
        """
    def delete_snapshot(self, prefix: bytes | str, position: int) -> int:
        """Deletes the key's snapshots (every layout, pinned ones too); returns how many."""
    def pin_snapshot(self, prefix: bytes | str, position: int, pinned: bool = True) -> int:
        """Pins (never evicted) or unpins the key's snapshots; returns how many changed."""
    def list_snapshots(self, prefix: bytes | str = b"", limit: int = 0) -> SnapshotList:
        """Snapshots of the namespace whose prefix starts with ``prefix``, in key order, at most ``limit`` (0 = 1000)."""
    def fits_now(self, layout: LayoutInfo, slots: int = 1, codecs: Sequence[CodecId] = []) -> Fits:
        """How many more requests of this state shape fit now, per codec."""
    def ping(self) -> float:
        """One round trip; returns its duration in seconds."""
    def drain(self) -> None:
        """Asks the daemon to drain and exit (the daemon's uid or root only)."""
    def close(self) -> None:
        """Closes the connection (slots and staging buffers still alive keep the socket open until they
go; a call in flight on another thread finishes first). Later calls raise
TransportError(kind='closed')."""
    def __enter__(self) -> Self:
        """The connection itself."""
    def __exit__(self, *args: object) -> None:
        """close()."""
    def __repr__(self) -> str:
        """'<statepool.Connection healthy>' or '<statepool.Connection closed>'."""
