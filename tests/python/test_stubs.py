"""The type stub python/statepool/_core.pyi is the one python/generate_stub.py makes from the
built module (pybind11-stubgen, installed from PyPI into a venv of the build folder on first
use): whoever changes python/src/ regenerates it. Skipped only when pybind11-stubgen cannot be
installed (no network). No daemon is needed.
"""

from __future__ import annotations

import ast
import difflib
import os
import pathlib
import subprocess
import sys

import pytest

import statepool
from statepool import _core

SOURCE_DIR = pathlib.Path(os.environ.get("STATEPOOL_SOURCE_DIR",
                                         pathlib.Path(__file__).resolve().parents[2]))
GENERATOR = SOURCE_DIR / "python" / "generate_stub.py"
STUB = SOURCE_DIR / "python" / "statepool" / "_core.pyi"
REGENERATE = "cmake --build build --target statepool_stub  (or python3 python/generate_stub.py)"
UNAVAILABLE = 77  # generate_stub.py: pybind11-stubgen cannot be installed


def test_the_stub_is_generated_from_the_module(tmp_path):
    committed = STUB.read_text()
    ast.parse(committed, filename=str(STUB))  # at least valid Python
    python_dir = pathlib.Path(statepool.__file__).resolve().parent.parent  # what is tested
    generated = tmp_path / "_core.pyi"
    result = subprocess.run(
        [sys.executable, str(GENERATOR), "--python-dir", str(python_dir),
         "--output", str(generated)],
        capture_output=True, text=True, timeout=300, check=False)
    if result.returncode == UNAVAILABLE:
        reason = [line for line in result.stderr.splitlines() if "skipped:" in line]
        pytest.skip(reason[0] if reason else "pybind11-stubgen cannot be installed")
    assert result.returncode == 0, f"generate_stub.py failed:\n{result.stdout}{result.stderr}"
    diff = "".join(difflib.unified_diff(committed.splitlines(True),
                                        generated.read_text().splitlines(True),
                                        str(STUB), "generated from the built module", n=1))
    assert not diff, (f"{STUB} is not what the module gives (python/src/ changed?): regenerate "
                      f"it with\n  {REGENERATE}\n{diff[:4000]}")


def test_the_stub_is_in_the_package():
    package = pathlib.Path(statepool.__file__).parent
    assert (package / "py.typed").is_file(), f"no py.typed (PEP 561) in {package}"
    assert (package / "_core.pyi").is_file(), f"no _core.pyi in {package}"
    assert pathlib.Path(_core.__file__).parent == package
    if STUB.resolve() != (package / "_core.pyi").resolve():
        assert (package / "_core.pyi").read_text() == STUB.read_text(), \
            f"{package / '_core.pyi'} is not a copy of {STUB}: rebuild (cmake copies it)"
