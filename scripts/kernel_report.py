#!/usr/bin/env python3
"""Static evidence for the CUDA kernels, read without a GPU (scripts/kernel-report runs it).

    kernel_report.py --arch 90 --unit NAME SASS PTXAS [--unit ...] [--kernel S ...]
                     [--check] [--json FILE]

Inputs per compilation unit: the `nvdisasm --print-line-info-inline` listing of its cubin
and the `ptxas -v` log of the same compile. For every kernel it prints:
- registers, spill stores/loads, stack frame, static shared memory (ptxas -v);
- theoretical occupancy at the planning shape (a Qwen3-Next layer: K = V = 128), from the
  registers, the block size and the shared memory (static + the dynamic bytes the launcher
  asks for at that shape), with the limiter;
- global load and store instructions by width (U8/S8, U16/S16, 32, 64, 128 bits);
- binary64 instructions and 64-bit integer division calls (__cuda_sm20_div/rem_[us]64);
- every loop (backward branch): body instructions, global accesses by width, its source
  line and, where the source marks it, what it is (below) and its instructions per value.

Hot loops are marked in the source, before the `for` (only STATEPOOL_UNROLL lines between):
    // kernel-report: PATH VALUES[/ACCESSES] [xN] [io|fallback]
PATH names the work (e.g. "float-encode", "dual-codes"); VALUES is the values one trip of
the loop as written handles; "io" marks a loop that moves page or staged bytes on the
paths every planned shape takes, "fallback" one that does so only for shapes no planned
model has (unaligned buffers, rows of odd sizes: listed, never a --check problem). The
marker of a loop is looked up along its branch's inlining chain (innermost first). When
the compiler unrolls a marked loop, the body holds several trips: "xN" says the source
asks for N (STATEPOOL_UNROLL_BY(N)); otherwise the report counts the trips as the body's
global accesses over ACCESSES, the global accesses one trip makes in the source (e.g.
"4/1"), or assumes one trip when neither is given.

Roofline: per codec operation (OPERATIONS: the paths it runs and the bytes per value it
moves), the instructions per value against the ideal issue rate and the bytes against
the DRAM bandwidth, for each card of CARDS; the expected speed relative to a
device-to-device copy of the f32 staged state. Static counts: a marked loop's body is one
trip; code for other codecs in the same body counts too, so the estimate errs high.

--check fails (exit 1) on any spill, binary64 instruction or 64-bit division in any
kernel, and on a byte-wide global access in a loop marked "io".
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import subprocess
import sys

F64 = re.compile(r"\b(DADD|DMUL|DFMA|DSETP|DMNMX|MUFU\.RCP64H|MUFU\.RSQ64H)\b|\bF2F\.F64|\bF2F\.F32\.F64")
DIV64 = re.compile(r"__cuda_sm\d+_(div|rem)_[us]64")
GLOBAL = re.compile(r"\b(LDG|STG|LD|ST|RED|ATOMG|ATOM)\.E(\.[A-Z0-9]+)*")
LOC = re.compile(r'"([^"]+)", line (\d+)')
MARK = re.compile(r"//\s*kernel-report:\s*(\S+)\s+(\d+)(?:/(\d+))?(?:\s+x(\d+))?(?:\s+(io|fallback))?")
UNROLL_LINE = re.compile(r"^\s*STATEPOOL_UNROLL")

# The planning shape: one Qwen3-Next / Kimi-Linear head (K = V = 128).
K = V = 128

# Per kernel (substring of its short title): threads per block, dynamic shared memory
# the launcher asks for at K = V = 128 (codec_kernels.cu, step_kernels.cu, kv_kernels.cu).
LAUNCH = [
    ("kv_", 256, 0),
    # KDA (CodecFamily 4, stepquant_rows) adds 8 floats per row to the encode's scratch.
    ("encode_kernel<StagedF32, stepquant_rows>", 256, (32 * 33 + 4 * K + V + 8 * K) * 4),
    ("encode_kernel<StagedBf16, stepquant_rows>", 256, (32 * 33 + 4 * K + V + 8 * K) * 4),
    ("encode_kernel", 256, (32 * 33 + 4 * K + V) * 4),
    ("decode_kernel", 256, (K + V) * 4),
    ("step_kernel<stepquant_rows>", 128, (K * V + 32 * 33 + 4 * K + V + 8 * K) * 4),
    ("step_kernel", 128, (K * V + 32 * 33 + 4 * K + V) * 4),
    ("", 256, 0),
]

# Per SM of each architecture: warps, blocks, registers, shared memory (usable per SM,
# per block with opt-in, reserved per block).
SM = {
    80: dict(warps=64, blocks=32, regs=65536, smem=164 * 1024, smem_block=163 * 1024, reserved=1024),
    90: dict(warps=64, blocks=32, regs=65536, smem=228 * 1024, smem_block=227 * 1024, reserved=1024),
}

# Cards the estimate is for: SMs, boost clock, DRAM bandwidth (vendor figures).
CARDS = {
    90: [("H100 SXM", 132, 1.98e9, 3.35e12), ("H200", 132, 1.98e9, 4.8e12)],
    80: [("A100 80GB SXM", 108, 1.41e9, 2.04e12)],
}

# What one codec operation is made of: its marked paths (with the times each runs per
# value) and the bytes per value it moves through DRAM at the planning shape (read,
# written): codes at their width, plus 2-byte scales per row and column (GDN, K = V =
# 128), per 32-value group (int), nothing else (float); then the bytes per value of the
# device copy it is compared with: the f32 staged state (8: read and written) for the
# recurrent-state codecs and the step (an FP32 step moves the state once each way, so
# there the column is the speed-up over it), the bf16 plain side (4) for KV streams.
# A KV stream's residual window (its newest 128 tokens, fp16) is left out: at 4096 tokens
# it is 3% of the values.
OPERATIONS = [
    # (operation, the kernel it runs in, its paths with the times each runs per value,
    #  bytes read and written per value, bytes per value of the copy)
    ("bf16 encode", "encode_kernel<StagedF32, floats>", {"float-encode": 1}, 4.0, 2.0, 8.0),
    ("bf16 decode", "decode_kernel<StagedF32, floats>", {"float-decode": 1}, 2.0, 4.0, 8.0),
    ("int8 encode", "encode_kernel<StagedF32, uniform>", {"uniform-encode": 1}, 4.0,
     1.0 + 2 / 32, 8.0),
    ("int8 decode", "decode_kernel<StagedF32, uniform>", {"uniform-decode": 1}, 1.0 + 2 / 32, 4.0,
     8.0),
    ("stepquant6 encode", "encode_kernel<StagedF32, stepquant>",
     {"dual-rows": 1, "dual-columns": 1, "dual-refit": 1, "dual-codes": 1}, 4.0, 0.75 + 4 / 128,
     8.0),
    ("stepquant6 enc KDA", "encode_kernel<StagedF32, stepquant_rows>",
     {"dual-rows": 1, "dual-columns": 1, "dual-refit": 1, "kda-codes": 1}, 4.0, 0.75 + 4 / 128,
     8.0),
    ("dsq6 encode", "encode_kernel<StagedF32, stepquant>",
     {"dual-rows": 1, "dual-columns": 1, "dual-codes": 1}, 4.0, 0.75 + 4 / 128, 8.0),
    ("stepquant6 decode", "decode_kernel<StagedF32, stepquant>", {"dual-decode": 1},
     0.75 + 4 / 128, 4.0, 8.0),
    ("stepquant6 dec KDA", "decode_kernel<StagedF32, stepquant_rows>", {"kda-decode": 1},
     0.75 + 4 / 128, 4.0, 8.0),
    ("stepquant6 step", "step_kernel<stepquant>",
     {"dual-decode": 1, "step": 1, "dual-rows": 1, "dual-columns": 1, "dual-refit": 1,
      "dual-codes": 1}, 0.75 + 4 / 128, 0.75 + 4 / 128, 8.0),
    # A light step (StepMode::light, docs/codecs.md "Step modes") is the same kernel with the
    # no_refit page format: the full step's paths without the refit.
    ("stepquant6 light step", "step_kernel<stepquant>",
     {"dual-decode": 1, "step": 1, "dual-rows": 1, "dual-columns": 1, "dual-codes": 1},
     0.75 + 4 / 128, 0.75 + 4 / 128, 8.0),
    # A 4-bit GDN head is coarse: two refit rounds (fit_math.hpp's refit_rounds).
    ("stepquant4 step", "step_kernel<stepquant>",
     {"dual-decode": 1, "step": 1, "dual-rows": 1, "dual-columns": 1, "dual-refit": 2,
      "dual-codes": 1}, 0.5 + 4 / 128, 0.5 + 4 / 128, 8.0),
    ("non-finite scan", "find_non_finite_kernel<StagedF32>", {"nonfinite-scan": 1}, 4.0, 0.0, 8.0),
    ("kivi4 KV encode", "kv_encode_kernel<LoadBf16, unsigned short>", {"kivi-encode": 1}, 2.0,
     20 / 32, 4.0),
    ("kivi4 KV decode", "kv_decode_kernel<StoreBf16, unsigned short>", {"kivi-decode": 1},
     20 / 32, 2.0, 4.0),
    ("kivi2 KV encode", "kv_encode_kernel<LoadBf16, unsigned short>", {"kivi-encode": 1}, 2.0,
     12 / 32, 4.0),
    ("kivi2 KV decode", "kv_decode_kernel<StoreBf16, unsigned short>", {"kivi-decode": 1},
     12 / 32, 2.0, 4.0),
]


def short(path: str) -> str:
    for root in ("/kernels/", "/include/"):
        if root in path:
            return path[path.rindex(root) + 1:]
    return path.rsplit("/", 1)[-1]


class Source:
    """Source lines by file, read once; the marker on the line before a loop."""

    def __init__(self) -> None:
        self.files: dict[str, list[str]] = {}

    def mark(self, path: str, line: int):
        if path not in self.files:
            try:
                with open(path) as f:
                    self.files[path] = f.read().split("\n")
            except OSError:
                self.files[path] = []
        lines = self.files[path]
        before = line - 2  # index of the line before the loop's
        while 0 <= before < len(lines) and UNROLL_LINE.match(lines[before]):
            before -= 1
        if 0 <= before < len(lines):
            m = MARK.search(lines[before])
            if m:
                return (m.group(1), int(m.group(2)), int(m.group(3) or 0), int(m.group(4) or 0),
                        m.group(5) or "")
        return None


def kernels(text: str):
    """(mangled name, [(instruction, [(file, line) innermost first])], labels)."""
    for part in re.split(r"\n\.text\.", text)[1:]:
        name = part.split(":", 1)[0]
        instructions, labels = [], {}
        chain: list[tuple[str, int]] = []
        group: list[str] = []
        previous_was_location = False
        for line in part.split("\n"):
            s = line.strip()
            if s.startswith("//## File"):
                if not previous_was_location:
                    group = []
                group.append(s)
                previous_was_location = True
                continue
            previous_was_location = False
            m = re.match(r"(\.L_x_\d+):", s)
            if m:
                labels[m.group(1)] = len(instructions)
                continue
            m = re.search(r"/\*[0-9a-f]+\*/\s+(.*?)\s*;", line)
            if m:
                if group:
                    chain = [(f, int(n)) for f, n in LOC.findall(group[0])]
                    group = []
                instructions.append((m.group(1), chain))
        yield name, instructions, labels


def ptxas_properties(log: str) -> dict[str, dict]:
    """Per mangled name: registers, stack, spill stores/loads, static shared memory."""
    out: dict[str, dict] = {}
    current = None
    for line in log.split("\n"):
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            current = out.setdefault(m.group(1), {})
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and current is not None:
            current.update(stack=int(m.group(1)), spill_stores=int(m.group(2)),
                           spill_loads=int(m.group(3)))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and current is not None:
            current["registers"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            current["smem"] = int(s.group(1)) if s else 0
    return out


def width(instruction: str) -> str:
    """The access width of a global load/store: 8, 16, 32, 64 or 128 (bits)."""
    m = GLOBAL.search(instruction)
    suffixes = m.group(0).split(".")[2:] if m else []
    for s in suffixes:
        if s in ("U8", "S8"):
            return "8"
        if s in ("U16", "S16"):
            return "16"
        if s in ("64", "128"):
            return s
    return "32"


def is_global(instruction: str) -> bool:
    """A global access: LDG/STG, atomics and reductions on global memory, and generic
    LD/ST (a pointer the compiler cannot prove global; the staged state and pages are)."""
    op = instruction.split()[1] if instruction.startswith("@") else instruction.split()[0]
    return op.startswith(("LDG.", "STG.", "RED.", "ATOMG.", "LD.", "ST.", "ATOM."))


def is_load(instruction: str) -> bool:
    op = instruction.split()[1] if instruction.startswith("@") else instruction.split()[0]
    return op.startswith(("LDG.", "LD."))


def launch_of(title: str):
    for key, threads, dynamic in LAUNCH:
        if key in title:
            return threads, dynamic
    raise AssertionError("unreachable")


def occupancy(arch: int, registers: int, threads: int, smem: int):
    """(resident warps per SM, fraction of the SM, limiter)."""
    sm = SM[arch]
    warps = math.ceil(threads / 32)
    regs_per_warp = math.ceil(max(registers, 1) * 32 / 256) * 256
    limits = {
        "warps": sm["warps"] // warps,
        "blocks": sm["blocks"],
        "registers": sm["regs"] // (regs_per_warp * warps),
        "shared memory": sm["smem"] // (smem + sm["reserved"]) if smem else sm["blocks"],
    }
    if smem > sm["smem_block"]:
        return 0, 0.0, "shared memory (does not fit)"
    limiter = min(limits, key=lambda k: limits[k])
    resident = limits[limiter] * warps
    return resident, resident / sm["warps"], limiter


def demangle(names: list[str]) -> dict[str, str]:
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                             check=True).stdout.split("\n")
        return dict(zip(names, out))
    except (OSError, subprocess.CalledProcessError):
        return {n: n for n in names}


def short_name(demangled: str) -> str:
    """statepool::kernels::cuda::(anonymous)::encode_kernel<StagedF32>(...) -> encode_kernel<StagedF32>."""
    families = {"1": "floats", "2": "uniform", "3": "stepquant", "4": "stepquant_rows"}  # CodecFamily
    name = re.sub(r"\((?:statepool::kernels::cuda::)?CodecFamily\)(\d)",
                  lambda m: families.get(m.group(1), m.group(1)), demangled)
    name = re.sub(r"\(anonymous namespace\)::", "", name)
    name = re.sub(r"statepool::kernels::cuda::|statepool::kernels::", "", name)
    name = re.sub(r"^void ", "", name)
    return name.split("(", 1)[0]


def analyse(title: str, name: str, instructions, labels, props: dict, arch: int,
            source: Source) -> dict:
    threads, dynamic = launch_of(title)
    smem = props.get("smem", 0) + dynamic
    warps, fraction, limiter = occupancy(arch, props.get("registers", 0), threads, smem)
    widths = collections.Counter(width(t) + ("L" if is_load(t) else "S") for t, _ in instructions
                                 if is_global(t))
    f64 = [(t, c) for t, c in instructions if F64.search(t)]
    div64 = [(t, c) for t, c in instructions if DIV64.search(t)]
    loops = []
    for i, (t, chain) in enumerate(instructions):
        m = re.search(r"\bBRA\b.*?(\.L_x_\d+)", t)
        if not m or m.group(1) not in labels or labels[m.group(1)] > i:
            continue
        body = instructions[labels[m.group(1)]:i + 1]
        accesses = collections.Counter(width(tt) + ("L" if is_load(tt) else "S")
                                       for tt, _ in body if is_global(tt))
        mark = None
        where = None
        for f, n in chain:
            mark = source.mark(f, n)
            if mark:
                where = f"{short(f)}:{n}"
                break
        if where is None and chain:
            where = f"{short(chain[0][0])}:{chain[0][1]}"
        loop = dict(instructions=len(body), accesses=dict(accesses), where=where or "?")
        if mark:
            path, values, per_trip, unroll, kind = mark
            trips = 1
            if unroll:
                trips = unroll
            elif per_trip:
                trips = max(1, round(sum(accesses.values()) / per_trip))
            loop.update(path=path, io=kind == "io", fallback=kind == "fallback",
                        values=values * trips, per_value=len(body) / (values * trips))
        loops.append(loop)
    return dict(name=name, threads=threads, smem=smem, registers=props.get("registers"),
                stack=props.get("stack", 0), spill_stores=props.get("spill_stores", 0),
                spill_loads=props.get("spill_loads", 0), warps=warps, occupancy=fraction,
                limiter=limiter, widths=dict(widths), binary64=len(f64), div64=len(div64),
                div64_sites=sorted({f"{short(c[0][0])}:{c[0][1]}" for _, c in div64 if c}),
                loops=loops)


def roofline(kernels_: list[dict], arch: int):
    """Instructions per value of every marked path in each kernel (the costliest compiled
    copy of each marked loop, summed over the path's loops: the step's two update passes
    are one path), and per operation of
    OPERATIONS, from its kernel's paths, the estimate for each card: ideal issue (one
    instruction per scheduler per clock) against the DRAM bandwidth, and the speed
    relative to a device copy (OPERATIONS: the f32 state, 8 bytes per value moved, or the
    bf16 side of a KV stream, 4). For the step, that copy is what an FP32 step moves, so
    the column is the speed-up over it."""
    paths: dict[str, dict[str, float]] = {}  # kernel title -> path -> instr/value
    for k in kernels_:
        per_loop: dict[tuple[str, str], float] = {}
        for loop in k["loops"]:
            if "path" in loop:
                key = (loop["path"], loop["where"])
                per_loop[key] = max(per_loop.get(key, 0.0), loop["per_value"])
        mine = paths.setdefault(k["title"], collections.defaultdict(float))
        for (path, _), ipv in per_loop.items():
            mine[path] += ipv
    estimates = []
    for name, kernel, parts, read, written, copy in OPERATIONS:
        found = paths.get(kernel, {})
        if any(p not in found for p in parts):
            continue
        ipv = sum(found[p] * n for p, n in parts.items())
        for card, sms, clock, bandwidth in CARDS[arch]:
            compute = ipv / (sms * 4 * clock * 32)
            memory = (read + written) / bandwidth
            estimates.append(dict(operation=name, card=card, per_value=ipv, bytes=read + written,
                                  limiter="issue" if compute > memory else "memory",
                                  of_copy=(copy / bandwidth) / max(compute, memory)))
    return {k: dict(v) for k, v in paths.items()}, estimates


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", type=int, default=90, choices=sorted(SM))
    p.add_argument("--unit", nargs=3, action="append", metavar=("NAME", "SASS", "PTXAS"),
                   required=True, help="a compilation unit: its name, SASS listing and ptxas -v log")
    p.add_argument("--kernel", action="append", default=[],
                   help="report only kernels whose mangled name contains this (repeatable)")
    p.add_argument("--check", action="store_true",
                   help="exit 1 on a spill, binary64, 64-bit division or byte-wide page I/O")
    p.add_argument("--json", help="also write the findings as JSON")
    args = p.parse_args()

    source = Source()
    found = []
    for unit, sass, log in args.unit:
        with open(sass) as f:
            text = f.read()
        with open(log) as f:
            props = ptxas_properties(f.read())
        for name, instructions, labels in kernels(text):
            if args.kernel and not any(s in name for s in args.kernel):
                continue
            found.append((unit, name, instructions, labels, props.get(name, {})))
    if not found:
        print("kernel_report.py: no kernel matches", file=sys.stderr)
        return 1
    names = demangle([name for _, name, _, _, _ in found])
    found = [dict(analyse(short_name(names[name]), name, instructions, labels, kprops, args.arch,
                          source), unit=unit, title=short_name(names[name]))
             for unit, name, instructions, labels, kprops in found]
    problems = []
    for k in found:
        title = k["title"]
        print(f"== {k['unit']}: {title}")
        print(f"   {k['registers']} registers, spills {k['spill_stores']}/{k['spill_loads']} B "
              f"(stores/loads), stack {k['stack']} B, shared {k['smem']} B at K=V={K}, "
              f"{k['threads']} threads/block")
        print(f"   occupancy sm_{args.arch}: {k['warps']} warps/SM ({k['occupancy']:.0%}), "
              f"limited by {k['limiter']}")
        w = k["widths"]
        print("   global access widths: " + ", ".join(
            f"{kind} {bits}-bit x{w[bits + kind[0].upper()]}" for kind in ("loads", "stores")
            for bits in ("8", "16", "32", "64", "128") if w.get(bits + kind[0].upper())))
        print(f"   binary64: {k['binary64']}, 64-bit division calls: {k['div64']}"
              + (f" ({', '.join(k['div64_sites'])})" if k["div64_sites"] else ""))
        for loop in sorted(k["loops"], key=lambda l: -l["instructions"]):
            if loop["instructions"] < 8 and "path" not in loop:
                continue
            acc = " ".join(f"{a}x{n}" for a, n in sorted(loop["accesses"].items()))
            tag = ""
            if "path" in loop:
                kind = " io" if loop["io"] else " fallback" if loop["fallback"] else ""
                tag = f"  [{loop['path']}{kind}: {loop['per_value']:.1f} instr/value]"
            print(f"   loop {loop['instructions']:5d} instr  {acc:28s} {loop['where']}{tag}")
            if loop.get("io") and any(a in loop["accesses"] for a in ("8L", "8S")):
                problem = f"{title}: byte-wide global access in the io loop at {loop['where']}"
                if problem not in problems:
                    problems.append(problem)
        if k["spill_stores"] or k["spill_loads"]:
            problems.append(f"{title}: spills {k['spill_stores']}/{k['spill_loads']} bytes")
        if k["binary64"]:
            problems.append(f"{title}: {k['binary64']} binary64 instructions")
        if k["div64"]:
            problems.append(f"{title}: {k['div64']} 64-bit division calls")
    paths, estimates = roofline(found, args.arch)
    if paths:
        print("== instructions per value of the marked paths per kernel (static count of one trip)")
        for kernel, mine in paths.items():
            if mine:
                print(f"   {kernel}: " + ", ".join(f"{p} {v:.1f}" for p, v in sorted(mine.items())))
    if estimates:
        print(f"== roofline (f32 staged state, K=V={K}, ideal issue)")
        print(f"   {'operation':21s} {'card':14s} {'instr/value':>11s} {'bytes/value':>11s} "
              f"{'limiter':>8s} {'x copy':>7s}")
        for e in estimates:
            print(f"   {e['operation']:21s} {e['card']:14s} {e['per_value']:11.1f} "
                  f"{e['bytes']:11.2f} {e['limiter']:>8s} {e['of_copy']:7.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(arch=args.arch, kernels=found, paths=paths, roofline=estimates,
                           problems=problems), f, indent=1)
    if problems:
        print(f"== {len(problems)} problem(s)")
        for p_ in problems:
            print(f"   {p_}")
    return 1 if (args.check and problems) else 0


if __name__ == "__main__":
    sys.exit(main())
