"""Builds statepool._core for `pip install ./python` (metadata: pyproject.toml).

The extension is not compiled by setuptools: build_ext runs the project's own CMake build
on the repository (the folder above this one; pip >= 21.3 builds ./python in place),
client-only, and builds the one target statepool_python (python/CMakeLists.txt) straight
into setuptools' build folder. Needs (Debian packages): cmake (>= 3.25), a C++20 compiler
(g++ >= 12), flatbuffers-compiler and libflatbuffers-dev, pybind11-dev, python3-dev and
libdlpack-dev. Environment: CMAKE_BUILD_PARALLEL_LEVEL (jobs; default: the usable CPUs),
CMAKE_ARGS (extra configure arguments), STATEPOOL_PYTHON_BUILD_DIR (the build folder),
STATEPOOL_PYTHON_CUDA (auto, on or off; below).

CUDA: by default (auto) the module is built with the client's CUDA side (device memory of
the cuda backend mapped here, Pending.synchronize/wait, DeviceDecoder, DeviceDecodeStep:
statepool.HAVE_CUDA) when CMake finds nvcc (on PATH, $CUDACXX or /usr/local/cuda/bin/nvcc),
and without it otherwise, as the project's own build does. "on" fails when nvcc is not
found; "off" never builds it. A CUDA module links the toolkit's shared libcudart (found at
run time through the module's RUNPATH, the toolkit's library folder) and reaches the driver
through it, so it imports and works on the host backend on machines without a GPU or driver.
The kernels are built for STATEPOOL_CUDA_ARCHITECTURES (80;90; CMAKE_ARGS can say
"-DSTATEPOOL_CUDA_ARCHITECTURES=native").
"""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PACKAGES = ("cmake g++ flatbuffers-compiler libflatbuffers-dev pybind11-dev python3-dev "
            "libdlpack-dev")
# Build (and write the .egg-info) outside python/: the repository's .gitignore ignores
# /build*, so a pip install leaves no untracked files in the checkout.
BUILD_BASE = Path(os.environ.get("STATEPOOL_PYTHON_BUILD_DIR") or ROOT / "build-python")
BUILD_BASE.mkdir(parents=True, exist_ok=True)


def fail(problem):
    raise SystemExit(f"statepool: {problem}\n"
                     f"statepool: on Debian/Ubuntu: apt-get install {PACKAGES}")


def cuda_mode():
    """STATEPOOL_PYTHON_CUDA as 'auto', 'on' or 'off'."""
    value = os.environ.get("STATEPOOL_PYTHON_CUDA", "auto").strip().lower()
    modes = {"auto": "auto", "": "auto", "on": "on", "1": "on", "yes": "on", "true": "on",
             "off": "off", "0": "off", "no": "off", "false": "off"}
    if value not in modes:
        fail(f"STATEPOOL_PYTHON_CUDA={value!r}: use auto, on or off")
    return modes[value]


def cmake_cache(build_dir):
    """The entries NAME:TYPE=VALUE of CMakeCache.txt, as {NAME: VALUE}."""
    entries = {}
    cache = build_dir / "CMakeCache.txt"
    for line in cache.read_text().splitlines() if cache.exists() else []:
        name, sep, value = line.partition("=")
        if sep and not line.startswith(("#", "//")):
            entries[name.split(":")[0]] = value
    return entries


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        if not (ROOT / "CMakeLists.txt").is_file() or not (ROOT / "client").is_dir():
            fail(f"{ROOT} is not a statepool checkout: build from one with pip >= 21.3 "
                 "(`pip install ./python`), not from an sdist or a copy of python/ alone")
        cmake = shutil.which("cmake") or fail("cmake (>= 3.25) not found")
        if not shutil.which("flatc"):
            fail("flatc not found (FlatBuffers: flatbuffers-compiler, libflatbuffers-dev)")

        # Where setuptools wants the module: <build_lib>/statepool/_core<EXT_SUFFIX>. CMake
        # puts it, and copies the .py files, into ${STATEPOOL_PYTHON_DIR}/statepool.
        module = Path(self.get_ext_fullpath(ext.name)).resolve()
        cuda = cuda_mode()
        build_dir = Path(self.build_temp).resolve() / "cmake"
        configure = [cmake, "-S", str(ROOT), "-B", str(build_dir),
                     "-DCMAKE_BUILD_TYPE=" + ("Debug" if self.debug else "Release"),
                     "-DSTATEPOOL_CLIENT_ONLY=ON", "-DSTATEPOOL_PYTHON=ON",
                     "-DSTATEPOOL_CLIENT_CUDA=" + ("OFF" if cuda == "off" else "ON"),
                     "-DPython3_EXECUTABLE=" + sys.executable,
                     "-DSTATEPOOL_PYTHON_DIR=" + str(module.parent.parent)]
        if shutil.which("ninja") and not (build_dir / "CMakeCache.txt").exists():
            configure += ["-G", "Ninja"]  # only on the first configure of build_dir
        configure += shlex.split(os.environ.get("CMAKE_ARGS", ""))

        result = subprocess.run(configure, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        print(result.stdout, flush=True)
        if result.returncode != 0:
            hints = {"CMAKE_CXX_COMPILER": "no C++ compiler found (g++ >= 12, or set CXX)",
                     "CXX20": "the C++ compiler does not support C++20 (g++ >= 12)",
                     "FlatBuffers": "FlatBuffers not found (libflatbuffers-dev)",
                     "Python3_INCLUDE_DIRS": "Python.h not found (python3-dev)"}
            found = [hint for key, hint in hints.items() if key in result.stdout]
            fail("CMake configure failed (output above)" + "".join(f"; {h}" for h in found))
        # Without pybind11 or dlpack.h, python/CMakeLists.txt skips the module; the summary
        # line of the top-level CMakeLists.txt says "Python module ON" when it is built.
        if "Python module ON" not in result.stdout:
            cache = cmake_cache(build_dir)
            missing = [package for package, entry in (("pybind11-dev", "pybind11_DIR"),
                       ("libdlpack-dev", "STATEPOOL_DLPACK_INCLUDE_DIR"))
                       if cache.get(entry, "NOTFOUND").endswith("NOTFOUND")]
            fail("CMake skipped the Python module: missing "
                 + (", ".join(missing) or f"python3-dev (Python.h of {sys.executable})"))
        # The same summary line says "CUDA kernels ON" when nvcc was found and used.
        if cuda == "on" and "CUDA kernels ON" not in result.stdout:
            fail("STATEPOOL_PYTHON_CUDA=on, but CMake found no nvcc (put it on PATH, set "
                 "CUDACXX, or install the CUDA toolkit in /usr/local/cuda)")

        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(
            len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1)
        build = [cmake, "--build", str(build_dir), "--target", "statepool_python",
                 "--parallel", jobs]
        if subprocess.run(build).returncode != 0:
            fail("building statepool_python failed (output above; needs a C++20 compiler, "
                 "g++ >= 12)")
        if not module.exists():
            fail(f"CMake built no {module}: is {sys.executable} the Python CMake found?")


setup(
    packages=["statepool"],  # explicit: python/src/ would make discovery expect a src layout
    package_data={"statepool": ["*.pyi", "py.typed"]},
    ext_modules=[Extension("statepool._core", sources=[])],  # sources: CMake's business
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": str(BUILD_BASE)},
             "egg_info": {"egg_base": str(BUILD_BASE)}},
)
