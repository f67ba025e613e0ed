"""The fused decode step from Python: the engine's per-token step on its pages."""

from __future__ import annotations

import numpy as np
import pytest

import statepool
from conftest import small_layout, uniform_plan

L, H, K, V = 2, 3, 16, 24


def inputs(batch: int, arch: statepool.Arch, seed: int):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, H, K)).astype(np.float32)
    k = rng.standard_normal((batch, H, K)).astype(np.float32)
    q /= np.linalg.norm(q, axis=-1, keepdims=True) * np.sqrt(K)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((batch, H, V)).astype(np.float32)
    shape = (batch, H) if arch == statepool.Arch.gdn else (batch, H, K)
    g = -rng.uniform(0.01, 0.5, shape).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (batch, H)).astype(np.float32)
    return q, k, v, g, beta


def reference_step(S, q, k, v, g, beta, arch):
    """The gated delta rule in numpy, FP64: S [H][K][V] decayed, then written k (x) u."""
    decay = np.exp(g.astype(np.float64))
    S = S * (decay[:, None, None] if arch == statepool.Arch.gdn else decay[:, :, None])
    u = beta[:, None] * (v - np.einsum("hk,hkv->hv", k, S))
    S = S + k[:, :, None] * u[:, None, :]
    return S, np.einsum("hk,hkv->hv", q, S)


@pytest.mark.parametrize("arch", [statepool.Arch.gdn, statepool.Arch.kda], ids=str)
def test_fp32_pages_follow_the_recurrence(conn, arch):
    info = conn.register_layout(small_layout(statepool.CodecId.fp32, arch=arch,
                                             name=f"step-{arch.name}"))
    arena = conn.open_arena(info, 4)
    slots = conn.allocate(arena, 2)
    codec = arena.codec
    step = statepool.DecodeStep(arena, threads=2)
    assert step.threads == 2
    states = np.zeros((2, L, H, K, V))
    staged = np.zeros(codec.staged_bytes() // 4, np.float32)
    for t in range(20):
        for layer in range(L):
            q, k, v, g, beta = inputs(2, arch, 100 * t + layer)
            out = np.zeros((2, H, V), np.float32)
            result = step.run(layer, slots, q, k, v, g, beta, out)
            assert result.ok and result.rejected_heads == 0
            for b in range(2):
                states[b, layer], expected = reference_step(states[b, layer], q[b], k[b], v[b],
                                                            g[b], beta[b], arch)
                np.testing.assert_allclose(out[b], expected, rtol=1e-4, atol=1e-5)
    for b, slot in enumerate(slots):
        arena.decode(slot, staged)
        np.testing.assert_allclose(staged[:L * H * K * V].reshape(L, H, K, V), states[b],
                                   rtol=1e-4, atol=1e-5)
    conn.free(slots)


def test_compressed_pages_and_rejected_heads(conn):
    info = conn.register_layout(small_layout(statepool.CodecId.int8, name="step-int8"))
    arena = conn.open_arena(info, 4)
    slot = conn.allocate(arena)[0]
    step = statepool.DecodeStep(arena, threads=1)
    q, k, v, g, beta = inputs(1, statepool.Arch.gdn, 7)
    out = np.zeros((1, H, V), np.float32)
    assert step.run(0, [slot.id], q, k, v, g, beta, out).ok
    before = np.asarray(arena.page(slot)).copy()
    v[0, 1, 3] = np.inf  # head 1 of the one request: its new state is not finite
    result = step.run(0, [slot], q, k, v, g, beta, out)
    assert not result and result.rejected_heads == 1
    assert (result.first_rejected_request, result.first_rejected_head) == (0, 1)
    page = np.asarray(arena.page(slot))
    codec = statepool.PageCodec(info.layout)
    ends = [codec.head_offset(0, h) for h in range(H)] + [codec.head_offset(1, 0)]
    head0, head1, head2 = (slice(ends[h], ends[h + 1]) for h in range(H))
    assert np.array_equal(page[head1], before[head1])  # the rejected head kept its bytes
    assert not np.array_equal(page[head0], before[head0])  # the others were stepped
    assert not np.array_equal(page[head2], before[head2])
    assert np.array_equal(page[codec.head_offset(1, 0):], before[codec.head_offset(1, 0):])
    with pytest.raises(ValueError, match="q"):
        step.run(0, [slot], q[:, :2], k, v, g, beta, out)  # too few q heads
    with pytest.raises(ValueError, match="contiguous"):
        step.run(0, [slot], q, k, v.transpose(0, 2, 1), g, beta, out)
    with pytest.raises(BufferError):
        arena.close()  # the step keeps the arena mapped
    del step
    slot.free()


def test_stepquant6_steps_light_between_full_fits_by_default(conn):
    """The measured mode: a full fit at a page's first step and every 16th, light steps
    between (layer 0 has one pivot head, which is never light); a mode argument overrides."""
    fields = dict(num_layers=L, num_heads=H, key_dim=K, value_dim=V)
    info = conn.register_layout(small_layout(statepool.CodecId.stepquant6,
                                             plan=uniform_plan(fields, 6), name="step-sq6"))
    arena = conn.open_arena(info, 4)
    slots = conn.allocate(arena, 2)
    step = statepool.DecodeStep(arena, threads=1)
    assert step.default_mode == statepool.StepMode.light
    out = np.zeros((2, H, V), np.float32)
    light = []
    for t in range(17):
        q, k, v, g, beta = inputs(2, statepool.Arch.gdn, 300 + t)
        result = step.run(0, slots, q, k, v, g, beta, out)
        assert result.ok and result.fallback_heads == 0
        light.append(result.light_heads)
    assert light == [0] + [2 * (H - 1)] * 15 + [0]
    assert step.steps(slots[0], 0) == 17 and step.steps(slots[1].id, 1) == 0
    q, k, v, g, beta = inputs(2, statepool.Arch.gdn, 400)
    assert step.run(0, slots, q, k, v, g, beta, out, mode=statepool.StepMode.full).light_heads == 0
    assert step.run(0, slots, q, k, v, g, beta, out,
                    mode=statepool.StepMode.light, full_every=0).light_heads == 2 * (H - 1)
    int8 = statepool.DecodeStep(conn.open_arena(conn.register_layout(
        small_layout(statepool.CodecId.int8, name="step-int8-mode")), 2), threads=1)
    assert int8.default_mode == statepool.StepMode.full
    del step, int8
    conn.free(slots)

