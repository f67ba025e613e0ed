"""examples/python/decode_loop.py runs end to end: it spawns its own statepoold, loads the
trained GDN model of eval/models/gdn, generates text for several requests while parking and
resuming their states through MambaPool, and fp32 pages reproduce the never-parked run
exactly. The seeded fallback runs too, and a bad --model is refused."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import statepool

SOURCE_DIR = pathlib.Path(os.environ.get("STATEPOOL_SOURCE_DIR",
                                         pathlib.Path(__file__).resolve().parents[2]))
DAEMON = os.environ.get("STATEPOOL_DAEMON", str(SOURCE_DIR / "build/service/statepoold"))
EXAMPLE = SOURCE_DIR / "examples/python/decode_loop.py"
# A small run: 4 requests x 24 tokens through 2 slots, parked every 4 tokens (a few seconds).
SMALL = ["--requests", "4", "--tokens", "24", "--slots", "2", "--quantum", "4"]


def run_example(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    package_dir = str(pathlib.Path(statepool.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_dir, env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, str(EXAMPLE), *args], cwd=SOURCE_DIR, env=env,
                          capture_output=True, text=True, timeout=300)


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


def reference_texts(output: str) -> list[tuple[str, str]]:
    """(prompt, generated text) of the requests the example prints after the reference."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("reference (FP32"))
    texts = []
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        prompt, _, generated = line[2:].partition("|")
        texts.append((prompt, generated))
    return texts


def test_decode_loop_with_the_trained_model():
    result = run_example("--spawn-daemon", DAEMON, *SMALL, "--codecs", "fp32,int8")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # The default is the trained GDN model of eval/, and the output says so.
    assert "model: trained GDN model eval/models/gdn (0.73 M parameters" in output, output
    assert "no conv state" in output and "seeded" not in output, output
    # The example's token-by-token step is eval/train.py's model (its own forward pass).
    check = re.search(r"step check: .*: ([0-9.e+-]+)$", output, flags=re.M)
    assert check and float(check.group(1)) < 1e-4, output

    # Real text: the trained byte-level model continues Bible verses in English words.
    texts = reference_texts(result.stdout)
    assert len(texts) == 3 and texts[0][0] == "In the beginning God ", output
    for _, generated in texts:
        assert len(generated) == 24, output
        letters = sum(c.isalpha() or c == " " for c in generated)
        assert letters >= 0.8 * len(generated), output
    assert any(re.search(r"\b(the|of|and|LORD)\b", g) for _, g in texts), output

    rows = table_rows(result.stdout)
    # codec tokens/s park+resume page_bytes state_bytes ratio peak agreement divergence error
    fp32, int8 = rows["fp32"], rows["int8"]
    assert fp32[7] == "100.0%" and fp32[8] == "none" and fp32[9] == "0", output
    assert int(fp32[2]) > 0, output  # requests really were parked and resumed
    assert float(fp32[1]) > 0 and int(fp32[6]) > 0, output  # tokens/s and pool bytes
    # 3 layers x 4 heads x 64 x 64 float32, no conv state: 196,608 bytes per state.
    assert int(fp32[3]) == int(fp32[4]) == 3 * 4 * 64 * 64 * 4, output
    assert float(int8[5].rstrip("x")) > 3.5, output
    assert int(int8[3]) * 3 < int(int8[4]), output
    assert int(int8[6]) < int(fp32[6]), output  # the parked pages take less pool memory


def test_decode_loop_seeded_fallback():
    result = run_example("--spawn-daemon", DAEMON, "--model", "seeded", "--requests", "3",
                         "--tokens", "8", "--slots", "2", "--quantum", "4", "--layers", "1",
                         "--d-model", "64", "--codecs", "fp32", "--show", "1")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "seeded, untrained weights" in output and "trained GDN" not in output, output
    fp32 = table_rows(result.stdout)["fp32"]
    assert fp32[7] == "100.0%" and fp32[9] == "0" and int(fp32[2]) > 0, output


def test_decode_loop_refuses_a_missing_model(tmp_path):
    result = run_example("--model", str(tmp_path), "--spawn-daemon", DAEMON)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "not a model directory" in result.stderr
