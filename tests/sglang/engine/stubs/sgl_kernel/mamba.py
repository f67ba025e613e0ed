"""Pure-PyTorch stand-ins of `sgl_kernel.mamba`'s CPU ops (test-only, slow and simple).

Layouts as SGLang's CPU engine hands them: conv input [dim, tokens] (prefill) or [batch, dim]
(decode), conv weight [dim, W] (or [dim, 1, W]), conv state [slots, dim, W-1]; recurrent state
[slots, HV, V, K]; q/k [1, tokens, H, K], v [1, tokens, HV, V], g/beta [1, tokens, HV]."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _weight(w: torch.Tensor) -> torch.Tensor:
    return w.reshape(w.shape[0], -1)


def _act(y: torch.Tensor, activation) -> torch.Tensor:
    if activation in ("silu", "swish", True):
        return F.silu(y)
    return y


def causal_conv1d_fn_cpu(x, weight, bias=None, activation=None, conv_states=None,
                         has_initial_state=None, cache_indices=None, query_start_loc=None,
                         seq_lens_cpu=None, **_):
    w = _weight(weight).float()
    width = w.shape[1]
    out = torch.empty_like(x)
    starts = query_start_loc.tolist()
    for i in range(len(starts) - 1):
        a, b = starts[i], starts[i + 1]
        if b <= a:
            continue
        slot = int(cache_indices[i])
        seq = x[:, a:b].float()
        if has_initial_state is not None and bool(has_initial_state[i]):
            prev = conv_states[slot].float()
        else:
            prev = seq.new_zeros(seq.shape[0], width - 1)
        full = torch.cat([prev, seq], dim=1)
        y = F.conv1d(full.unsqueeze(0), w.unsqueeze(1), None if bias is None else bias.float(),
                     groups=w.shape[0]).squeeze(0)
        out[:, a:b] = _act(y, activation).to(x.dtype)
        conv_states[slot] = full[:, -(width - 1):].to(conv_states.dtype)
    return out


def causal_conv1d_update_cpu(x, conv_state, weight, bias=None, activation=None,
                             conv_state_indices=None, **_):
    w = _weight(weight).float()
    squeeze = x.dim() == 2
    xs = x.unsqueeze(-1) if squeeze else x          # [batch, dim, tokens]
    out = torch.empty_like(xs)
    for i in range(xs.shape[0]):
        slot = int(conv_state_indices[i]) if conv_state_indices is not None else i
        if slot < 0:
            out[i] = 0
            continue
        full = torch.cat([conv_state[slot].float(), xs[i].float()], dim=1)
        y = F.conv1d(full.unsqueeze(0), w.unsqueeze(1), None if bias is None else bias.float(),
                     groups=w.shape[0]).squeeze(0)
        out[i] = _act(y, activation).to(x.dtype)
        conv_state[slot] = full[:, -(w.shape[1] - 1):].to(conv_state.dtype)
    return out.squeeze(-1) if squeeze else out


def _l2norm(t: torch.Tensor) -> torch.Tensor:
    return t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)


def recurrent_gated_delta_rule(q, k, v, g, beta, state, scale, use_l2norm):
    """One sequence: q/k [T, H, K], v [T, HV, V], g/beta [T, HV], state [HV, V, K] (fp32,
    updated in place). Returns o [T, HV, V] (fp32)."""
    q, k, v = q.float(), k.float(), v.float()
    if use_l2norm:
        q, k = _l2norm(q), _l2norm(k)
    hv = v.shape[1]
    rep = hv // q.shape[1]
    if rep > 1:
        q = q.repeat_interleave(rep, dim=1)
        k = k.repeat_interleave(rep, dim=1)
    q = q * scale
    out = v.new_empty(v.shape)
    s = state
    for t in range(q.shape[0]):
        s.mul_(torch.exp(g[t].float())[:, None, None])
        kv = torch.einsum("hvk,hk->hv", s, k[t])
        delta = (v[t] - kv) * beta[t].float()[:, None]
        s.add_(delta[:, :, None] * k[t][:, None, :])
        out[t] = torch.einsum("hvk,hk->hv", s, q[t])
    return out


def chunk_gated_delta_rule_cpu(q, k, v, g, beta, initial_state=None, cu_seqlens=None,
                               head_first=False, use_qk_l2norm_in_kernel=False,
                               initial_state_indices=None, scale=None, **_):
    """Prefill over packed sequences; writes each final state into initial_state at its slot.
    Returns (o [1, T, HV, V], final states, None)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    o = torch.empty(v.shape, dtype=v.dtype)
    starts = cu_seqlens.tolist()
    finals = []
    for i in range(len(starts) - 1):
        a, b = starts[i], starts[i + 1]
        slot = int(initial_state_indices[i])
        s = initial_state[slot].float().clone()
        o[0, a:b] = recurrent_gated_delta_rule(q[0, a:b], k[0, a:b], v[0, a:b], g[0, a:b],
                                               beta[0, a:b], s, scale,
                                               use_qk_l2norm_in_kernel).to(v.dtype)
        initial_state[slot] = s.to(initial_state.dtype)
        finals.append(s)
    return o, (torch.stack(finals) if finals else None), None
