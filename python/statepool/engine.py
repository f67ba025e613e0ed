"""State pools with the interfaces serving engines already have, backed by statepool.

An engine keeps the states of its *running* requests in its own tensors, where its kernels
update them every token. A request that is preempted, retracted or waiting for its next
turn does not need its state there: parking compresses it into a statepool page (about a
fifth of the FP32 bytes at 6 bits) and frees the engine's slot; resuming decompresses it
into whichever slot the request gets next. docs/python.md shows how an engine swaps its
pool for these.

- :class:`MambaPool` has the interface and the tensor shapes of SGLang's ``MambaPool``
  (``mamba_cache.conv`` ``[layers][size + 1][conv_dim][conv_kernel - 1]``,
  ``mamba_cache.temporal`` ``[layers][size + 1][heads][key_dim][value_dim]``, slot 0 is the
  padding slot); ``get_cpu_copy`` / ``load_cpu_copy`` park and resume.
- :class:`MambaBlocks` parks and resumes the per-request state blocks of vLLM's mamba
  layers: one ``(conv_state, ssm_state)`` pair of tensors per layer, indexed by block id.

Both need the state shape as a :class:`statepool.StateLayout` (``conv_channels`` is the
conv dim, ``conv_width`` the kernel size minus one); its codec is how parked states are
stored. The staged dtype of the recurrent part follows the engine's tensors (float32 or
bfloat16); the conv state keeps its bytes (``layout.conv_dtype`` must be the tensors').
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import List, Optional, Sequence, Tuple

import torch

from ._core import Arena, Connection, DType, LayoutInfo, Slot, StateLayout

__all__ = ["ParkedStates", "MambaPool", "MambaBlocks"]

_TORCH_DTYPE = {DType.f32: torch.float32, DType.bf16: torch.bfloat16, DType.f16: torch.float16}
_STAGE_ALIGN = 64  # bytes between staged states in the staging buffer


def _staged_dtype(dtype: torch.dtype) -> DType:
    for staged, torch_dtype in _TORCH_DTYPE.items():
        if torch_dtype == dtype and staged != DType.f16:
            return staged
    raise TypeError(f"temporal (recurrent) state must be float32 or bfloat16, not {dtype}")


def _indices(index) -> List[int]:
    if isinstance(index, torch.Tensor):
        return [int(i) for i in index.reshape(-1).tolist()]
    if isinstance(index, int):
        return [index]
    return [int(i) for i in index]


class ParkedStates:
    """States parked in statepool pages, one per request, in the order they were parked.

    Returned by ``park`` / ``get_cpu_copy`` and consumed by ``resume`` / ``load_cpu_copy``,
    which free the pages. Dropping the object frees them too.
    """

    def __init__(self, slots: List[Slot], page_bytes: int, state_bytes: int,
                 arena_id: int, layout_id: int) -> None:
        self._slots = slots
        self.arena_id = arena_id  #: the arena whose pages hold them
        self.layout_id = layout_id  #: the layout they were parked with
        self.page_bytes = page_bytes  #: bytes of one parked state (one page)
        self.state_bytes = state_bytes  #: bytes of one state in the engine's dtypes

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def nbytes(self) -> int:
        """Page bytes the parked states take in the pool."""
        return self.page_bytes * len(self._slots)

    @property
    def slots(self) -> Tuple[Slot, ...]:
        """The pages (statepool.Slot), for copy() or a later adopt() by id."""
        return tuple(self._slots)

    @property
    def compression_ratio(self) -> float:
        """State bytes in the engine's tensors per parked byte."""
        return self.state_bytes / self.page_bytes

    def __repr__(self) -> str:
        return f"<statepool.engine.ParkedStates {len(self)} states, {self.nbytes} bytes>"


class _Parker:
    """Parks states into pages of one arena and resumes them, through one staging buffer
    that holds ``batch`` staged states at a time (each is its own Compress/Decompress
    request, so a larger batch only gathers more states per round; it costs ``batch`` staged
    states of staging memory). Subclasses say how a request's state is read from and
    written into the engine's tensors."""

    def __init__(self, conn: Connection, layout: StateLayout, temporal_dtype: torch.dtype,
                 conv_dtype: torch.dtype, capacity: int, batch: int,
                 conv_split: Optional[Sequence[int]]) -> None:
        self._parked: "weakref.WeakSet[ParkedStates]" = weakref.WeakSet()
        if capacity <= 0 or batch <= 0:
            raise ValueError("capacity and batch must be positive")
        split = list(conv_split) if conv_split else [layout.conv_channels]
        if sum(split) != layout.conv_channels or min(split) < 0:
            raise ValueError(f"conv_split {split} does not add up to the layout's "
                             f"conv_channels {layout.conv_channels}")
        # Channel ranges of the conv tensors inside the staged conv state [layers][C][W].
        starts = [sum(split[:i]) for i in range(len(split))]
        self._conv_parts = [(a, a + n) for a, n in zip(starts, split)] \
            if layout.conv_channels else []
        if layout.conv_channels and _TORCH_DTYPE[layout.conv_dtype] != conv_dtype:
            raise TypeError(f"the conv state tensors are {conv_dtype}, the layout's conv_dtype "
                            f"is {layout.conv_dtype.name}")
        self.conn = conn
        self.staged = _staged_dtype(temporal_dtype)
        self.info: LayoutInfo = conn.register_layout(layout)
        self.arena: Arena = conn.open_arena(self.info, capacity)
        l = layout
        self._rec_shape = (l.num_layers, l.num_heads, l.key_dim, l.value_dim)
        self._conv_shape = (l.num_layers, l.conv_channels, l.conv_width)
        itemsize = torch.empty((), dtype=temporal_dtype).element_size()
        rec_bytes = l.num_layers * l.num_heads * l.key_dim * l.value_dim * itemsize
        state_bytes = self.info.state_bytes(self.staged)
        self._stride = -(-state_bytes // _STAGE_ALIGN) * _STAGE_ALIGN
        self._batch = batch
        self.staging = conn.open_staging(self._stride * batch)
        self._device_staging = self.staging.memory_space == "device"
        self._rec: List[torch.Tensor] = []
        self._conv: List[Optional[torch.Tensor]] = []
        for i in range(batch):
            offset = i * self._stride
            self._rec.append(torch.from_dlpack(self.staging.view(temporal_dtype,
                                                                 self._rec_shape, offset)))
            self._conv.append(torch.from_dlpack(self.staging.view(
                conv_dtype, self._conv_shape, offset + rec_bytes)) if l.conv_channels else None)

    def _sync(self) -> None:
        """Waits for the copies between the engine's tensors and device staging (the cuda
        backend): the daemon works on its own stream, in its own process."""
        if self._device_staging:
            torch.cuda.current_stream(self._rec[0].device).synchronize()

    # Subclasses: copy request `index`'s state out of / into the engine's tensors (`conv` is
    # None for a layout without conv state; self._conv_parts are its channel ranges).
    def _read(self, index: int, rec: torch.Tensor, conv: Optional[torch.Tensor]) -> None:
        raise NotImplementedError

    def _write(self, index: int, rec: torch.Tensor, conv: Optional[torch.Tensor]) -> None:
        raise NotImplementedError

    def park(self, indices) -> ParkedStates:
        """Compresses the states at ``indices`` into new pages (the engine's slots keep
        their contents; free them yourself). All or nothing: PoolExhausted when the arena
        has too few free pages, NotFinite when a state holds NaN/Inf (nothing is kept)."""
        indices = _indices(indices)
        slots = self.conn.allocate(self.arena, len(indices)) if indices else []
        try:
            for start in range(0, len(indices), self._batch):
                chunk = indices[start:start + self._batch]
                for j, index in enumerate(chunk):
                    self._read(index, self._rec[j], self._conv[j])
                self._sync()  # the staged copies are complete before the daemon reads them
                for j in range(len(chunk)):
                    self.conn.compress(slots[start + j], self.staging, j * self._stride,
                                       self.staged)
        except BaseException:
            self.conn.free(slots)
            raise
        parked = ParkedStates(slots, self.info.page_bytes, self.info.state_bytes(self.staged),
                              self.arena.id, self.info.id)
        self._parked.add(parked)
        return parked

    def resume(self, parked: ParkedStates, indices) -> None:
        """Decompresses parked states into the engine's slots ``indices`` (one per parked
        state, in order) and frees their pages."""
        indices = _indices(indices)
        if parked.layout_id != self.info.id or parked.arena_id != self.arena.id:
            raise ValueError(f"these states were parked with layout {parked.layout_id} in arena "
                             f"{parked.arena_id}; this pool has layout {self.info.id}, arena "
                             f"{self.arena.id}")
        if len(indices) != len(parked):
            raise ValueError(f"{len(parked)} parked states, {len(indices)} indices")
        slots = parked._slots
        for start in range(0, len(indices), self._batch):
            chunk = indices[start:start + self._batch]
            for j in range(len(chunk)):
                self.conn.decompress(slots[start + j], self.staging, j * self._stride,
                                     self.staged)
            for j, index in enumerate(chunk):
                self._write(index, self._rec[j], self._conv[j])
            self._sync()  # ... and read out before the next round overwrites the staging
        self.conn.free(slots)
        parked._slots = []

    @property
    def parked_pages(self) -> int:
        """Pages this pool's parked states hold now (ParkedStates not yet resumed or
        dropped); no round trip. conn.stats() has the arena's pages of the whole tenant."""
        return sum(len(parked) for parked in self._parked)

    def close(self) -> None:
        """Releases the staging buffer and the arena's local mapping (the daemon keeps the
        arena for the tenant). States still parked stay parked until their ParkedStates are
        resumed or dropped. The pool cannot park or resume afterwards."""
        self._rec, self._conv = [], []
        if self.staging.valid:
            self.staging.close()
        self.arena.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class MambaPool(_Parker):
    """SGLang's ``MambaPool`` interface over statepool.

    The live states are ordinary tensors (``mamba_cache.conv`` and
    ``mamba_cache.temporal``) on ``device``, shaped as SGLang shapes them; the engine's
    kernels read and write them in place. ``get_cpu_copy(indices)`` parks those requests'
    states in statepool (compressed with the layout's codec) instead of copying them to
    host memory in full precision, and ``load_cpu_copy(parked, indices)`` brings them
    back. ``capacity`` is the number of pages of the arena the pool parks into (default
    ``size``; a scheduler that may park every waiting request needs their number). Pools
    of one tenant and layout share the tenant's arena for it when one that large exists,
    so they share its pages too: size it for all of them.
    ``conv_split`` gives the channels of each conv tensor when a layer has several (Kimi's
    KDA: separate q, k and v convolutions, ``(4096, 4096, 4096)``); they are stored one after
    the other in the page's conv state. Default: one conv tensor of all conv channels.
    """

    @dataclasses.dataclass(frozen=True)
    class State:
        """The live states, as SGLang's ``MambaPool.State``: ``conv`` is a list of conv state
        tensors (one per conv tensor of a layer, ``[layers][size + 1][channels][conv_width]``;
        empty for a layout without conv state) and ``temporal`` the recurrent states
        ``[layers][size + 1][heads][key_dim][value_dim]``. Slot 0 is the padding slot."""

        conv: List[torch.Tensor]
        temporal: torch.Tensor

        def at_layer_idx(self, layer: int) -> "MambaPool.State":
            """The states of one layer: views (no copies) ``conv[i][layer]`` and
            ``temporal[layer]``, indexed by slot."""
            return MambaPool.State(conv=[c[layer] for c in self.conv],
                                   temporal=self.temporal[layer])

        def mem_usage_bytes(self) -> int:
            """Bytes of the tensors (or, for a layer's State, of that layer's views): the
            engine-side memory, not counting parked pages in statepool."""
            return sum(t.numel() * t.element_size() for t in [*self.conv, self.temporal])

    def __init__(self, conn: Connection, layout: StateLayout, size: int, *,
                 device: str | torch.device = "cpu", temporal_dtype: torch.dtype = torch.float32,
                 capacity: Optional[int] = None, batch: int = 1,
                 conv_split: Optional[Sequence[int]] = None) -> None:
        if size <= 0:
            raise ValueError("size must be positive")
        conv_dtype = _TORCH_DTYPE[layout.conv_dtype]
        super().__init__(conn, layout, temporal_dtype, conv_dtype, capacity or size, batch,
                         conv_split)
        self.size = size
        self.device = torch.device(device)
        l = layout
        conv = [torch.zeros((l.num_layers, size + 1, end - start, l.conv_width),
                            dtype=conv_dtype, device=self.device)
                for start, end in self._conv_parts]
        temporal = torch.zeros((l.num_layers, size + 1, l.num_heads, l.key_dim, l.value_dim),
                               dtype=temporal_dtype, device=self.device)
        self.mamba_cache = MambaPool.State(conv=conv, temporal=temporal)
        self.free_slots = torch.arange(1, size + 1, dtype=torch.int64, device=self.device)

    # --- SGLang's MambaPool interface --------------------------------------------------
    def mamba2_layer_cache(self, layer_id: int) -> "MambaPool.State":
        """Layer ``layer_id``'s states, what a GDN/KDA layer's kernel reads and writes:
        ``conv[i]`` ``[size + 1][channels][conv_width]`` and ``temporal``
        ``[size + 1][heads][key_dim][value_dim]``, views of ``mamba_cache``."""
        return self.mamba_cache.at_layer_idx(layer_id)

    def available_size(self) -> int:
        """Free engine slots (not counting the padding slot 0). Parked states take arena
        pages, not slots: see ``parked_pages``."""
        return len(self.free_slots)

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        """``need_size`` free slots (zeroed), or None when there are not that many."""
        if need_size > len(self.free_slots):
            return None
        selected, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        self.clear_slots(selected)
        return selected

    def free(self, free_index) -> None:
        """Returns slots (a tensor, a list or one int) to the free list."""
        index = torch.as_tensor(_indices(free_index), dtype=torch.int64, device=self.device)
        if index.numel() == 0:
            return
        self.free_slots = torch.cat((self.free_slots, index))

    def clear(self) -> None:
        """Marks every slot free again (their contents are left as they are: alloc()
        zeroes the slots it hands out). States parked with get_cpu_copy stay parked."""
        self.free_slots = torch.arange(1, self.size + 1, dtype=torch.int64, device=self.device)

    def clear_slots(self, indices: torch.Tensor) -> None:
        """Zeroes the states at ``indices``."""
        for conv in self.mamba_cache.conv:
            conv[:, indices] = 0
        self.mamba_cache.temporal[:, indices] = 0

    def copy_from(self, src_index: torch.Tensor, dst_index: torch.Tensor) -> None:
        """Copies the states at ``src_index`` over those at ``dst_index`` (tensors of slot
        indices, pairwise), every layer, conv and temporal, in the engine's tensors."""
        for conv in self.mamba_cache.conv:
            conv[:, dst_index] = conv[:, src_index]
        self.mamba_cache.temporal[:, dst_index] = self.mamba_cache.temporal[:, src_index]

    def fork_from(self, src_index: torch.Tensor) -> Optional[torch.Tensor]:
        """A new slot (``alloc(1)``) holding a copy of the state at ``src_index`` (one slot),
        or None when no slot is free."""
        dst_index = self.alloc(1)
        if dst_index is None:
            return None
        self.copy_from(src_index, dst_index)
        return dst_index

    def get_cpu_copy(self, mamba_indices: torch.Tensor) -> ParkedStates:
        """Parks the states at ``mamba_indices`` in statepool (see park())."""
        return self.park(mamba_indices)

    def load_cpu_copy(self, mamba_cpu: ParkedStates, mamba_indices: torch.Tensor) -> None:
        """Resumes states parked by get_cpu_copy into ``mamba_indices`` (see resume())."""
        self.resume(mamba_cpu, mamba_indices)

    # --- the engine's tensors -------------------------------------------------------------
    def _read(self, index, rec, conv):
        rec.copy_(self.mamba_cache.temporal[:, index])
        for part, (start, end) in zip(self.mamba_cache.conv, self._conv_parts):
            conv[:, start:end].copy_(part[:, index])

    def _write(self, index, rec, conv):
        self.mamba_cache.temporal[:, index].copy_(rec)
        for part, (start, end) in zip(self.mamba_cache.conv, self._conv_parts):
            part[:, index].copy_(conv[:, start:end])


class MambaBlocks(_Parker):
    """Parks and resumes vLLM-style per-request mamba state blocks.

    ``kv_caches`` is the engine's list of per-layer state tensors, one entry per layer of
    the layout, each a tuple ``(*conv_states, ssm_state)``: the conv state tensors
    ``[blocks][channels][conv_kernel - 1]`` (or ``[blocks][conv_kernel - 1][channels]``:
    set ``conv_dim_last=True``), one for GDN's fused qkv convolution or three for KDA's q,
    k and v convolutions, their channels adding up to the layout's ``conv_channels``; and
    ``ssm_state`` ``[blocks][heads][key_dim][value_dim]``. park(block ids) / resume(parked,
    block ids) move whole requests' states out and in.
    """

    def __init__(self, conn: Connection, layout: StateLayout,
                 kv_caches: Sequence[Tuple[torch.Tensor, ...]], *, capacity: int,
                 conv_dim_last: bool = False, batch: int = 1) -> None:
        if len(kv_caches) != layout.num_layers:
            raise ValueError(f"{len(kv_caches)} layers of tensors, the layout has "
                             f"{layout.num_layers}")
        l = layout
        channel_axis = 2 if conv_dim_last else 1
        split = [conv.shape[channel_axis] for conv in kv_caches[0][:-1]]
        ssm_shape = (l.num_heads, l.key_dim, l.value_dim)
        for layer, (*convs, ssm) in enumerate(kv_caches):
            shapes = [(c, l.conv_width) if not conv_dim_last else (l.conv_width, c)
                      for c in split]
            if tuple(ssm.shape[1:]) != ssm_shape or \
                    [tuple(c.shape[1:]) for c in convs] != shapes or sum(split) != l.conv_channels:
                raise ValueError(
                    f"layer {layer}: ssm_state {tuple(ssm.shape)} / conv states "
                    f"{[tuple(c.shape) for c in convs]} do not match the layout: (blocks, "
                    f"{ssm_shape}) and conv channels adding up to {l.conv_channels}, width "
                    f"{l.conv_width}{' first' if conv_dim_last else ' last'}")
        super().__init__(conn, layout, kv_caches[0][-1].dtype,
                         kv_caches[0][0].dtype if split else torch.bfloat16, capacity, batch,
                         split)
        self.kv_caches = [tuple(entry) for entry in kv_caches]
        self.conv_dim_last = conv_dim_last

    def _conv_block(self, conv_state: torch.Tensor, index: int) -> torch.Tensor:
        block = conv_state[index]
        return block.transpose(0, 1) if self.conv_dim_last else block

    def _read(self, index, rec, conv):
        for layer, (*convs, ssm_state) in enumerate(self.kv_caches):
            rec[layer].copy_(ssm_state[index])
            for part, (start, end) in zip(convs, self._conv_parts):
                conv[layer, start:end].copy_(self._conv_block(part, index))

    def _write(self, index, rec, conv):
        for layer, (*convs, ssm_state) in enumerate(self.kv_caches):
            ssm_state[index].copy_(rec[layer])
            for part, (start, end) in zip(convs, self._conv_parts):
                self._conv_block(part, index).copy_(conv[layer, start:end])
