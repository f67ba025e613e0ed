"""examples/python/decode_loop.py runs end to end: it spawns its own statepoold, parks and
resumes states through MambaPool, and fp32 pages reproduce the never-parked run exactly."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import statepool

SOURCE_DIR = pathlib.Path(os.environ.get("STATEPOOL_SOURCE_DIR",
                                         pathlib.Path(__file__).resolve().parents[2]))
DAEMON = os.environ.get("STATEPOOL_DAEMON", str(SOURCE_DIR / "build/service/statepoold"))


def table_rows(output: str) -> dict[str, list[str]]:
    """The rows of the example's result table, by codec."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("codec "))
    rows = {}
    for line in lines[start + 2:]:  # after the header and the dashes
        cells = line.split()
        if len(cells) != 10:
            break
        rows[cells[0]] = cells
    return rows


def test_decode_loop_example():
    env = dict(os.environ)
    package_dir = str(pathlib.Path(statepool.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_dir, env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, str(SOURCE_DIR / "examples/python/decode_loop.py"),
         "--spawn-daemon", DAEMON, "--requests", "4", "--tokens", "24", "--slots", "2",
         "--quantum", "4", "--d-model", "128", "--codecs", "fp32,int8"],
        cwd=SOURCE_DIR, env=env, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "seeded, untrained weights" in output
    rows = table_rows(result.stdout)
    # codec tokens/s park+resume page_bytes state_bytes ratio peak agreement divergence error
    fp32, int8 = rows["fp32"], rows["int8"]
    assert fp32[7] == "100.0%" and fp32[8] == "none" and fp32[9] == "0", output
    assert int(fp32[2]) > 0, output  # requests really were parked and resumed
    assert float(int8[5].rstrip("x")) > 3, output
    assert int(int8[3]) * 3 < int(int8[4]), output
