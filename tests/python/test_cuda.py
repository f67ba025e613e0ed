"""The binding on the cuda backend: device staging and pages as device views.

Needs a GPU and a statepoold built with CUDA; skipped otherwise (ctest python.pytest_gpu,
label gpu, reports it as skipped). Device memory is written and read with the CUDA runtime
through ctypes, so neither CuPy nor a CUDA build of PyTorch is needed; with a CUDA PyTorch
the views are also checked as torch tensors.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob

import numpy as np
import pytest
import torch

import statepool
from conftest import Daemon, small_layout

H2D, D2H = 1, 2  # cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost


def load_cudart():
    candidates = [ctypes.util.find_library("cudart")]
    candidates += sorted(glob.glob("/usr/local/cuda/lib64/libcudart.so*"))
    for name in filter(None, candidates):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        if lib.cudaGetDeviceCount(ctypes.byref(count)) == 0 and count.value > 0:
            return lib
    return None


@pytest.fixture(scope="module")
def cudart():
    lib = load_cudart()
    if lib is None:
        pytest.skip("no CUDA device (or no CUDA runtime library)")
    return lib


@pytest.fixture(scope="module")
def cuda_daemon(cudart, tmp_path_factory):
    try:
        d = Daemon(tmp_path_factory.mktemp("cuda"), extra=["--backend", "cuda", "--device", "0"],
                   pool_capacity="256MiB")
    except RuntimeError as e:
        pytest.skip(f"statepoold --backend cuda does not start here: {e}")
    yield d
    assert d.stop() == 0, d.log()


def copy(cudart, dst: int, src: int, nbytes: int, kind: int) -> None:
    assert cudart.cudaMemcpy(ctypes.c_void_p(dst), ctypes.c_void_p(src),
                             ctypes.c_size_t(nbytes), ctypes.c_int(kind)) == 0


def test_device_staging_and_pages_round_trip(cudart, cuda_daemon):
    with cuda_daemon.connect() as conn:
        info = conn.register_layout(small_layout(statepool.CodecId.int8))
        arena = conn.open_arena(info, 4)
        assert arena.backend == "cuda" and arena.memory_space == "device"
        assert arena.device_ptr != 0 and not arena.mapped
        staging = conn.open_staging(info.state_bytes_f32)
        assert staging.memory_space == "device" and staging.device_ptr != 0

        view = staging.view("uint8", info.state_bytes_f32)
        assert view.device.startswith("cuda:") and view.__dlpack_device__()[0] == 2
        cai = view.__cuda_array_interface__
        assert cai["data"] == (staging.device_ptr, False) and cai["shape"] == (view.nbytes,)
        assert cai["typestr"] == "|u1" and cai["version"] == 3
        with pytest.raises(BufferError, match="device memory"):
            memoryview(view)

        host = np.random.default_rng(3).standard_normal(info.state_bytes_f32 // 4,
                                                        dtype=np.float32)
        host[-(info.layout.num_layers * info.layout.conv_channels *
               info.layout.conv_width) // 2:] = 0.5  # a finite bf16 conv state
        copy(cudart, staging.device_ptr, host.ctypes.data, host.nbytes, H2D)
        slot = conn.allocate(arena)[0]
        conn.compress(slot, staging)

        # The device page holds the bytes the CPU codec writes.
        codec = statepool.PageCodec(info.layout)
        expected_page = np.zeros(info.page_bytes, np.uint8)
        codec.encode(host, statepool.DType.f32, expected_page)
        page = np.zeros(info.page_bytes, np.uint8)
        copy(cudart, page.ctypes.data, arena.page(slot).data_ptr, page.nbytes, D2H)
        assert np.array_equal(page, expected_page)

        assert cudart.cudaMemset(ctypes.c_void_p(staging.device_ptr), 0,
                                 ctypes.c_size_t(host.nbytes)) == 0
        conn.decompress(slot, staging)
        back = np.zeros_like(host)
        copy(cudart, back.ctypes.data, staging.device_ptr, back.nbytes, D2H)
        expected = np.zeros_like(host)
        codec.decode(expected_page, statepool.DType.f32, expected)
        assert np.array_equal(back, expected)

        if torch.cuda.is_available():
            tensor = torch.from_dlpack(staging.view("float32", host.size))
            assert tensor.is_cuda and torch.equal(tensor.cpu(), torch.from_numpy(expected))
            del tensor
        slot.free()
        del view
