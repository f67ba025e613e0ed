"""eval/train.py: the chunked recurrence it trains with is the token-by-token recurrence,
and the committed models, loaded back into PyTorch, produce the committed reference logits
(which tests/eval/test_model.cpp compares the C++ inference with)."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch

from conftest import SOURCE_DIR

EVAL = SOURCE_DIR / "eval"


@pytest.fixture(scope="module")
def train():
    spec = importlib.util.spec_from_file_location("eval_train", EVAL / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("per_channel", [False, True])
def test_chunked_recurrence_is_the_token_by_token_recurrence(train, per_channel):
    torch.manual_seed(3)
    b, t, h, k, v = 2, 37, 3, 8, 5  # 37 tokens: the last chunk is shorter
    q = torch.nn.functional.normalize(torch.randn(b, t, h, k), dim=-1) / math.sqrt(k)
    kk = torch.nn.functional.normalize(torch.randn(b, t, h, k), dim=-1)
    vv = torch.randn(b, t, h, v)
    g = -torch.rand(b, t, h, k) * 3 if per_channel else -torch.rand(b, t, h) * 3
    g[0, 5] = -80.0  # a near reset inside a chunk
    beta = torch.rand(b, t, h)
    state = torch.randn(b, h, k, v)
    o1, s1 = train.recurrence(q, kk, vv, g, beta, state)
    o2, s2 = train.chunked_recurrence(q, kk, vv, g, beta, state, 16)
    assert torch.allclose(o1, o2, atol=1e-5), (o1 - o2).abs().max()
    assert torch.allclose(s1, s2, atol=1e-5), (s1 - s2).abs().max()


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_committed_model_reproduces_its_reference_logits(train, arch):
    model = train.load(str(EVAL / "models" / arch))
    reference = np.load(EVAL / "models" / arch / "reference.npy")
    text = (EVAL / "data" / "heldout.txt").read_bytes()[: reference.shape[0]]
    tokens = torch.tensor(list(text), dtype=torch.long)
    with torch.no_grad():
        logits, _ = model(tokens[None], model.zero_state(1), sequential=True)
        chunked, _ = model(tokens[None], model.zero_state(1))
    assert np.abs(logits[0].numpy() - reference).max() < 1e-4
    assert np.abs(chunked[0].numpy() - reference).max() < 1e-3


def test_damaged_weights_are_refused(train, tmp_path):
    import shutil
    copy = tmp_path / "gdn"
    shutil.copytree(EVAL / "models" / "gdn", copy)
    data = bytearray((copy / "embed.npy").read_bytes())
    data[-1] ^= 1
    (copy / "embed.npy").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="CRC-32"):
        train.load(str(copy))
