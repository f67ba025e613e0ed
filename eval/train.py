#!/usr/bin/env python3
"""Trains the small fidelity models (GDN and KDA) on the CPU.

Two corpora (`--corpus`):
- kjv (default): the King James Bible from Debian's bible-kjv-text package (read through
  the `bible` program of the bible-kjv package; the KJV text is in the public domain, see
  eval/data/SOURCES.md). Two books are held out of training: Proverbs (the calibration
  text) and the Gospel of John (the evaluation text).
- fortunes: the fortune cookie files of Debian's fortunes and fortunes-min packages
  (/usr/share/games/fortunes). Two files are held out: wisdom (calibration) and
  literature (evaluation).
`--write-data` (re)writes the corpus's two committed files in eval/data.

    /usr/bin/python3 eval/train.py --arch gdn --out eval/models/gdn
    /usr/bin/python3 eval/train.py --arch kda --out eval/models/kda
    /usr/bin/python3 eval/train.py --arch gdn --corpus fortunes --fast-heads \
        --out eval/models/gdn-fast

Each run writes the weights as float32 .npy files plus manifest.json (shapes, dtypes,
CRC-32 checksums, the configuration and how training went) and reference.npy: the
PyTorch logits of the first REFERENCE_TOKENS bytes of the evaluation text, which the C++
inference is tested against (tests/eval). Nothing in the evaluation needs this script.

The model (byte-level, vocabulary 256), per layer (pre-norm, residual):
    x += LinearAttention(RMSNorm(x));  x += MLP(RMSNorm(x))
LinearAttention: q, k, v = linear(x) per head; q, k L2-normalised, q / sqrt(K);
gate g = -exp(A_log) * softplus(a(x) + dt_bias) (GDN: one per head; KDA: one per key
channel, a(x) low-rank); beta = sigmoid(b(x)); the gated delta rule of
kernels/include/statepool/kernels/recurrence.hpp; o = RMSNorm(S^T q) * w per head; out
= linear(o). MLP: linear(silu(linear(x))). Final RMSNorm, LM head tied to the embedding.
No short convolution: the conv state is not touched by the state codecs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
import zlib

# One thread per training run (two runs share the two cores); OpenBLAS reads this at load.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
FORMAT = "statepool-eval-model-1"
REFERENCE_TOKENS = 128
CALIBRATION_BOOK = "Proverbs"
EVALUATION_BOOK = "John"
FORTUNES = "/usr/share/games/fortunes"
CALIBRATION_FORTUNES = "wisdom"
EVALUATION_FORTUNES = "literature"
# Per corpus: (calibration file, evaluation file) in eval/data, relative to eval/.
TEXTS = {"kjv": ("data/calibration.txt", "data/heldout.txt"),
         "fortunes": ("data/fortunes-calibration.txt", "data/fortunes-heldout.txt")}
EPS = 1e-6
CHUNK = 16  # tokens per chunk of the training-time recurrence


def read_bible() -> dict[str, str]:
    """Book name -> its verses, one per line (verse numbers and chapter headings dropped)."""
    try:
        text = subprocess.run(["bible", "-l0", "Gen1:1-Rev22:21"], check=True,
                              capture_output=True, text=True).stdout
    except FileNotFoundError:
        sys.exit("train.py: the `bible` program is missing: apt-get install bible-kjv")
    books: dict[str, list[str]] = {}
    book = None
    heading = re.compile(r"^(\S.*) (\d+)$")
    verse = re.compile(r"^\s+\d+ (.*)$")
    for line in text.splitlines():
        if m := heading.match(line):
            book = m.group(1)
            books.setdefault(book, [])
        elif m := verse.match(line):
            books[book].append(m.group(1))
    if len(books) != 66:
        sys.exit(f"train.py: expected the 66 books of the KJV, got {len(books)}")
    return {name: "\n".join(lines) + "\n" for name, lines in books.items()}


def read_fortunes() -> dict[str, bytes]:
    """File name -> its bytes, for every fortune file (not the .dat indexes, the .u8
    variants or links) of the fortunes and fortunes-min packages."""
    if not os.path.isdir(FORTUNES):
        sys.exit("train.py: the fortune files are missing: apt-get install fortunes fortunes-min")
    files = {}
    for name in sorted(os.listdir(FORTUNES)):
        path = os.path.join(FORTUNES, name)
        if "." in name or os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            files[name] = f.read()
    for needed in (CALIBRATION_FORTUNES, EVALUATION_FORTUNES):
        if needed not in files:
            sys.exit(f"train.py: {FORTUNES}/{needed} is missing")
    return files


def corpus(name: str) -> tuple[bytes, bytes, bytes, str]:
    """(training bytes, calibration text, evaluation text, description) of a corpus."""
    if name == "kjv":
        books = read_bible()
        held_out = {CALIBRATION_BOOK, EVALUATION_BOOK}
        train = "".join(b for n, b in books.items() if n not in held_out).encode("ascii")
        return (train, books[CALIBRATION_BOOK].encode("ascii"),
                books[EVALUATION_BOOK].encode("ascii"),
                "King James Bible, Debian package bible-kjv-text (via bible-kjv); "
                f"all books but {CALIBRATION_BOOK} and {EVALUATION_BOOK}")
    files = read_fortunes()
    held_out = {CALIBRATION_FORTUNES, EVALUATION_FORTUNES}
    train = b"".join(b for n, b in files.items() if n not in held_out)
    return (train, files[CALIBRATION_FORTUNES], files[EVALUATION_FORTUNES],
            "fortune files, Debian packages fortunes and fortunes-min; all files but "
            f"{CALIBRATION_FORTUNES} and {EVALUATION_FORTUNES}")


def recurrence(q, k, v, g, beta, state):
    """The gated delta rule token by token, as kernels::gdn_step / kda_step run it.

    q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H] (GDN) or [B, T, H, K] (KDA); beta
    [B, T, H]; state [B, H, K, V]. Returns (o [B, T, H, V], final state)."""
    decay = torch.exp(g)
    decay = decay[..., None, None] if g.dim() == 3 else decay[..., None]
    outs = []
    for i in range(q.shape[1]):
        state = state * decay[:, i]
        kv = torch.einsum("bhk,bhkv->bhv", k[:, i], state)
        u = beta[:, i, :, None] * (v[:, i] - kv)
        state = state + k[:, i, :, :, None] * u[:, :, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, i], state))
    return torch.stack(outs, 1), state


def chunked_recurrence(q, k, v, g, beta, state, chunk):
    """The same recurrence, `chunk` tokens at a time in matrix form (for training speed).

    Within a chunk from state S0, with G_t the cumulative log-decay and Gamma_t = exp(G_t):
    the residuals U solve (I + A) U = diag(beta) (V - (Gamma K) S0), A_tj = beta_t
    k_t^T Gamma_t / Gamma_j k_j (j < t); O = (Gamma Q) S0 + B U with B_tj = q_t^T Gamma_t /
    Gamma_j k_j (j <= t); S_C = Gamma_C S0 + (Gamma_C / Gamma K)^T U. Only decays
    Gamma_t / Gamma_j with j <= t (<= 1) are formed, so nothing overflows."""
    q, k, v, beta = (x.transpose(1, 2) for x in (q, k, v, beta))  # [B, H, T, ...]
    per_channel = g.dim() == 4
    g = g.transpose(1, 2)
    outs = []
    for s in range(0, q.shape[2], chunk):
        qc, kc, vc, bc = (x[:, :, s:s + chunk] for x in (q, k, v, beta))
        G = torch.cumsum(g[:, :, s:s + chunk], dim=2)
        c = qc.shape[2]
        lower = torch.ones(c, c, dtype=torch.bool).tril()
        strict = lower.clone().fill_diagonal_(False)
        if per_channel:
            diff = (G[:, :, :, None, :] - G[:, :, None, :, :])
            decay = torch.exp(diff.masked_fill(~lower[:, :, None], float("-inf")))
            kk = ((kc[:, :, :, None] * kc[:, :, None]) * decay).sum(-1)
            qk = ((qc[:, :, :, None] * kc[:, :, None]) * decay).sum(-1)
            gamma = torch.exp(G)
            k_end = kc * torch.exp(G[:, :, -1:] - G)
            s_decay = torch.exp(G[:, :, -1])[..., None]
        else:
            decay = torch.exp((G[..., :, None] - G[..., None, :]).masked_fill(~lower,
                                                                                float("-inf")))
            kk = (kc @ kc.transpose(-1, -2)) * decay
            qk = (qc @ kc.transpose(-1, -2)) * decay
            gamma = torch.exp(G)[..., None]
            k_end = kc * torch.exp(G[:, :, -1:] - G)[..., None]
            s_decay = torch.exp(G[:, :, -1])[..., None, None]
        a = (kk * bc[..., None]).masked_fill(~strict, 0.0)
        rhs = bc[..., None] * (vc - (kc * gamma) @ state)
        u = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
        outs.append((qc * gamma) @ state + qk.masked_fill(~lower, 0.0) @ u)
        state = s_decay * state + k_end.transpose(-1, -2) @ u
    return torch.cat(outs, 2).transpose(1, 2), state


class RMSNorm(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * self.weight


class LinearAttention(torch.nn.Module):
    def __init__(self, arch: str, d: int, heads: int, key_dim: int, value_dim: int,
                 gate_rank: int) -> None:
        super().__init__()
        self.arch, self.h, self.kd, self.vd = arch, heads, key_dim, value_dim
        self.q = torch.nn.Linear(d, heads * key_dim, bias=False)
        self.k = torch.nn.Linear(d, heads * key_dim, bias=False)
        self.v = torch.nn.Linear(d, heads * value_dim, bias=False)
        self.b = torch.nn.Linear(d, heads)
        # Decay rates A in [1, 16] and initial dt in [1e-3, 1e-1] (log-uniform), as Mamba-2
        # and Qwen3-Next initialise them: heads start with lifetimes from ~1 to ~1000 tokens.
        self.A_log = torch.nn.Parameter(torch.log(torch.empty(heads).uniform_(1, 16)))
        gates = heads if arch == "gdn" else heads * key_dim
        dt = torch.exp(torch.empty(gates).uniform_(math.log(1e-3), math.log(1e-1)))
        if arch == "gdn":
            self.a = torch.nn.Linear(d, heads, bias=False)
        else:
            self.a_down = torch.nn.Linear(d, gate_rank, bias=False)
            self.a = torch.nn.Linear(gate_rank, gates, bias=False)
        self.dt_bias = torch.nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1
        self.o_norm = RMSNorm(value_dim)
        self.o = torch.nn.Linear(heads * value_dim, d, bias=False)

    def gates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(g, beta): g [.., H] (GDN) or [.., H, K] (KDA), beta [.., H]."""
        a = self.a(x if self.arch == "gdn" else self.a_down(x))
        g = -torch.exp(self.A_log).repeat_interleave(a.shape[-1] // self.h) * \
            F.softplus(a + self.dt_bias)
        if self.arch == "kda":
            g = g.unflatten(-1, (self.h, self.kd))
        return g, torch.sigmoid(self.b(x))

    def forward(self, x: torch.Tensor, state: torch.Tensor,
                sequential: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, D], state [B, H, K, V] -> (out [B, T, D], new state)."""
        b, t, _ = x.shape
        q = F.normalize(self.q(x).unflatten(-1, (self.h, self.kd)), dim=-1) / math.sqrt(self.kd)
        k = F.normalize(self.k(x).unflatten(-1, (self.h, self.kd)), dim=-1)
        v = self.v(x).unflatten(-1, (self.h, self.vd))
        g, beta = self.gates(x)
        if sequential:
            o, state = recurrence(q, k, v, g, beta, state)
        else:
            o, state = chunked_recurrence(q, k, v, g, beta, state, CHUNK)
        o = self.o_norm(o)
        return self.o(o.flatten(-2)), state


class Model(torch.nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg["d_model"]
        self.embed = torch.nn.Embedding(cfg["vocab"], d)
        torch.nn.init.normal_(self.embed.weight, std=0.02)
        self.layers = torch.nn.ModuleList()
        for _ in range(cfg["layers"]):
            layer = torch.nn.Module()
            layer.attn_norm = RMSNorm(d)
            layer.attn = LinearAttention(cfg["arch"], d, cfg["heads"], cfg["key_dim"],
                                         cfg["value_dim"], cfg["gate_rank"])
            layer.mlp_norm = RMSNorm(d)
            layer.up = torch.nn.Linear(d, cfg["mlp_hidden"], bias=False)
            layer.down = torch.nn.Linear(cfg["mlp_hidden"], d, bias=False)
            self.layers.append(layer)
        self.final_norm = RMSNorm(d)

    def zero_state(self, batch: int) -> list[torch.Tensor]:
        c = self.cfg
        return [torch.zeros(batch, c["heads"], c["key_dim"], c["value_dim"])
                for _ in range(c["layers"])]

    def forward(self, tokens: torch.Tensor, states: list[torch.Tensor], sequential=False):
        x = self.embed(tokens)
        new_states = []
        for layer, state in zip(self.layers, states):
            a, state = layer.attn(layer.attn_norm(x), state, sequential)
            x = x + a
            x = x + layer.down(F.silu(layer.up(layer.mlp_norm(x))))
            new_states.append(state)
        return self.final_norm(x) @ self.embed.weight.T, new_states


def long_lived_lifetimes(cfg: dict, n: int) -> list[list[float]]:
    """Per long-lived head j < n: the lifetime (tokens) of each of its gates: 1024 / 8^j
    (1024, 128, 16, ...); a KDA head spreads its key channels from half to twice that."""
    out = []
    for j in range(n):
        life = 1024.0 / 8.0 ** j
        if cfg["arch"] == "gdn":
            out.append([life])
        else:
            k = cfg["key_dim"]
            out.append([life * 2.0 ** (2.0 * c / max(1, k - 1) - 1.0) for c in range(k)])
    return out


def fast_lifetimes(cfg: dict) -> list[list[float]]:
    """Every head forgets within 20 tokens: head j of H has lifetime 20 / 10^(j / (H - 1))
    (20, 9.3, 4.3, 2 tokens at H = 4); a KDA head spreads its key channels from half of
    that to all of it."""
    out = []
    heads = cfg["heads"]
    for j in range(heads):
        life = 20.0 / 10.0 ** (j / max(1, heads - 1))
        if cfg["arch"] == "gdn":
            out.append([life])
        else:
            k = cfg["key_dim"]
            out.append([life * 2.0 ** (c / max(1, k - 1) - 1.0) for c in range(k)])
    return out


def fix_long_lived_gates(model: Model, lifetimes: list[list[float]]) -> None:
    """Gives the first len(lifetimes) heads of every layer constant log-decays g = -1 /
    lifetime, independent of the input: their rows of the gate projection are zero,
    A_log = 0 and dt_bias = softplus^-1(1 / lifetime). Called after initialisation and
    after every optimiser step (AdamW's weight decay would move them otherwise), so the
    exported weights hold the gates and the C++ inference needs nothing else."""
    with torch.no_grad():
        for layer in model.layers:
            attn = layer.attn
            per_head = attn.dt_bias.numel() // attn.h
            for j, lives in enumerate(lifetimes):
                attn.A_log[j] = 0.0
                for c, life in enumerate(lives):
                    gate = j * per_head + c
                    rate = torch.tensor(1.0 / life, dtype=torch.float64)
                    attn.dt_bias[gate] = float(rate + torch.log(-torch.expm1(-rate)))
                    attn.a.weight[gate].zero_()


def nats_per_byte(model: Model, data: torch.Tensor, chunk: int) -> float:
    """Mean cross-entropy over `data`, run as one sequence in chunks (state carried)."""
    with torch.no_grad():
        states = model.zero_state(1)
        total, count = 0.0, 0
        for i in range(0, len(data) - 1, chunk):
            x = data[i:i + chunk + 1]
            logits, states = model(x[None, :-1], states)
            total += F.cross_entropy(logits[0], x[1:], reduction="sum").item()
            count += len(x) - 1
        return total / count


def export(model: Model, out: str, info: dict, reference_tokens: torch.Tensor,
           texts: tuple[str, str]) -> None:
    os.makedirs(out, exist_ok=True)
    tensors = {}
    for name, p in model.state_dict().items():
        name = name.replace(".weight", "").replace("attn.", "")
        file = name + ".npy"
        array = np.ascontiguousarray(p.detach().numpy().astype("<f4"))
        np.save(os.path.join(out, file), array)
        with open(os.path.join(out, file), "rb") as f:
            crc = zlib.crc32(f.read())
        tensors[name] = {"file": file, "dtype": "float32", "shape": list(array.shape),
                         "crc32": f"{crc:08x}"}
    with torch.no_grad():
        logits, _ = model(reference_tokens[None], model.zero_state(1))
    np.save(os.path.join(out, "reference.npy"), logits[0].numpy().astype("<f4"))
    with open(os.path.join(out, "reference.npy"), "rb") as f:
        reference_crc = zlib.crc32(f.read())
    manifest = {"format": FORMAT, **model.cfg, "tensors": tensors,
                "reference": {"file": "reference.npy", "tokens": len(reference_tokens),
                              "dtype": "float32", "shape": list(logits[0].shape),
                              "text": texts[1], "crc32": f"{reference_crc:08x}"},
                "training": info}
    if texts != TEXTS["kjv"]:
        manifest["calibration_text"] = texts[0]
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")


def load(directory: str) -> Model:
    """The model of a directory that export() wrote (checksums verified)."""
    with open(os.path.join(directory, "manifest.json")) as f:
        manifest = json.load(f)
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{directory}: not a {FORMAT} model directory")
    cfg = {k: manifest[k] for k in ("arch", "vocab", "d_model", "layers", "heads", "key_dim",
                                    "value_dim", "mlp_hidden", "gate_rank", "rms_eps")}
    model = Model(cfg)
    state = {}
    for name in model.state_dict():
        short = name.replace(".weight", "").replace("attn.", "")
        entry = manifest["tensors"][short]
        path = os.path.join(directory, entry["file"])
        with open(path, "rb") as f:
            if f"{zlib.crc32(f.read()):08x}" != entry["crc32"]:
                raise ValueError(f"{path}: CRC-32 does not match manifest.json")
        state[name] = torch.from_numpy(np.load(path))
    model.load_state_dict(state)
    return model.eval()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", choices=["gdn", "kda"], required=True)
    p.add_argument("--out", required=True, help="directory for the weights and manifest.json")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--minutes", type=float, default=25.0, help="stop training after this long")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--corpus", choices=sorted(TEXTS), default="kjv")
    p.add_argument("--long-lived-heads", type=int, default=0,
                   help="heads per layer whose gates are fixed at long lifetimes "
                        "(1024, 128, 16, ... tokens; see fix_long_lived_gates)")
    p.add_argument("--fast-heads", action="store_true",
                   help="fix every head's gate at a lifetime of at most 20 tokens "
                        "(see fast_lifetimes)")
    p.add_argument("--write-data", action="store_true",
                   help="also (re)write the corpus's calibration and evaluation texts")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    train_bytes, calibration_text, evaluation_text, description = corpus(args.corpus)
    texts = TEXTS[args.corpus]
    here = os.path.dirname(DATA)
    if args.write_data:
        for path, data in zip(texts, (calibration_text, evaluation_text)):
            with open(os.path.join(here, path), "wb") as f:
                f.write(data)
    train = torch.tensor(list(train_bytes), dtype=torch.long)
    with open(os.path.join(here, texts[1]), "rb") as f:
        heldout = torch.tensor(list(f.read()), dtype=torch.long)
    if not torch.equal(heldout[:1000], torch.tensor(list(evaluation_text[:1000]))):
        sys.exit(f"train.py: eval/{texts[1]} is not the corpus's evaluation text "
                 "(run with --write-data)")

    cfg = {"arch": args.arch, "vocab": 256, "d_model": 128, "layers": 3, "heads": 4,
           "key_dim": 64, "value_dim": 64, "mlp_hidden": 384,
           "gate_rank": 0 if args.arch == "gdn" else 16, "rms_eps": EPS}
    model = Model(cfg)
    if not 0 <= args.long_lived_heads <= cfg["heads"]:
        sys.exit(f"train.py: --long-lived-heads must be between 0 and {cfg['heads']}")
    if args.fast_heads and args.long_lived_heads:
        sys.exit("train.py: --fast-heads and --long-lived-heads exclude each other")
    lifetimes = (fast_lifetimes(cfg) if args.fast_heads
                 else long_lived_lifetimes(cfg, args.long_lived_heads))
    fix_long_lived_gates(model, lifetimes)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = 50
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) *
        (0.1 + 0.45 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps))))
    start = time.monotonic()
    step, loss_avg = 0, None
    for step in range(1, args.steps + 1):
        starts = torch.randint(0, len(train) - args.seq - 1, (args.batch,))
        x = torch.stack([train[s:s + args.seq + 1] for s in starts.tolist()])
        logits, _ = model(x[:, :-1], model.zero_state(args.batch))
        loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        fix_long_lived_gates(model, lifetimes)
        schedule.step()
        loss_avg = loss.item() if loss_avg is None else 0.98 * loss_avg + 0.02 * loss.item()
        elapsed = time.monotonic() - start
        if step % 50 == 0:
            print(f"{args.arch} step {step}: train loss {loss_avg:.3f} nats/byte, "
                  f"{elapsed / 60:.1f} min", flush=True)
        if elapsed > args.minutes * 60:
            print(f"{args.arch}: time limit reached at step {step}", flush=True)
            break
    model.eval()
    held = nats_per_byte(model, heldout[:8192], 512)
    print(f"{args.arch}: held-out loss {held:.3f} nats/byte "
          f"(perplexity {math.exp(held):.2f}) on the first 8192 bytes of eval/{texts[1]}",
          flush=True)
    info = {"corpus": description,
            "train_bytes": len(train), "steps": step, "batch": args.batch, "seq": args.seq,
            "lr": args.lr, "seed": args.seed, "seconds": round(time.monotonic() - start),
            "threads": args.threads, "train_loss": round(loss_avg, 4),
            "long_lived_heads": args.long_lived_heads,
            "fixed_gate_lifetimes" if args.fast_heads else "long_lived_lifetimes":
                [[round(x, 3) for x in lives] for lives in lifetimes],
            "heldout_loss_8192": round(held, 4), "torch": torch.__version__}
    export(model, args.out, info, heldout[:REFERENCE_TOKENS], texts)
    print(f"{args.arch}: wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
