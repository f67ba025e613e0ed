"""Torch versions of the host<->device KV/state transfers of `sgl_kernel.kvcacheio` that SGLang's
HiCache host pools bind only on GPUs (test-only; the CPU engine's "device" is host memory too).

Indices are token (or state slot) indices. A page-first host buffer is viewed as
[pages, layers, page_size, row] (KV: [pages, L, ps, H, D]; a MAMBA host buffer, page_size 1:
[slots, L, ...]); a device layer buffer as [tokens, row]."""

from __future__ import annotations

import torch


def _pf(t: torch.Tensor, page_size: int) -> torch.Tensor:
    return t.view(t.shape[0], t.shape[1], page_size, -1)


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.view(t.shape[0], -1)


def _split(indices: torch.Tensor, page_size: int):
    idx = indices.to(torch.int64)
    return idx // page_size, idx % page_size


def transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size=1):
    s = src_indices.to(torch.int64)
    d = dst_indices.to(torch.int64)
    for src, dst in zip(src_layers, dst_layers):
        _rows(dst)[d] = _rows(src)[s].to(dst.dtype)


def transfer_kv_per_layer_direct_pf_lf(src_ptrs, dst_ptrs, src_indices, dst_indices, layer_id,
                                       page_size=1):
    """Host page-first -> device layer-first, one layer."""
    pages, offs = _split(src_indices, page_size)
    d = dst_indices.to(torch.int64)
    for src, dst in zip(src_ptrs, dst_ptrs):
        _rows(dst)[d] = _pf(src, page_size)[pages, layer_id, offs].to(dst.dtype)


def transfer_kv_all_layer_direct_lf_pf(src_ptrs, dst_ptrs, src_indices, dst_indices,
                                       page_size=1):
    """Device layer-first (every layer of each buffer, buffer after buffer) -> host page-first."""
    pages, offs = _split(dst_indices, page_size)
    s = src_indices.to(torch.int64)
    layers = len(src_ptrs) // len(dst_ptrs)
    for b, dst in enumerate(dst_ptrs):
        view = _pf(dst, page_size)
        for layer in range(layers):
            view[pages, layer, offs] = _rows(src_ptrs[b * layers + layer])[s].to(dst.dtype)


def transfer_kv_per_layer_mla(src, dst, src_indices, dst_indices, item_size=None):
    _rows(dst)[dst_indices.to(torch.int64)] = _rows(src)[src_indices.to(torch.int64)]


def get_device_accessible_ptr(t):
    return t.data_ptr()
