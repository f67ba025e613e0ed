"""Which memory file of this process holds a tensor of SGLang's host pools (private to
statepool.sglang).

With ``"allocator": "shm"`` in its storage extra config, SGLang 0.5.23 allocates every host
pool tensor in a memfd of its own (``ShmHostTensorAllocator``: ``pool.allocator.fds`` in
allocation order, ``pool.fd`` the first of an MHA pool). The daemon can map such a file
(``Connection.register_memory``) and read and write the pool in place. This module finds the
file of a tensor without trusting the allocation order: the mapping that holds the tensor's
first byte (``/proc/self/maps``) names the file's inode, which is matched with the inodes of
the descriptors the pool's allocator keeps.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable, List, Optional, Tuple, Union

import torch


@dataclass(frozen=True)
class SharedRegion:
    """A tensor that lies in a memory file: the file's descriptor (owned by SGLang's
    allocator), its size, and the tensor's byte offset in it."""

    fd: int
    file_bytes: int
    offset: int
    nbytes: int


def _candidate_fds(pool: Any) -> List[int]:
    fds: List[int] = []
    allocator = getattr(pool, "allocator", None)
    for fd in list(getattr(allocator, "fds", None) or []) + [getattr(pool, "fd", None)]:
        if isinstance(fd, int) and fd >= 0 and fd not in fds:
            fds.append(fd)
    return fds


def _mapping_of(address: int) -> Optional[Tuple[int, int, int, str]]:
    """(start, file offset, inode, path) of this process's mapping that holds ``address``."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(None, 5)
            start, _, end = parts[0].partition("-")
            if int(start, 16) <= address < int(end, 16):
                path = parts[5].strip() if len(parts) > 5 else ""
                return int(start, 16), int(parts[2], 16), int(parts[4]), path
    return None


def shared_region(pool: Any, tensor: torch.Tensor) -> Union[SharedRegion, str]:
    """The memory file that holds all of ``tensor`` (a contiguous CPU tensor of ``pool``), or
    why there is none (a sentence for the log)."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        return "not contiguous CPU memory"
    fds = _candidate_fds(pool)
    allocator = type(getattr(pool, "allocator", None)).__name__
    if not fds:
        return f"private memory (SGLang's {allocator})"
    mapping = _mapping_of(tensor.data_ptr())
    if mapping is None:
        return "memory this process has not mapped from a file"
    start, file_offset, inode, path = mapping
    for fd in fds:
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if st.st_ino != inode or inode == 0:
            continue
        offset = file_offset + tensor.data_ptr() - start
        nbytes = tensor.numel() * tensor.element_size()
        if offset + nbytes > st.st_size:
            return f"a tensor that runs past the end of its memory file {path}"
        return SharedRegion(fd=fd, file_bytes=st.st_size, offset=offset, nbytes=nbytes)
    return f"memory that none of SGLang's {allocator} descriptors maps"


def describe(regions: Iterable[Union[SharedRegion, str]]) -> Optional[str]:
    """None when every region is shared, else the first reason why one is not."""
    for r in regions:
        if isinstance(r, str):
            return r
    return None
