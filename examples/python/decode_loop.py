#!/usr/bin/env python3
"""A decode loop that parks and resumes request states in statepool.

An engine with only S running slots serves R > S concurrent requests: a round-robin
scheduler runs each request for a quantum of tokens, then parks its recurrent state in a
compressed statepool page (``MambaPool.get_cpu_copy``) and frees the slot; the next waiting
request is resumed (``MambaPool.load_cpu_copy``) into whichever slot it gets. The same
requests are also generated with FP32 states that are never parked (the reference), and
the tokens are compared: with fp32 pages they must agree bit for bit.

The model is, by default, the trained GDN byte-level language model of eval/ (eval/models/gdn,
3 layers x 4 heads of 64 x 64, trained on the King James Bible; eval/README.md), loaded with
eval/train.py's loader; ``--model eval/models/kda`` runs the trained KDA model. When no
trained model is there (or with ``--model seeded``) it falls back to a small GDN with seeded,
untrained weights, whose text is noise; the output says which model ran.

    python3 examples/python/decode_loop.py --spawn-daemon build/service/statepoold
    python3 examples/python/decode_loop.py --socket /run/statepool/statepool.sock

(PYTHONPATH must reach the built package, e.g. PYTHONPATH=build/python.)
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.util
import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional

import torch
import torch.nn.functional as F

import statepool
from statepool.engine import MambaPool

REPO = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO / "eval" / "models" / "gdn"  # the trained GDN model (eval/README.md)
TRAIN_PY = REPO / "eval" / "train.py"  # its PyTorch definition and loader
CONV_KERNEL = 4  # the seeded model's causal short convolution: its state keeps 3 inputs
PROMPTS = [b"The cat sat on", b"Once upon a time", b"def main():", b"SELECT * FROM",
           b"In 1969, the", b"Hello, world", b"statepool parks", b"Dear reader,",
           b"To be or not", b"The quick brown", b"#include <", b"GDN layers keep"]
# The trained models read the King James Bible (without Proverbs and John): verse openings.
BIBLE_PROMPTS = [b"In the beginning God ", b"And the LORD said unto Moses, ",
                 b"Blessed are the ", b"And it came to pass, when ", b"The LORD is my ",
                 b"Then Jesus said unto them, ", b"And he answered and said, ",
                 b"Now the serpent was ", b"And the king said unto ", b"Thus saith the LORD; ",
                 b"And Abraham ", b"Praise ye the LORD. "]


class TinyGDN:
    """The fallback: embedding -> N pre-norm GDN layers (residual) -> final norm -> LM head;
    vocab 256, seeded untrained weights.

    ``step`` advances one request by one token. It reads and writes that request's state
    in place, in the engine's tensors: ``temporal[layer][slot]`` ([H][K][V] float32) and
    ``conv[layer][slot]`` ([H*(2K+V)][3] bfloat16, so bf16 rounding is part of the model).
    """

    trained = False
    arch = "gdn"
    prompts = PROMPTS

    def __init__(self, layers: int, heads: int, key_dim: int, value_dim: int, d_model: int,
                 seed: int) -> None:
        g = torch.Generator().manual_seed(seed)

        def dense(out: int, inp: int) -> torch.Tensor:
            return torch.randn(out, inp, generator=g) / math.sqrt(inp)

        self.L, self.H, self.K, self.V = layers, heads, key_dim, value_dim
        self.conv_channels = heads * (2 * key_dim + value_dim)  # q, k and v channels
        self.conv_width = CONV_KERNEL - 1
        self.description = (f"TinyGDN (seeded, untrained weights; seed {seed}): {layers} layers x "
                            f"{heads} heads, K={key_dim} V={value_dim}, conv "
                            f"{self.conv_channels}x{CONV_KERNEL - 1} bf16, d_model {d_model} -- "
                            f"untrained, so its text is noise")
        self.embed = torch.randn(256, d_model, generator=g)
        self.lm_head = dense(256, d_model)
        # Per-head decay rates spread over (0.80 .. 0.99 per token): some heads forget in a
        # few tokens, others keep information for ~100, so parking errors can linger.
        self.decay_scale = torch.logspace(math.log10(0.3), math.log10(0.015), heads)
        self.layers = [dict(qkv=dense(self.conv_channels, d_model),
                            conv=torch.randn(self.conv_channels, CONV_KERNEL, generator=g) / 2,
                            gate=dense(heads, d_model), beta=dense(heads, d_model),
                            out=dense(d_model, heads * value_dim))
                       for _ in range(layers)]

    @staticmethod
    def _rms(x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean() + 1e-6)

    def step(self, token: int, temporal: torch.Tensor, conv: torch.Tensor,
             slot: int) -> torch.Tensor:
        H, K, V = self.H, self.K, self.V
        x = self.embed[token]
        for layer, w in enumerate(self.layers):
            h = self._rms(x)
            # Causal short conv: the state holds the previous 3 inputs (oldest first).
            conv_state = conv[layer, slot]                                   # [C][3] bf16
            window = torch.cat((conv_state.float(), (w["qkv"] @ h)[:, None]), dim=1)
            conv_state.copy_(window[:, 1:])                                  # rounds to bf16
            qkv = F.silu((window * w["conv"]).sum(dim=1))
            q, k, v = qkv.split([H * K, H * K, H * V])
            q = F.normalize(q.view(H, K), dim=-1) / math.sqrt(K)
            k = F.normalize(k.view(H, K), dim=-1)
            v = v.view(H, V)
            log_decay = -F.softplus(w["gate"] @ h) * self.decay_scale        # g <= 0, [H]
            beta = torch.sigmoid(w["beta"] @ h)                              # [H]
            # Delta rule per head, S [K][V]: decay, then write k (x) beta (v - S^T k).
            S = temporal[layer, slot] * torch.exp(log_decay)[:, None, None]
            u = beta[:, None] * (v - torch.bmm(k[:, None, :], S)[:, 0])      # [H][V]
            S = S + k[:, :, None] * u[:, None, :]
            temporal[layer, slot].copy_(S)
            o = torch.bmm(q[:, None, :], S)[:, 0]                            # S^T q, [H][V]
            x = x + w["out"] @ o.reshape(-1)
        return self.lm_head @ self._rms(x)


def load_train_module():
    """eval/train.py as a module (it is a script, not a package): its Model and load()."""
    if not TRAIN_PY.is_file():
        raise FileNotFoundError(f"{TRAIN_PY} is missing: the trained models need its Model "
                                "class and loader")
    spec = importlib.util.spec_from_file_location("statepool_eval_train", TRAIN_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TrainedModel:
    """A trained model of eval/ (eval/train.py's ``Model``, loaded by its ``load``, which
    checks every tensor's CRC-32), stepped one token at a time on the engine's state tensors.

    ``step`` is eval/train.py's ``recurrence`` for one token, per layer: q, k, v, the gate g
    (GDN: per head; KDA: per key channel) and beta, then S <- exp(g) S, u = beta (v - S^T k),
    S <- S + k u^T, o = S^T q, RMS-normalised per head. It reads and writes
    ``temporal[layer][slot]`` in place. There is no short convolution (no conv state).
    """

    trained = True
    prompts = BIBLE_PROMPTS

    def __init__(self, directory: pathlib.Path) -> None:
        train = load_train_module()
        self.model = train.load(str(directory))
        cfg, manifest = self.model.cfg, json.loads((directory / "manifest.json").read_text())
        self.arch = cfg["arch"]
        self.L, self.H, self.K, self.V = cfg["layers"], cfg["heads"], cfg["key_dim"], \
            cfg["value_dim"]
        self.conv_channels, self.conv_width = 0, 0
        self.embed = self.model.embed.weight
        training = manifest.get("training", {})
        params = sum(p.numel() for p in self.model.parameters())
        where = directory.resolve()
        if where.is_relative_to(REPO):
            where = where.relative_to(REPO)  # eval/models/gdn
        self.description = (
            f"trained {self.arch.upper()} model {where} ({params / 1e6:.2f} M parameters, "
            f"{training.get('steps', '?')} training steps, held-out loss "
            f"{training.get('heldout_loss_8192', '?')} nats/byte): {self.L} layers x {self.H} "
            f"heads, K={self.K} V={self.V}, no conv state, d_model {cfg['d_model']}")

    def step(self, token: int, temporal: torch.Tensor, conv: Optional[torch.Tensor],
             slot: int) -> torch.Tensor:
        H, K, V = self.H, self.K, self.V
        x = self.embed[token]
        for index, layer in enumerate(self.model.layers):
            attn = layer.attn
            h = layer.attn_norm(x)
            q = F.normalize(attn.q(h).view(H, K), dim=-1) / math.sqrt(K)
            k = F.normalize(attn.k(h).view(H, K), dim=-1)
            v = attn.v(h).view(H, V)
            g, beta = attn.gates(h)                           # g [H] or [H][K], beta [H]
            decay = torch.exp(g)
            S = temporal[index, slot] * (decay[:, None, None] if g.dim() == 1
                                         else decay[:, :, None])
            u = beta[:, None] * (v - torch.einsum("hk,hkv->hv", k, S))
            S = S + k[:, :, None] * u[:, None, :]
            temporal[index, slot].copy_(S)
            o = attn.o_norm(torch.einsum("hk,hkv->hv", q, S))
            x = x + attn.o(o.flatten())
            x = x + layer.down(F.silu(layer.up(layer.mlp_norm(x))))
        return self.model.final_norm(x) @ self.embed.T

    def check_step(self, text: bytes) -> float:
        """Largest |logit| difference between ``step`` over ``text`` and eval/train.py's
        own token-by-token forward pass: the example runs the model it claims to."""
        temporal = torch.zeros(self.L, 1, self.H, self.K, self.V)
        ours = torch.stack([self.step(b, temporal, None, 0) for b in text])
        tokens = torch.tensor(list(text), dtype=torch.long)[None]
        theirs, _ = self.model(tokens, self.model.zero_state(1), sequential=True)
        return float((ours - theirs[0]).abs().max())


def load_model(args):
    """The model --model names: a trained model directory, 'seeded', or 'auto' (the trained
    GDN of eval/models/gdn when it is there, else the seeded fallback)."""
    if args.model == "seeded" or (args.model == "auto"
                                  and not (DEFAULT_MODEL / "manifest.json").is_file()):
        if args.model == "auto":
            print(f"no trained model at {DEFAULT_MODEL}: running the seeded fallback")
        return TinyGDN(args.layers, args.heads, args.key_dim, args.value_dim, args.d_model,
                       args.seed)
    directory = DEFAULT_MODEL if args.model == "auto" else pathlib.Path(args.model)
    if not (directory / "manifest.json").is_file():
        raise FileNotFoundError(f"{directory} is not a model directory (no manifest.json; "
                                "eval/README.md says how eval/train.py makes one)")
    return TrainedModel(directory)


class Request:
    """One request: feeds its prompt byte by byte, then its own greedy tokens."""

    def __init__(self, prompt: bytes, max_tokens: int) -> None:
        self.prompt, self.max_tokens, self.pos = prompt, max_tokens, 0
        self.tokens: list[int] = []            # generated tokens (greedy)
        self.logits: list[torch.Tensor] = []   # the logits that chose them
        self.parked = None  # statepool.engine.ParkedStates while waiting

    @property
    def done(self) -> bool:
        return len(self.tokens) == self.max_tokens

    def step(self, model, temporal: torch.Tensor, conv: Optional[torch.Tensor],
             slot: int) -> None:
        token = self.prompt[self.pos] if self.pos < len(self.prompt) else self.tokens[-1]
        logits = model.step(token, temporal, conv, slot)
        self.pos += 1
        if self.pos >= len(self.prompt):
            self.logits.append(logits)
            self.tokens.append(int(logits.argmax()))


def make_requests(model, args) -> list[Request]:
    prompts = model.prompts
    # More requests than prompts: the repeats get a number in front ("1 In the beginning").
    return [Request((b"%d " % (i // len(prompts)) if i >= len(prompts) else b"")
                    + prompts[i % len(prompts)], args.tokens)
            for i in range(args.requests)]


def run_reference(model, args, forget: bool = False) -> tuple[list[Request], float]:
    """FP32 states that are never parked: request i lives in slot i + 1 throughout. With
    ``forget``, the state is zeroed every quantum instead (what parking would be worth if
    it lost everything): a yardstick for the agreement numbers."""
    temporal = torch.zeros(model.L, args.requests + 1, model.H, model.K, model.V)
    conv = torch.zeros(model.L, args.requests + 1, model.conv_channels, model.conv_width,
                       dtype=torch.bfloat16) if model.conv_channels else None
    requests = make_requests(model, args)
    start = time.perf_counter()
    for i, req in enumerate(requests):
        while not req.done:
            req.step(model, temporal, conv, i + 1)
            if forget and req.pos % args.quantum == 0:
                temporal[:, i + 1] = 0
                if conv is not None:
                    conv[:, i + 1] = 0
    return requests, time.perf_counter() - start


def run_parked(model, pool: MambaPool, args) -> dict:
    """R requests through S slots, round robin, parking each preempted state in statepool."""
    temporal = pool.mamba_cache.temporal
    conv = pool.mamba_cache.conv[0] if pool.mamba_cache.conv else None  # none: no conv state
    requests = make_requests(model, args)
    waiting = collections.deque(requests)   # fresh requests first, then parked ones
    running: dict[int, Request] = {}        # engine slot -> request
    parks, peak_pages = 0, 0
    start = time.perf_counter()
    while waiting or running:
        # Admit waiting requests into free slots. alloc() hands out zeroed slots: a fresh
        # request starts from the zero state, a parked one is decompressed over it.
        while waiting and pool.available_size() > 0:
            req, slot = waiting.popleft(), pool.alloc(1)
            if req.parked is not None:
                pool.load_cpu_copy(req.parked, slot)  # resume; frees the page
                req.parked = None
            running[int(slot)] = req
        # One quantum, token-interleaved across the running requests (batch 1 each).
        for _ in range(args.quantum):
            for slot, req in running.items():
                if not req.done:
                    req.step(model, temporal, conv, slot)
        # Retire finished requests; preempt the rest if anyone is waiting for a slot.
        for slot, req in list(running.items()):
            index = torch.tensor([slot])
            if not req.done and not waiting:
                continue                      # nobody waiting: keep the slot
            if not req.done:
                req.parked = pool.get_cpu_copy(index)  # park: compress into a page
                waiting.append(req)
                parks += 1
            pool.free(index)
            del running[slot]
        peak_pages = max(peak_pages, pool.parked_pages)  # pages this pool's parked states hold
    return dict(requests=requests, seconds=time.perf_counter() - start, parks=parks,
                peak_pages=peak_pages)


def compare(reference: list[Request], parked: list[Request]) -> tuple[float, str, float]:
    """Fraction of identical tokens, first diverging token index, and the largest logit
    error while a request still had the reference's inputs (up to its first divergence)."""
    same = [(t, x == y) for ref, run in zip(reference, parked)
            for t, (x, y) in enumerate(zip(ref.tokens, run.tokens))]
    first = min((t for t, ok in same if not ok), default=None)
    error = 0.0
    for ref, run in zip(reference, parked):
        for x, y, a, b in zip(ref.tokens, run.tokens, ref.logits, run.logits):
            error = max(error, float((a - b).abs().max()))
            if x != y:
                break
    return sum(ok for _, ok in same) / len(same), "none" if first is None else str(first), error


class DaemonFailed(RuntimeError):
    """The spawned statepoold did not start, or did not stop cleanly."""


@contextlib.contextmanager
def spawned_daemon(binary: str):
    """statepoold on a temporary socket; SIGTERM at the end, and it must exit with 0."""
    with tempfile.TemporaryDirectory(prefix="statepool-example-") as tmp:
        socket, log_path = os.path.join(tmp, "statepool.sock"), os.path.join(tmp, "daemon.log")
        with open(log_path, "w") as log:
            try:
                proc = subprocess.Popen([binary, "--socket", socket, "--metrics-address", "off",
                                         "--api-address", "off", "--pool-capacity", "64MiB",
                                         "--grace-period", "2s"],
                                        stdout=log, stderr=subprocess.STDOUT)
            except OSError as e:
                raise DaemonFailed(f"cannot run {binary}: {e}") from None
        try:
            deadline = time.monotonic() + 20
            while True:  # wait until it answers Hello
                try:
                    statepool.connect(socket, timeout=2).close()
                    break
                except statepool.TransportError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise DaemonFailed(f"{binary} did not start:\n" + open(log_path).read())
                    time.sleep(0.05)
            yield socket
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if proc.returncode != 0:
            raise DaemonFailed(f"statepoold exited with {proc.returncode}:\n"
                               + open(log_path).read())


def printable(data: bytes) -> str:
    """Bytes as one line of text: printable ASCII as it is, anything else escaped."""
    return "".join(chr(b) if 32 <= b < 127 else f"\\x{b:02x}" for b in data)


def main(args) -> int:
    torch.set_num_threads(1)  # batch-1 steps: threads only add overhead
    codecs = [getattr(statepool.CodecId, name) for name in args.codecs.split(",")]
    conn = statepool.connect(args.socket, tenant=args.tenant)  # first: fail fast
    model = load_model(args)
    # The trained models have no short convolution: a layout without conv state (0 x 0).
    base = statepool.StateLayout(arch=getattr(statepool.Arch, model.arch), num_layers=model.L,
                                 num_heads=model.H, key_dim=model.K, value_dim=model.V,
                                 conv_channels=model.conv_channels,
                                 conv_width=model.conv_width, conv_dtype=statepool.DType.bf16,
                                 name=f"decode-loop-example-{model.arch}")
    print(f"model: {model.description}")
    if model.trained:
        with torch.inference_mode():
            print(f"step check: largest |logit difference| against eval/train.py's forward "
                  f"pass over {len(model.prompts[0])} bytes: "
                  f"{model.check_step(model.prompts[0]):.1e}")
    print(f"{args.requests} requests x {args.tokens} tokens, {args.slots} engine slots, "
          f"quantum {args.quantum} tokens")
    with torch.inference_mode():
        reference, ref_seconds = run_reference(model, args)
    generated = args.requests * args.tokens
    print(f"reference (FP32, never parked): {generated / ref_seconds:.0f} tokens/s")
    for req in reference[:args.show]:
        print(f"  {printable(req.prompt)}|{printable(bytes(req.tokens))}")

    with conn:
        rows, failed, texts = [], False, {}
        for codec in codecs:
            plan = None
            if codec.name.startswith("stepquant"):
                # Every head at the budget width, the default share of FP16 pivots, impact
                # factors 1: uncalibrated (a real plan: statepool-quant calibrate).
                plan = statepool.Plan.nominal(base, int(codec.name[-1]))
                print(f"{codec.name}: nominal, uncalibrated plan {plan}")
            # Room to park every request at once: they may all be waiting.
            with MambaPool(conn, base.with_codec(codec, plan), size=args.slots,
                           capacity=args.requests) as pool, torch.inference_mode():
                run = run_parked(model, pool, args)
                page, state = pool.info.page_bytes, pool.info.state_bytes_f32
            agree, first, error = compare(reference, run["requests"])
            texts[codec.name] = run["requests"]
            rows.append([codec.name, f"{generated / run['seconds']:.0f}", str(run["parks"]),
                         str(page), str(state), f"{state / page:.2f}x",
                         str(run["peak_pages"] * page), f"{100 * agree:.1f}%", first,
                         f"{error:.1e}" if error else "0"])
            if codec == statepool.CodecId.fp32 and not (agree == 1.0 and error == 0.0):
                failed = True

    header = ["codec", "tokens/s", "park+resume", "page_bytes", "state_bytes", "ratio",
              "peak_pool_bytes", "agreement", "first_divergence", "max_logit_err"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    for line in [header, ["-" * w for w in widths]] + rows:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                        enumerate(zip(line, widths))))
    print("agreement: generated tokens identical to the reference; first_divergence: the "
          "first generated-token index (0-based) where any request differs; max_logit_err: "
          "largest |logit - reference| up to each request's first divergence")
    worst = min(rows, key=lambda row: float(row[7].rstrip("%")))
    if worst[7] != "100.0%":  # where the least faithful codec's text left the reference's
        ref, run = next((ref, run) for ref, run in zip(reference, texts[worst[0]])
                        if ref.tokens != run.tokens)
        print(f"{worst[0]}, the first request that differs:\n"
              f"  reference   {printable(ref.prompt)}|{printable(bytes(ref.tokens))}\n"
              f"  {worst[0]:<11} {printable(run.prompt)}|{printable(bytes(run.tokens))}")
    if any(int(row[2]) for row in rows):  # a yardstick: forgetting at the same points
        with torch.inference_mode():
            forgot = run_reference(model, args, forget=True)[0]
        agree, first, _ = compare(reference, forgot)
        print(f"for scale: zeroing the state every {args.quantum} tokens instead of parking "
              f"it gives {100 * agree:.1f}% agreement, first divergence {first}")
        for req in forgot[:min(args.show, 1)]:
            print(f"  {printable(req.prompt)}|{printable(bytes(req.tokens))}")
    if failed:
        print("FAILED: fp32 pages must reproduce the never-parked run exactly", file=sys.stderr)
        return 1
    return 0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--socket", default=statepool.DEFAULT_SOCKET_PATH,
                   help="statepoold's Unix socket")
    p.add_argument("--spawn-daemon", metavar="STATEPOOLD",
                   help="start this statepoold on a temporary socket and stop it at the end")
    p.add_argument("--tenant", default="", help="tenant ('' = the daemon's default)")
    p.add_argument("--model", default="auto",
                   help="a trained model directory of eval/ (eval/models/gdn, eval/models/kda), "
                        "'seeded' for the untrained fallback, or 'auto': eval/models/gdn when "
                        "it is there, else the fallback")
    p.add_argument("--show", type=int, default=3,
                   help="print the reference's text of this many requests")
    p.add_argument("--codecs", default="fp32,bf16,int8,int6,int4,stepquant6,stepquant4",
                   help="comma-separated codecs of the parked pages (docs/codecs.md)")
    p.add_argument("--requests", type=int, default=12, help="concurrent requests (R)")
    p.add_argument("--tokens", type=int, default=64, help="tokens generated per request (T)")
    p.add_argument("--slots", type=int, default=4, help="engine running slots (S)")
    p.add_argument("--quantum", type=int, default=8, help="tokens per turn before parking")
    for flag, default in [("--layers", 2), ("--heads", 4), ("--key-dim", 64),
                          ("--value-dim", 64), ("--d-model", 256)]:
        p.add_argument(flag, type=int, default=default, help="the seeded model's shape")
    p.add_argument("--seed", type=int, default=0, help="seed of the seeded model's weights")
    args = p.parse_args(argv)
    for name in args.codecs.split(","):
        if not hasattr(statepool.CodecId, name):
            p.error(f"unknown codec {name!r}; known: "
                    + ", ".join(statepool.CodecId.__members__))
    if args.model not in ("auto", "seeded") and \
            not (pathlib.Path(args.model) / "manifest.json").is_file():
        p.error(f"--model {args.model}: not a model directory (no manifest.json); "
                "eval/models/gdn and eval/models/kda are, or 'seeded'")
    if min(args.requests, args.tokens, args.slots, args.quantum) <= 0:
        p.error("--requests, --tokens, --slots and --quantum must be positive")
    return args


if __name__ == "__main__":
    args = parse_args()
    try:
        with (spawned_daemon(args.spawn_daemon) if args.spawn_daemon
              else contextlib.nullcontext(args.socket)) as args.socket:
            code = main(args)
    except statepool.TransportError as e:
        sys.exit(f"error: cannot talk to statepoold at {args.socket}: {e}\n"
                 "hint: start one (statepoold --socket PATH ...) and pass --socket PATH, or "
                 "let this example start its own: --spawn-daemon build/service/statepoold")
    except statepool.DaemonError as e:
        sys.exit(f"error: statepoold refused: {e!r}")
    except DaemonFailed as e:
        sys.exit(f"error: {e}")
    sys.exit(code)
