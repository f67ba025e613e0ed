"""The tiny random-weight Qwen3-Next of the vLLM tests (tests/tiny_qwen3_next.py writes it),
with no tokenizer: the engines take token-id prompts (``skip_tokenizer_init=True``).

The sizes are what vLLM 0.32's CPU backend needs and what makes its blocks small:

- linear key and value head dims 128 (the CPU gated-delta-rule kernel takes no other), 1 key
  head and 2 value heads: a recurrent state of 2 x 128 x 128 fp32 (128 KiB) per layer;
- attention head dim 128 (in the CPU attention backend's list), 4 KV heads: a block of 128
  tokens is 256 KiB per layer in bf16, which the 134,144-byte Mamba page fits in, so vLLM's
  hybrid allocator keeps 128-token blocks (more value heads make the Mamba page, and with it
  the block, larger: 640 tokens for 4 value heads).
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys

BLOCK = 128                   # tokens per vLLM block with these sizes
LINEAR_LAYERS = 2             # model.layers.0 and .2: one Mamba group
ATTENTION_LAYERS = 2          # model.layers.1 and .3: one attention group
STATE = (2, 128, 128)         # [value heads][value][key], per linear layer
CONV = (3, 512)               # vLLM's "SD" conv state: [kernel - 1][conv_dim]
KV_HEADS, HEAD_DIM = 4, 128


def build(out: pathlib.Path, seed: int = 1234) -> pathlib.Path:
    spec = importlib.util.spec_from_file_location(
        "tiny_qwen3_next", pathlib.Path(__file__).resolve().parents[1] / "tiny_qwen3_next.py")
    writer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(writer)
    return writer.write(out, seed=seed, attention_heads=8, kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                        linear_key_heads=1, linear_value_heads=STATE[0],
                        linear_key_dim=STATE[2], linear_value_dim=STATE[1],
                        conv_kernel=CONV[0] + 1, tokenizer=False)


if __name__ == "__main__":
    print(build(pathlib.Path(sys.argv[1])))
