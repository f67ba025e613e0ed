"""The engine adapters: SGLang's MambaPool interface and vLLM-style state blocks."""

from __future__ import annotations

import gc

import pytest
import torch

import statepool
from statepool.engine import MambaBlocks, MambaPool, ParkedStates
from conftest import small_layout

L, H, K, V, C, W = 2, 3, 16, 24, 8, 3


def fill(pool: MambaPool, indices: torch.Tensor, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for i in indices.tolist():
        pool.mamba_cache.temporal[:, i] = torch.randn((L, H, K, V), generator=g)
        pool.mamba_cache.conv[0][:, i] = torch.randn((L, C, W), generator=g).bfloat16()


def test_sglang_pool_shapes_and_slot_bookkeeping(conn):
    pool = MambaPool(conn, small_layout(statepool.CodecId.fp32), size=4)
    assert pool.mamba_cache.temporal.shape == (L, 5, H, K, V)
    assert pool.mamba_cache.conv[0].shape == (L, 5, C, W)
    assert pool.mamba_cache.conv[0].dtype == torch.bfloat16
    assert pool.mamba2_layer_cache(1).temporal.shape == (5, H, K, V)
    a = pool.alloc(3)
    assert a.tolist() == [1, 2, 3] and pool.available_size() == 1
    assert pool.alloc(2) is None
    fill(pool, a, 0)
    b = pool.fork_from(a[:1])
    assert torch.equal(pool.mamba_cache.temporal[:, b[0]], pool.mamba_cache.temporal[:, 1])
    pool.free(a[:2])
    pool.free(int(a[2]))  # an int (or a list) does too
    assert pool.available_size() == 3
    again = pool.alloc(3)  # alloc zeroes what it hands out
    assert pool.mamba_cache.temporal[:, again].abs().sum() == 0
    pool.clear()
    assert pool.available_size() == 4


def test_park_and_resume_is_exact_with_fp32_pages(conn):
    pool = MambaPool(conn, small_layout(statepool.CodecId.fp32, name="engine-fp32"), size=6,
                     capacity=8, batch=2)  # batch < states: several staging rounds
    live = pool.alloc(5)
    fill(pool, live, 1)
    temporal = pool.mamba_cache.temporal[:, live].clone()
    conv = pool.mamba_cache.conv[0][:, live].clone()
    used = pool.parked_pages
    parked = pool.get_cpu_copy(live)
    assert isinstance(parked, ParkedStates) and len(parked) == 5
    assert pool.parked_pages == used + 5
    pool.clear_slots(live)
    pool.free(live)
    # The requests come back in other slots.
    new = pool.alloc(5).flip(0)
    pool.load_cpu_copy(parked, new)
    assert torch.equal(pool.mamba_cache.temporal[:, new], temporal)
    assert torch.equal(pool.mamba_cache.conv[0][:, new], conv)
    assert len(parked) == 0 and pool.parked_pages == used


@pytest.mark.parametrize("codec,bound", [(statepool.CodecId.int8, 1e-2),
                                         (statepool.CodecId.int6, 4e-2)])
def test_compressed_parking_within_the_codec_error(conn, codec, bound):
    pool = MambaPool(conn, small_layout(codec, name=f"engine-{codec.name}"), size=4)
    live = pool.alloc(4)
    fill(pool, live, 2)
    temporal = pool.mamba_cache.temporal.clone()
    parked = pool.park(live)
    assert parked.compression_ratio > 3
    assert parked.nbytes == parked.page_bytes * 4 < parked.state_bytes * 4 / 3
    pool.clear_slots(live)
    pool.resume(parked, live)
    error = (pool.mamba_cache.temporal - temporal).abs().max() / temporal.abs().max()
    assert 0 < error <= bound


def test_bfloat16_temporal_state(conn):
    pool = MambaPool(conn, small_layout(statepool.CodecId.int8, name="engine-bf16"), size=2,
                     temporal_dtype=torch.bfloat16)
    live = pool.alloc(2)
    pool.mamba_cache.temporal[:, live] = torch.randn((L, 2, H, K, V)).bfloat16()
    temporal = pool.mamba_cache.temporal.clone()
    parked = pool.park(live)
    pool.clear_slots(live)
    pool.resume(parked, live)
    error = (pool.mamba_cache.temporal.float() - temporal.float()).abs().max()
    assert 0 < error <= 2e-2 * temporal.float().abs().max()


def test_parking_is_all_or_nothing(conn):
    pool = MambaPool(conn, small_layout(statepool.CodecId.int8, name="engine-full"), size=16,
                     capacity=2)

    def arena_pages() -> int:  # what the daemon counts, not the pool's own bookkeeping
        return next(a.pages_used for a in conn.stats().arenas if a.arena_id == pool.arena.id)

    used = arena_pages()
    # The tenant's arena for this layout may be larger than asked for (it is shared).
    free = pool.arena.page_count - used
    live = pool.alloc(free + 1)
    with pytest.raises(statepool.PoolExhausted):
        pool.park(live)
    pool.mamba_cache.temporal[1, 2, 0, 0, 0] = float("nan")
    with pytest.raises(statepool.NotFinite):
        pool.park(live[:2])
    assert arena_pages() == used and pool.parked_pages == 0
    parked = pool.park(live[2:3])
    assert arena_pages() == used + 1 and pool.parked_pages == 1
    del parked
    gc.collect()
    assert arena_pages() == used  # dropped parked states free their pages
    with pytest.raises(ValueError, match="indices"):
        pool.resume(pool.park(live[:1]), live[:2])


def test_vllm_blocks_with_the_conv_dim_last(conn):
    blocks = 6
    caches = [(torch.randn(blocks, W, C).bfloat16(), torch.randn(blocks, H, K, V))
              for _ in range(L)]
    original = [(c.clone(), s.clone()) for c, s in caches]
    store = MambaBlocks(conn, small_layout(statepool.CodecId.fp32, name="vllm"), caches,
                        capacity=4, conv_dim_last=True)
    parked = store.park([4, 1])
    for conv, ssm in caches:
        conv[[4, 1]] = 0
        ssm[[4, 1]] = 0
    store.resume(parked, [0, 5])  # block 4's state into block 0, block 1's into block 5
    for (conv, ssm), (conv0, ssm0) in zip(caches, original):
        assert torch.equal(ssm[0], ssm0[4]) and torch.equal(ssm[5], ssm0[1])
        assert torch.equal(conv[0], conv0[4]) and torch.equal(conv[5], conv0[1])
    with pytest.raises(ValueError, match="do not match"):
        MambaBlocks(conn, small_layout(statepool.CodecId.fp32, name="vllm"), caches,
                    capacity=4, conv_dim_last=False)


def test_kda_with_three_conv_tensors(conn):
    """Kimi's KDA layers have separate q, k and v convolutions: three conv tensors."""
    layout = small_layout(statepool.CodecId.fp32, arch=statepool.Arch.kda, conv_channels=12,
                          name="kda-split")
    pool = MambaPool(conn, layout, size=2, conv_split=(4, 4, 4))
    assert [c.shape for c in pool.mamba_cache.conv] == [(L, 3, 4, W)] * 3
    live = pool.alloc(2)
    for part in pool.mamba_cache.conv:
        part[:, live] = torch.randn(L, 2, 4, W).bfloat16()
    pool.mamba_cache.temporal[:, live] = torch.randn(L, 2, H, K, V)
    saved = [c.clone() for c in pool.mamba_cache.conv], pool.mamba_cache.temporal.clone()
    parked = pool.park(live)
    pool.clear_slots(live)
    pool.resume(parked, live.flip(0))
    for part, before in zip(pool.mamba_cache.conv, saved[0]):
        assert torch.equal(part[:, live.flip(0)], before[:, live])
    assert torch.equal(pool.mamba_cache.temporal[:, live.flip(0)], saved[1][:, live])
    with pytest.raises(ValueError, match="add up"):
        MambaPool(conn, layout, size=2, conv_split=(4, 4))


def test_close_releases_staging_and_mapping(conn):
    with MambaPool(conn, small_layout(statepool.CodecId.int8, name="engine-close"), size=2,
                   batch=2) as pool:
        arena_id = pool.arena.id
        live = pool.alloc(2)
        parked = pool.park(live)
        assert pool.parked_pages == 2
    assert not pool.staging.valid and not pool.arena.mapped
    # The arena lives on in the daemon, with the two parked pages.
    assert next(a.pages_used for a in conn.stats().arenas if a.arena_id == arena_id) >= 2
    assert len(parked) == 2  # still parked, freed when dropped
    del parked
    gc.collect()


def test_parked_states_resume_only_into_their_own_pool(conn):
    a = MambaPool(conn, small_layout(statepool.CodecId.fp32, name="cross-a"), size=2)
    b = MambaPool(conn, small_layout(statepool.CodecId.fp32, num_heads=2, value_dim=36,
                                     name="cross-b"), size=2)  # same staged size
    parked = a.park(a.alloc(1))
    with pytest.raises(ValueError, match="parked with layout"):
        b.resume(parked, b.alloc(1))
    a.resume(parked, [2])


def test_every_public_engine_call_is_documented():
    """Editors and help() show a docstring for every public class, method and property of
    the adapters (SGLang's method names included: mamba2_layer_cache, available_size, ...)."""
    import inspect

    missing = []
    for cls in (MambaPool, MambaPool.State, MambaBlocks, ParkedStates):
        if not inspect.getdoc(cls) or inspect.getdoc(cls).startswith(cls.__name__ + "("):
            missing.append(cls.__qualname__)  # (a dataclass's generated signature is no doc)
        for name, member in inspect.getmembers(cls):
            if name.startswith("_") or not (callable(member) or isinstance(member, property)):
                continue
            if isinstance(member, type):
                continue  # a nested class: checked above
            if not (inspect.getdoc(member) or "").strip():
                missing.append(f"{cls.__qualname__}.{name}")
    assert missing == []
