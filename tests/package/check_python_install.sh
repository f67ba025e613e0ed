#!/usr/bin/env bash
# `pip install ./python` gives a working statepool package, offline, with Debian's packages:
#   1. a venv of Debian's /usr/bin/python3 with --system-site-packages (setuptools, wheel
#      and numpy come from python3-setuptools, python3-wheel, python3-numpy);
#   2. pip install --no-build-isolation --no-deps --no-index ./python: setup.py builds
#      statepool._core with CMake (client-only) into a build folder of WORK_DIR;
#   3. from outside the repository, the venv's python imports statepool from the venv and
#      round-trips a state through a PageCodec (int8) in numpy buffers; statepool.HAVE_CUDA
#      is what CMake's summary said (setup.py builds with CUDA where nvcc is found, unless
#      STATEPOOL_PYTHON_CUDA=off), and a CUDA module imports on a machine without a GPU.
# Exits 77 (ctest: skipped) with a SKIPPED: line when a prerequisite is missing.
# The module is built without CUDA here unless STATEPOOL_PYTHON_CUDA says otherwise
# (auto, on): the test run builds the CUDA sources once, in the main build; set
# STATEPOOL_PYTHON_CUDA=auto to check the pip-installed CUDA module too (about 3 more
# minutes on two cores).
# Usage: check_python_install.sh SOURCE_DIR WORK_DIR [CXX_COMPILER]
set -euo pipefail
export STATEPOOL_PYTHON_CUDA=${STATEPOOL_PYTHON_CUDA:-off}
source_dir=$1
work=$2
if [[ -n "${3:-}" ]]; then export CXX=$3; fi

skip() { echo "SKIPPED: $*"; exit 77; }
python=/usr/bin/python3
[[ -x $python ]] || skip "no $python (Debian: python3)"
$python -c 'import ensurepip, venv' 2>/dev/null || skip "no venv module (Debian: python3-venv)"
for module in setuptools wheel numpy; do
  $python -c "import $module" 2>/dev/null || skip "$python has no $module (Debian: python3-$module)"
done
include=$($python -c 'import sysconfig; print(sysconfig.get_path("include"))')
[[ -f $include/Python.h ]] || skip "no $include/Python.h (Debian: python3-dev)"
found() { local f; for f in "$@"; do [[ -f $f ]] && return 0; done; return 1; }
found /usr/lib/cmake/pybind11/pybind11Config.cmake /usr/share/cmake/pybind11/pybind11Config.cmake \
      /usr/local/share/cmake/pybind11/pybind11Config.cmake ||
  skip "no pybind11 (Debian: pybind11-dev)"
found /usr/include/dlpack/dlpack.h /usr/local/include/dlpack/dlpack.h ||
  skip "no dlpack/dlpack.h (Debian: libdlpack-dev)"

rm -rf "$work"
mkdir -p "$work"
venv=$work/venv
echo "== venv ($python, system site packages) =="
$python -m venv --system-site-packages "$venv"

echo "== pip install --no-build-isolation --no-deps --no-index ./python =="
# The build folder of setup.py (STATEPOOL_PYTHON_BUILD_DIR) in WORK_DIR: a fresh build,
# not the one a developer's own pip install left in build-python/.
start=$SECONDS
if ! (cd "$source_dir" && STATEPOOL_PYTHON_BUILD_DIR="$work/build" PIP_CONFIG_FILE=/dev/null \
        "$venv/bin/python" -m pip install -v --no-build-isolation --no-deps --no-index \
        ./python) >"$work/pip.log" 2>&1; then
  tail -n 60 "$work/pip.log"
  echo "pip install failed: $work/pip.log" >&2
  exit 1
fi
echo "built and installed in $((SECONDS - start)) s"
# The configure summary of setup.py's CMake run: "statepool: CUDA kernels ON|OFF, ...".
cuda=$(sed -n 's/.*statepool: CUDA kernels \(ON\|OFF\),.*/\1/p' "$work/pip.log" | tail -n 1)
[[ -n $cuda ]] || { echo "no CMake summary line in $work/pip.log" >&2; exit 1; }
echo "CMake built the module with CUDA kernels $cuda"

echo "== import from outside the repository, PageCodec round trip =="
cd /
env -u PYTHONPATH PYTHONNOUSERSITE=1 "$venv/bin/python" -c '
import sys
from pathlib import Path
import numpy as np
import statepool

venv, source = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
for file in (statepool.__file__, statepool._core.__file__):
    path = Path(file).resolve()
    assert path.is_relative_to(venv), f"{path} is not in the venv {venv}"
    assert not path.is_relative_to(source / "python"), f"{path} is the source tree"

codec = statepool.PageCodec(statepool.StateLayout(
    num_layers=1, num_heads=2, key_dim=8, value_dim=8, codec=statepool.CodecId.int8))
state = np.random.default_rng(7).standard_normal(codec.staged_bytes() // 4).astype(np.float32)
assert state.nbytes == codec.staged_bytes() and codec.page_bytes < state.nbytes
page = np.zeros(codec.page_bytes, dtype=np.uint8)
codec.encode(state, statepool.DType.f32, page)
assert page.any()
back = np.full_like(state, np.nan)
codec.decode(page, statepool.DType.f32, back)
error = float(np.abs(back - state).max())
assert error <= 0.01 * float(np.abs(state).max()), f"int8 round trip off by {error}"
print(f"statepool {statepool.__version__} from {Path(statepool.__file__).parent}: "
      f"{state.nbytes} -> {page.nbytes} bytes, max error {error:.4g}")

cuda = sys.argv[3] == "ON"
assert statepool.HAVE_CUDA == cuda, f"HAVE_CUDA is {statepool.HAVE_CUDA}, CMake said {sys.argv[3]}"
print(f"statepool.HAVE_CUDA: {statepool.HAVE_CUDA}")
' "$venv" "$source_dir" "$cuda"
