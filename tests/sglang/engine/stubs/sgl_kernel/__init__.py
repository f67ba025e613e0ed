"""Test-only pure-PyTorch stand-in for SGLang's kernel package `sgl_kernel` (tests/sglang/engine).

No CPU build of that package exists on PyPI (the wheel there holds GPU code only). SGLang's CPU
engine (SGLANG_USE_CPU_ENGINE=1) imports a handful of its ops; this package provides those,
written with plain PyTorch, slow and simple, for the tiny model of the engine test. It is never
installed and never used outside tests/sglang/engine: the test puts stubs/ first on PYTHONPATH.
It defines no `convert_weight_packed`, so SGLang sees no Intel AMX backend and takes its
native-PyTorch paths wherever it has them."""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from . import kvcacheio, mamba  # noqa: F401


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset,
                                 out_cache_loc, max_len=None):
    pos = 0
    for i in range(req_pool_indices.shape[0]):
        a, b = int(start_offset[i]), int(end_offset[i])
        req_to_token[int(req_pool_indices[i]), a:b] = out_cache_loc[pos:pos + b - a].to(
            req_to_token.dtype)
        pos += b - a


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """Row copies inside each KV buffer, given by address and row stride (bytes)."""
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        for t, s in zip(tgt_loc.tolist(), src_loc.tolist()):
            ctypes.memmove(ptr + t * stride, ptr + s * stride, stride)


# -- ops SGLang's CPU paths reach through torch.ops.sgl_kernel ---------------------------------


def fused_gdn_gating_cpu(A_log, a, b, dt_bias, beta=1.0, threshold=20.0):
    x = a.float() + dt_bias.float()
    softplus = torch.where(beta * x <= threshold, F.softplus(x, beta=beta), x)
    g = -torch.exp(A_log.float()) * softplus
    return g.unsqueeze(0), torch.sigmoid(b.float()).unsqueeze(0)


def fused_sigmoid_gating_delta_rule_update_cpu(A_log, dt_bias, q, k, v, a, b,
                                               initial_state_source, initial_state_indices,
                                               cu_seqlens=None, use_qk_l2norm_in_kernel=False,
                                               softplus_beta=1.0, softplus_threshold=20.0,
                                               scale=None, **_):
    """Decode: q/k [1, B, H, K], v [1, B, HV, V], a/b [B, HV]; state [slots, HV, V, K]."""
    g, beta = fused_gdn_gating_cpu(A_log, a, b, dt_bias, softplus_beta, softplus_threshold)
    g, beta = g.reshape(-1, g.shape[-1]), beta.reshape(-1, beta.shape[-1])
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = torch.empty(v.shape, dtype=v.dtype)
    batch = q.shape[1]
    for i in range(batch):
        slot = int(initial_state_indices[i])
        if slot < 0:
            out[0, i] = 0
            continue
        s = initial_state_source[slot].float().clone()
        out[0, i:i + 1] = mamba.recurrent_gated_delta_rule(
            q[0, i:i + 1], k[0, i:i + 1], v[0, i:i + 1], g[i:i + 1], beta[i:i + 1], s, scale,
            use_qk_l2norm_in_kernel).to(v.dtype)
        initial_state_source[slot] = s.to(initial_state_source.dtype)
    return out


def _register() -> None:
    ns = torch.ops.sgl_kernel
    for name in ("fused_gdn_gating_cpu", "fused_sigmoid_gating_delta_rule_update_cpu"):
        setattr(ns, name, globals()[name])


_register()


def __getattr__(name: str):
    """Other CPU ops SGLang imports at module level but this test never reaches (speculative
    decoding, AMX paths): importable, and they fail loudly if called."""
    if name.endswith("_cpu"):
        def unimplemented(*args, **kwargs):
            raise NotImplementedError(f"sgl_kernel stand-in (tests/sglang/engine): {name}")

        unimplemented.__name__ = name
        return unimplemented
    raise AttributeError(f"module 'sgl_kernel' has no attribute {name!r}")
