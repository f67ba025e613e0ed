"""The tiny random-weight Qwen3-Next of the CPU engine test (tests/tiny_qwen3_next.py writes
it), with a local word-level tokenizer (`w0` .. `w511`). Everything is written to a directory
the caller gives (a pytest tmp dir or a cache dir), never into the source tree."""

from __future__ import annotations

import importlib.util
import pathlib
import sys


def build(out: pathlib.Path, seed: int = 1234) -> pathlib.Path:
    spec = importlib.util.spec_from_file_location(
        "tiny_qwen3_next", pathlib.Path(__file__).resolve().parents[2] / "tiny_qwen3_next.py")
    writer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(writer)
    return writer.write(out, seed=seed, attention_heads=4, kv_heads=2, head_dim=32,
                        linear_key_heads=2, linear_value_heads=4, linear_key_dim=32,
                        linear_value_dim=32, conv_kernel=4, tokenizer=True)


if __name__ == "__main__":
    print(build(pathlib.Path(sys.argv[1])))
