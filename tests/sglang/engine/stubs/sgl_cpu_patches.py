"""Test-only post-import patches of SGLang 0.5.23 modules for its CPU engine on a machine
without Intel AMX and without SGLang's kernel package (tests/sglang/engine). They replace
module globals (private internals of this exact SGLang version: pinned) with torch code:

- the HiCache host pools' host<->device transfer functions, bound only on GPUs;
- the gated RMSNorm of Qwen3-Next's linear-attention layers (FusedRMSNormGated: a Triton
  kernel off AMX);
- the gated shared-expert add of Qwen-MoE layers (a Triton kernel);
- host memory without cudaHostRegister / pinned memory.

install() adds a meta-path finder that runs the patch of a module right after the module
has executed."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

import torch


def _kvcacheio(module) -> None:
    import sgl_kernel.kvcacheio as io

    for name in ("transfer_kv_direct", "transfer_kv_per_layer_direct_pf_lf",
                 "transfer_kv_all_layer_direct_lf_pf", "transfer_kv_per_layer_mla"):
        setattr(module, name, getattr(io, name))


def rms_norm_gated_torch(x, g, weight, bias=None, activation="swish", residual=None,
                         prenorm=False, residual_in_fp32=False, eps=1e-6, **_):
    """RMSNorm(x) * weight, times act(g) (norm before gate)."""
    xf = x.float()
    if residual is not None:
        xf = xf + residual.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    gf = g.float()
    y = y * (torch.sigmoid(gf) if activation == "sigmoid" else torch.nn.functional.silu(gf))
    return y.to(x.dtype)


def _fused_norm_gate(module) -> None:
    module.rms_norm_gated = rms_norm_gated_torch


def _host_memory(module) -> None:
    """No cudaHostRegister, no pinned memory: plain host tensors."""
    module._cuda_host_register = lambda buffer, *args, **kwargs: None
    module._cuda_host_unregister = lambda buffer, *args, **kwargs: None
    alloc = module.alloc_with_pin_memory

    def alloc_with_pin_memory(dims, dtype, device, pin_memory, allocator=None, *args, **kwargs):
        return alloc(dims, dtype, device, False, allocator, *args, **kwargs)

    module.alloc_with_pin_memory = alloc_with_pin_memory


def _elementwise(module) -> None:
    def launch_fused_gate_sigmoid_mul(hidden_states, gate_weight, shared_output, output, *,
                                      do_add, **_):
        """Qwen-MoE's gated shared expert: sigmoid(h . w) * shared (+ output)."""
        gate = torch.sigmoid(hidden_states.float() @ gate_weight.float())[:, None]
        result = gate * shared_output.float()
        if do_add:
            result = result + output.float()
        output.copy_(result.to(output.dtype))

    module._launch_fused_gate_sigmoid_mul = launch_fused_gate_sigmoid_mul


PATCHES = {
    "sglang.kernels.ops.elementwise.elementwise": _elementwise,
    "sglang.srt.mem_cache.pool_host.common": _host_memory,
    "sglang.srt.mem_cache.memory_pool_host": _kvcacheio,
    "sglang.srt.mem_cache.pool_host.mha": _kvcacheio,
    "sglang.srt.mem_cache.pool_host.mamba": _kvcacheio,
    "sglang.kernels.ops.attention.fla.fused_norm_gate": _fused_norm_gate,
}


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, patch):
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        patch = PATCHES.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, patch)
        return spec


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
