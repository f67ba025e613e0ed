"""A tiny random-weight Qwen3-Next for the CPU engine test: transformers' Qwen3NextConfig (4
layers alternating gated-delta-rule and full attention, 4 experts top-2), saved as safetensors
with a local word-level tokenizer (`w0` .. `w511`). Large initial weights (initializer_range 0.5)
make the recurrent state matter for greedy output. Everything is written to a directory the
caller gives (a pytest tmp dir or a cache dir), never into the source tree."""

from __future__ import annotations

import json
import pathlib
import sys

VOCAB = 512


def build(out: pathlib.Path, seed: int = 1234) -> pathlib.Path:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3NextConfig, Qwen3NextForCausalLM

    out = pathlib.Path(out)
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    config = Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
        layer_types=["linear_attention", "full_attention"] * 2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
        linear_value_head_dim=32, linear_conv_kernel_dim=4,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
        shared_expert_intermediate_size=64, decoder_sparse_step=1,
        max_position_embeddings=1024, initializer_range=0.5, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    config.architectures = ["Qwen3NextForCausalLM"]
    torch.manual_seed(seed)
    model = Qwen3NextForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    # SGLang's own Qwen3NextConfig derives the layer types from full_attention_interval.
    cfg = json.loads((out / "config.json").read_text())
    cfg["full_attention_interval"] = 2
    cfg["torch_dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(cfg, indent=2))

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({f"w{i}": i for i in range(4, VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>")
    fast.save_pretrained(out)
    return out


if __name__ == "__main__":
    print(build(pathlib.Path(sys.argv[1])))
