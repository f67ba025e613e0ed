"""statepool: compressed recurrent-state memory for hybrid linear-attention LLMs.

The Python face of statepool's C++ client library: connect to a running ``statepoold``,
register state layouts, open arenas and staging buffers, allocate slots, and park
(compress) and resume (decompress) request states, with zero-copy numpy/PyTorch views of the
shared memory. :mod:`statepool.engine` has a state pool with the interface serving engines
already use. docs/python.md is the walk-through::

    import statepool, torch
    with statepool.connect("/run/statepool/statepool.sock", tenant="team-a") as conn:
        layout = statepool.StateLayout(arch=statepool.Arch.gdn, num_layers=2, num_heads=4,
                                       key_dim=64, value_dim=64,
                                       codec=statepool.CodecId.int8)
        info = conn.register_layout(layout)
        arena = conn.open_arena(info, pages=16)
        staging = conn.open_staging(info.state_bytes_f32)
        state = torch.from_dlpack(staging.view("float32"))   # shares the buffer
        with conn.allocate(arena)[0] as slot:
            state.normal_()
            conn.compress(slot, staging)     # park: the page holds it, 8 bits per value
            conn.decompress(slot, staging)   # resume into the same buffer
"""

from __future__ import annotations

from . import errors
from ._core import (
    DEFAULT_SOCKET_PATH,
    HAVE_CUDA,
    Arch,
    Arena,
    ArenaClose,
    ArenaStats,
    CodecFit,
    CodecId,
    Connection,
    DType,
    DecodeStep,
    DeviceDecoder,
    DeviceDecodeStep,
    Fits,
    KvBlocks,
    KvCodec,
    KvRange,
    LayoutInfo,
    PageCodec,
    Pending,
    Plan,
    PlanInfo,
    Slot,
    SnapshotExport,
    SnapshotGet,
    SnapshotGetEntry,
    SnapshotGetResult,
    SnapshotGets,
    SnapshotImport,
    SnapshotInfo,
    SnapshotList,
    SnapshotLookup,
    SnapshotPut,
    SnapshotPutEntry,
    SnapshotPutResult,
    SnapshotPuts,
    SnapshotTier,
    Staging,
    StateLayout,
    StateRange,
    Stats,
    Status,
    StepQuantVariant,
    StepMode,
    StepResult,
    TenantStats,
    View,
    connect,
    connect_fd,
)
from .errors import (
    DaemonError,
    Draining,
    InUse,
    Internal,
    InvalidArgument,
    LeaseBusy,
    NotFinite,
    NotFound,
    NotHello,
    NotOwner,
    PermissionDenied,
    PoolExhausted,
    ProtocolError,
    QuotaExceeded,
    StatepoolError,
    TooManyConnections,
    TransportError,
    UnknownTenant,
    UnsupportedVersion,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_SOCKET_PATH", "HAVE_CUDA", "Arch", "Arena", "ArenaClose", "ArenaStats", "CodecFit",
    "CodecId", "Connection", "DType", "DecodeStep", "DeviceDecoder", "DeviceDecodeStep", "Fits",
    "KvBlocks", "KvCodec", "KvRange", "LayoutInfo", "PageCodec", "Pending",
    "Plan", "PlanInfo", "Slot",
    "SnapshotExport", "SnapshotGet", "SnapshotGetEntry", "SnapshotGetResult", "SnapshotGets",
    "SnapshotImport", "SnapshotInfo", "SnapshotList", "SnapshotLookup", "SnapshotPut",
    "SnapshotPutEntry", "SnapshotPutResult", "SnapshotPuts", "SnapshotTier",
    "Staging", "StateLayout", "StateRange", "Stats", "Status", "StepMode", "StepQuantVariant", "StepResult", "TenantStats", "View",
    "connect", "connect_fd", "errors",
    # statepool.errors
    "StatepoolError", "DaemonError", "TransportError", "Draining", "InUse", "Internal",
    "InvalidArgument", "LeaseBusy", "NotFinite", "NotFound", "NotHello", "NotOwner",
    "PermissionDenied", "PoolExhausted", "ProtocolError", "QuotaExceeded",
    "TooManyConnections", "UnknownTenant", "UnsupportedVersion",
]
