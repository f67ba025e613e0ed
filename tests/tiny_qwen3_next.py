"""The tiny random-weight Qwen3-Next of the engine tests, with the head sizes each engine's
suite gives (tests/sglang/engine/tiny_model.py, tests/vllm/tiny_model.py load this file):
transformers' Qwen3NextConfig (4 layers, gated delta rule and full attention alternating, 4
experts top-2), saved with save_pretrained (safetensors, bf16), and with ``tokenizer`` a local
word-level tokenizer (``w0`` .. ``w511``). Large initial weights (initializer_range 0.5) make
the recurrent state matter for greedy output. Written to a directory the caller gives, never
into the source tree; a directory that already holds the model is left as it is.
"""

from __future__ import annotations

import json
import pathlib

VOCAB = 512


def write(out: pathlib.Path, *, seed: int, attention_heads: int, kv_heads: int, head_dim: int,
          linear_key_heads: int, linear_value_heads: int, linear_key_dim: int,
          linear_value_dim: int, conv_kernel: int, tokenizer: bool) -> pathlib.Path:
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    out = pathlib.Path(out)
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    config = Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
        layer_types=["linear_attention", "full_attention"] * 2,
        num_attention_heads=attention_heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        linear_num_key_heads=linear_key_heads, linear_num_value_heads=linear_value_heads,
        linear_key_head_dim=linear_key_dim, linear_value_head_dim=linear_value_dim,
        linear_conv_kernel_dim=conv_kernel,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
        shared_expert_intermediate_size=64, decoder_sparse_step=1,
        max_position_embeddings=1024, initializer_range=0.5, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    config.architectures = ["Qwen3NextForCausalLM"]
    torch.manual_seed(seed)
    Qwen3NextForCausalLM(config).to(torch.bfloat16).save_pretrained(out,
                                                                    safe_serialization=True)
    # SGLang's own Qwen3NextConfig derives the layer types from full_attention_interval.
    cfg = json.loads((out / "config.json").read_text())
    cfg["full_attention_interval"] = 2
    cfg["torch_dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    if tokenizer:
        _write_tokenizer(out)
    return out


def _write_tokenizer(out: pathlib.Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({f"w{i}": i for i in range(4, VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>")
    fast.save_pretrained(out)
