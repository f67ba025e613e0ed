"""The binding on the cuda backend: device staging and pages as device views, and the CUDA
side of the client (Pending.synchronize/wait, Arena.decode on the device, DeviceDecoder,
DeviceDecodeStep) when the module is built with CUDA (statepool.HAVE_CUDA).

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


# --- the CUDA side of the client: Pending, device decode, the device step --------------------
# (a module built with CUDA: statepool.HAVE_CUDA; skipped otherwise)

D2D = 3  # cudaMemcpyDeviceToDevice


@pytest.fixture(scope="module")
def cuda_module(cudart):
    if not statepool.HAVE_CUDA:
        pytest.skip("the statepool module was built without CUDA (statepool.HAVE_CUDA is False)")


class DeviceArray:
    """cudaMalloc'ed memory holding a copy of a numpy array, offered through
    __cuda_array_interface__ (what CuPy and Numba arrays offer), so the tests need no CUDA
    build of PyTorch."""

    def __init__(self, cudart, host: np.ndarray) -> None:
        self.cudart, self.dtype, self.shape = cudart, host.dtype, host.shape
        self.nbytes = host.nbytes
        ptr = ctypes.c_void_p()
        assert cudart.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(max(host.nbytes, 1))) == 0
        self.ptr = ptr.value
        copy(cudart, self.ptr, np.ascontiguousarray(host).ctypes.data, host.nbytes, H2D)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"data": (self.ptr, False), "shape": self.shape, "typestr": self.dtype.str,
                "strides": None, "version": 3}

    def numpy(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        copy(self.cudart, out.ctypes.data, self.ptr, self.nbytes, D2H)
        return out

    def free(self) -> None:
        assert self.cudart.cudaFree(ctypes.c_void_p(self.ptr)) == 0


class HostArray:
    """Host memory that claims __cuda_array_interface__: must be refused before a launch."""

    def __init__(self, host: np.ndarray) -> None:
        self.host = host

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"data": (self.host.ctypes.data, False), "shape": self.host.shape,
                "typestr": self.host.dtype.str, "strides": None, "version": 3}


@pytest.fixture
def stream(cudart):
    handle = ctypes.c_void_p()
    assert cudart.cudaStreamCreate(ctypes.byref(handle)) == 0
    yield handle.value
    assert cudart.cudaStreamDestroy(handle) == 0


def sync(cudart, stream: int) -> None:
    assert cudart.cudaStreamSynchronize(ctypes.c_void_p(stream)) == 0


def finite_state(info, seed: int) -> np.ndarray:
    l = info.layout
    host = np.zeros(info.state_bytes_f32 // 4, dtype=np.float32)
    n = l.num_layers * l.num_heads * l.key_dim * l.value_dim
    host[:n] = np.random.default_rng(seed).standard_normal(n, dtype=np.float32) * 0.5
    host.view(np.uint16)[2 * n:] = 0x3F00  # bf16 0.5 in the conv part
    return host


def test_pending_synchronize_and_wait_on_a_stream(cudart, cuda_module, cuda_daemon, stream):
    with cuda_daemon.connect() as conn:
        info = conn.register_layout(small_layout(statepool.CodecId.int8, name="gpu-pending"))
        arena = conn.open_arena(info, 4)
        stride = -(-info.state_bytes_f32 // 256) * 256
        staging = conn.open_staging(2 * stride)
        host = finite_state(info, 11)
        copy(cudart, staging.device_ptr, host.ctypes.data, host.nbytes, H2D)
        slot, other = conn.allocate(arena, 2)

        pending = conn.compress_async(arena.id, slot.id, staging.id, 0)
        assert pending.bytes == info.page_bytes
        assert pending.event is None or len(pending.event) == 64
        pending.synchronize()  # the host waits for the daemon's stream
        codec = statepool.PageCodec(info.layout)
        expected_page = np.zeros(info.page_bytes, np.uint8)
        codec.encode(host, statepool.DType.f32, expected_page)
        page = np.zeros_like(expected_page)
        copy(cudart, page.ctypes.data, arena.page(slot).data_ptr, page.nbytes, D2H)
        assert np.array_equal(page, expected_page)

        back = conn.decompress_async(arena.id, slot.id, staging.id, stride)
        assert back.bytes == info.state_bytes_f32
        back.wait(stream)  # our stream waits for the daemon's; the host does not
        out = np.zeros_like(host)
        assert cudart.cudaMemcpyAsync(ctypes.c_void_p(out.ctypes.data),
                                      ctypes.c_void_p(staging.device_ptr + stride),
                                      ctypes.c_size_t(out.nbytes), ctypes.c_int(D2H),
                                      ctypes.c_void_p(stream)) == 0
        sync(cudart, stream)
        expected = np.zeros_like(host)
        codec.decode(expected_page, statepool.DType.f32, expected)
        assert np.array_equal(out, expected)
        copied = conn.copy_async(arena.id, slot.id, other.id)
        copied.wait(0)  # the legacy default stream
        copied.synchronize()
        copy(cudart, page.ctypes.data, arena.page(other).data_ptr, page.nbytes, D2H)
        assert np.array_equal(page, expected_page)
        conn.free([slot, other])
        staging.close()


def test_arena_decode_and_device_decoder(cudart, cuda_module, cuda_daemon, stream):
    with cuda_daemon.connect() as conn:
        info = conn.register_layout(small_layout(statepool.CodecId.int6, name="gpu-decode"))
        arena = conn.open_arena(info, 4)
        stride = -(-info.state_bytes_f32 // 256) * 256
        staging = conn.open_staging(2 * stride)
        host = finite_state(info, 12)
        copy(cudart, staging.device_ptr, host.ctypes.data, host.nbytes, H2D)
        slot = conn.allocate(arena)[0]
        conn.compress(slot, staging)
        codec = arena.codec
        page = np.zeros(info.page_bytes, np.uint8)
        copy(cudart, page.ctypes.data, arena.page(slot).data_ptr, page.nbytes, D2H)

        # Arena.decode on a device arena: the daemon's kernels, here, synchronous.
        arena.decode(slot, staging.view("uint8", info.state_bytes_f32, stride))
        out = np.zeros_like(host)
        copy(cudart, out.ctypes.data, staging.device_ptr + stride, out.nbytes, D2H)
        expected = np.zeros_like(host)
        codec.decode(page, statepool.DType.f32, expected)
        assert np.array_equal(out, expected)

        # DeviceDecoder: enqueued on our stream, bf16 staged recurrent part.
        decoder = statepool.DeviceDecoder(arena, statepool.DType.bf16)
        assert decoder.dtype == statepool.DType.bf16
        assert decoder.staged_bytes == info.state_bytes_bf16
        target = DeviceArray(cudart, np.zeros(info.state_bytes_bf16, np.uint8))
        decoder.decode(slot.id, target, stream=stream)
        sync(cudart, stream)
        expected_bf16 = np.zeros(info.state_bytes_bf16, np.uint8)
        codec.decode(page, statepool.DType.bf16, expected_bf16)
        assert np.array_equal(target.numpy(), expected_bf16)

        # What the host can check is refused before anything is launched.
        with pytest.raises(IndexError):
            decoder.decode(arena.page_count, target)
        with pytest.raises(ValueError, match="bytes"):
            decoder.decode(slot, staging.view("uint8", 16))
        with pytest.raises(TypeError, match="device memory"):
            decoder.decode(slot, np.zeros(info.state_bytes_bf16, np.uint8))
        with pytest.raises(ValueError, match="not device memory"):
            decoder.decode(slot, HostArray(np.zeros(info.state_bytes_bf16, np.uint8)))
        with pytest.raises(BufferError):
            arena.close()  # the decoder holds the arena
        del decoder
        target.free()
        slot.free()
        staging.close()

    # Without the device mapping there is nothing to decode on the device.
    with cuda_daemon.connect(map_device_memory=False) as conn:
        info = conn.register_layout(small_layout(statepool.CodecId.int6, name="gpu-decode"))
        arena = conn.open_arena(info, 4)
        with pytest.raises(ValueError, match="not mapped here"):
            statepool.DeviceDecoder(arena)


def test_device_decode_step_is_the_delta_rule(cudart, cuda_module, cuda_daemon, stream):
    with cuda_daemon.connect() as conn:
        info = conn.register_layout(small_layout(statepool.CodecId.fp32, name="gpu-step"))
        l = info.layout
        L, H, K, V = l.num_layers, l.num_heads, l.key_dim, l.value_dim
        arena = conn.open_arena(info, 4)
        staging = conn.open_staging(info.state_bytes_f32)
        slots = conn.allocate(arena, 2)
        states = []
        for i, slot in enumerate(slots):
            host = finite_state(info, 20 + i)
            copy(cudart, staging.device_ptr, host.ctypes.data, host.nbytes, H2D)
            conn.compress(slot, staging)  # fp32 pages: the state exactly
            states.append(host[:L * H * K * V].reshape(L, H, K, V).copy())

        B, rng = len(slots), np.random.default_rng(5)

        def unit(x):
            return x / np.linalg.norm(x, axis=-1, keepdims=True)

        q = (unit(rng.standard_normal((B, H, K))) / np.sqrt(K)).astype(np.float32)
        k = unit(rng.standard_normal((B, H, K))).astype(np.float32)
        v = rng.standard_normal((B, H, V)).astype(np.float32)
        g = -rng.uniform(0.01, 2.0, (B, H)).astype(np.float32)
        beta = rng.uniform(0.0, 1.0, (B, H)).astype(np.float32)
        dev = {name: DeviceArray(cudart, a) for name, a in
               dict(q=q, k=k, v=v, g=g, beta=beta,
                    out=np.zeros((B, H, V), np.float32),
                    rejected=np.full((B, H), 7, np.uint8),
                    slots=np.array([s.id for s in slots], np.int32)).items()}
        step = statepool.DeviceDecodeStep(arena)
        assert step.codec.page_bytes == info.page_bytes
        layer = 1
        step.run(layer, dev["slots"], dev["q"], dev["k"], dev["v"], dev["g"], dev["beta"],
                 dev["out"], rejected=dev["rejected"], stream=stream)
        sync(cudart, stream)

        # The gated delta rule in float64: S <- exp(g) S; u = beta (v - S^T k); S += k u^T.
        assert np.array_equal(dev["rejected"].numpy(), np.zeros((B, H), np.uint8))
        out = dev["out"].numpy()
        for b, slot in enumerate(slots):
            S = states[b][layer].astype(np.float64) * np.exp(g[b])[:, None, None]
            u = beta[b][:, None] * (v[b] - np.einsum("hk,hkv->hv", k[b], S))
            S = S + k[b][:, :, None] * u[:, None, :]
            np.testing.assert_allclose(out[b], np.einsum("hk,hkv->hv", q[b], S),
                                       rtol=1e-4, atol=1e-5)
            page = np.zeros(info.page_bytes, np.uint8)
            copy(cudart, page.ctypes.data, arena.page(slot).data_ptr, page.nbytes, D2H)
            now = np.zeros(info.state_bytes_f32 // 4, np.float32)
            arena.codec.decode(page, statepool.DType.f32, now)
            now = now[:L * H * K * V].reshape(L, H, K, V)
            np.testing.assert_allclose(now[layer], S, rtol=1e-4, atol=1e-5)
            assert np.array_equal(now[0], states[b][0])  # the other layer is untouched

        # What the host can check is refused before a launch.
        args = [dev[n] for n in ("slots", "q", "k", "v", "g", "beta", "out")]
        with pytest.raises(ValueError, match="layer"):
            step.run(L, *args)
        short = DeviceArray(cudart, np.zeros((B, H, K - 1), np.float32))
        with pytest.raises(ValueError, match="q must have"):
            step.run(0, dev["slots"], short, *args[2:])
        doubles = DeviceArray(cudart, np.zeros((B, H, K), np.float64))
        with pytest.raises(TypeError, match="float32"):
            step.run(0, dev["slots"], doubles, *args[2:])
        with pytest.raises(ValueError, match="not device memory"):
            step.run(0, HostArray(np.array([s.id for s in slots], np.int32)), *args[1:])
        for array in [*dev.values(), short, doubles]:
            array.free()
        del step
        conn.free(slots)
        staging.close()
