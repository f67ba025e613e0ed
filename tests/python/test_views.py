"""Zero-copy views of staging buffers and arena pages, and their lifetimes."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import statepool
from conftest import small_layout


@pytest.fixture
def setup(conn):
    info = conn.register_layout(small_layout(statepool.CodecId.int8))
    arena = conn.open_arena(info, 4)
    return conn, info, arena


def test_numpy_torch_and_the_buffer_share_one_memory(setup):
    conn, info, _ = setup
    staging = conn.open_staging(4096)
    view = staging.view("float32", (4, 256))
    assert view.shape == (4, 256) and view.dtype == "float32" and view.nbytes == 4096
    assert view.device == "cpu" and view.__dlpack_device__() == (1, 0)
    array = np.asarray(view)
    tensor = torch.from_dlpack(view)
    from_dlpack = np.from_dlpack(view)
    assert array.ctypes.data == tensor.data_ptr() == from_dlpack.ctypes.data == view.data_ptr
    tensor[2, 7] = 42.0
    assert array[2, 7] == 42.0 and from_dlpack[2, 7] == 42.0
    raw = memoryview(staging.view())
    assert raw.nbytes == staging.size and raw.format == "B"
    assert np.frombuffer(raw, np.float32)[2 * 256 + 7] == 42.0
    del array, tensor, from_dlpack, raw, view
    gc.collect()
    staging.close()


def test_views_keep_the_mapping_and_block_close(setup):
    conn, _, _ = setup
    staging = conn.open_staging(1024)
    tensor = torch.from_dlpack(staging.view("uint8"))
    with pytest.raises(BufferError, match="view"):
        staging.close()
    tensor.fill_(7)  # still mapped
    del tensor
    gc.collect()
    staging.close()
    assert not staging.valid
    with pytest.raises(ValueError, match="closed"):
        staging.view()


def test_a_view_outlives_its_staging_object(setup):
    conn, _, _ = setup
    array = np.asarray(conn.open_staging(256).view("uint8"))  # the Staging object is gone
    array[:] = 3
    assert int(array.sum()) == 3 * array.size


def test_bad_views_are_refused(setup):
    conn, _, _ = setup
    with conn.open_staging(1024) as staging:
        pass
    staging = conn.open_staging(1024)
    with pytest.raises(ValueError, match="does not fit"):
        staging.view("float32", (1024,))
    with pytest.raises(ValueError, match="multiple"):
        staging.view("float32", offset=2)
    with pytest.raises(ValueError, match="past the end"):
        staging.view(offset=staging.size + 1)
    with pytest.raises(ValueError, match="unsupported dtype"):
        staging.view("int64")
    with pytest.raises(AttributeError, match="host memory"):
        staging.view().__cuda_array_interface__
    # numpy and torch dtypes name the element type too.
    assert staging.view(np.float16).dtype == "float16"
    assert staging.view(torch.bfloat16).dtype == "bfloat16"
    assert staging.view(statepool.DType.f32).dtype == "float32"
    gc.collect()
    staging.close()


def test_arena_pages_and_local_decode(setup):
    conn, info, arena = setup
    assert arena.mapped and arena.backend == "host" and arena.memory_space == "host"
    pages = np.asarray(arena.pages())
    assert pages.shape == (arena.page_count, arena.page_stride)
    with conn.open_staging(info.state_bytes_f32) as staging, conn.allocate(arena)[0] as slot:
        state = np.asarray(staging.view("float32"))
        state[:] = np.linspace(-1, 1, state.size, dtype=np.float32)
        conn.compress(slot, staging)
        assert np.array_equal(pages[slot.id, :arena.page_bytes], np.asarray(arena.page(slot)))
        # Decode into a torch tensor (DLPack input) with the arena's codec.
        out = torch.empty(info.state_bytes_f32 // 4, dtype=torch.float32)
        arena.decode(slot, out)
        conn.decompress(slot, staging)
        assert torch.equal(out, torch.from_numpy(state.copy()))
        with pytest.raises(ValueError):
            arena.decode(slot, torch.empty(3))  # wrong size
        del state
    with pytest.raises(BufferError):
        arena.close()
    del pages
    gc.collect()
    arena.close()
    assert not arena.mapped


def test_page_codec_round_trip_with_torch_and_numpy(setup):
    _, info, _ = setup
    codec = statepool.PageCodec(info.layout)
    staged = torch.randn(codec.staged_bytes() // 4)
    page = np.zeros(codec.page_bytes, np.uint8)
    codec.encode(staged, statepool.DType.f32, page)
    back = np.zeros(codec.staged_bytes() // 4, np.float32)
    codec.decode(page, statepool.DType.f32, back)
    assert np.abs(back - staged.numpy()).max() < 0.02 * staged.abs().max().item()
    with pytest.raises(TypeError, match="buffer"):
        codec.decode(page, statepool.DType.f32, [0.0] * 10)
    with pytest.raises(ValueError, match="contiguous"):
        codec.decode(page, statepool.DType.f32, torch.zeros(2, back.size)[:, 0])


def test_views_that_overflow_or_cross_arenas_are_refused(setup):
    conn, info, arena = setup
    staging = conn.open_staging(4096)
    for shape, dtype in [((2**32, 2**32), "uint8"), ((2**62,), "float32"), ((2**63 - 1, 2), "uint8")]:
        with pytest.raises(ValueError, match="does not fit"):
            staging.view(dtype, shape)
    other = conn.open_arena(conn.register_layout(small_layout(statepool.CodecId.int6,
                                                              name="other")), 2)
    slot = conn.allocate(other)[0]
    with pytest.raises(ValueError, match="not of arena"):
        arena.page(slot)
    with pytest.raises(ValueError, match="not of arena"):
        arena.decode(slot, np.zeros(info.state_bytes_f32, np.uint8))
    gc.collect()
    staging.close()


def test_refused_buffers_are_released_and_bfloat16_views_go_through_dlpack(setup):
    import sys
    conn, info, arena = setup
    codec = arena.codec
    strided = np.zeros((2, codec.staged_bytes() // 4), np.float32)[:, ::2]  # not contiguous
    before = sys.getrefcount(strided)
    for _ in range(5):
        with pytest.raises(ValueError, match="contiguous"):
            codec.decode(np.zeros(codec.page_bytes, np.uint8), statepool.DType.f32, strided)
    assert sys.getrefcount(strided) == before  # the DLPack export it made was deleted
    with conn.open_staging(info.state_bytes_bf16) as staging, conn.allocate(arena)[0] as slot:
        # A bfloat16 View has no buffer protocol; decode takes it through DLPack.
        out = staging.view("bfloat16", info.state_bytes_bf16 // 2)
        arena.decode(slot, out, statepool.DType.bf16)
        del out


def test_a_failing_with_block_keeps_its_exception(setup):
    conn, _, _ = setup
    with pytest.raises(KeyError):
        with conn.open_staging(256) as staging:
            view = staging.view()
            raise KeyError("the engine's own error")
    del view
    gc.collect()
