#!/usr/bin/env python3
"""What the SASS of a CUDA kernel does, from `nvdisasm --print-line-info-inline` output.

    sass_report.py FILE.sass [--kernel SUBSTRING ...]

For every kernel (every `.text.<mangled name>` section; --kernel keeps those whose name
contains one of the substrings) it prints:
- binary64 instructions (DADD, DMUL, DFMA, DSETP, DMNMX, F2F with an F64 side,
  MUFU.RCP64H, MUFU.RSQ64H), with the source line each comes from;
- division and square-root sites: MUFU.RCP / MUFU.RSQ / MUFU.SQRT and CALLs (an IEEE
  division or a 64-bit integer division calls a slow path), each with the innermost
  source line and the line it is inlined at;
- loops: every backward branch, its body's instruction count, global loads and stores,
  and the lines of the block bodies (cuda/block_*.hpp) most of its instructions come from.
Source lines are those of the inlining chain nvdisasm prints before each instruction.
Static counts: a loop body is what one trip executes, unrolled copies included.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys

F64 = re.compile(r"\b(DADD|DMUL|DFMA|DSETP|DMNMX|MUFU\.RCP64H|MUFU\.RSQ64H)\b|\bF2F\.F64|\bF2F\.F32\.F64")
DIV = re.compile(r"\bMUFU\.(RCP|RSQ|SQRT)\b|\bCALL\b")
GLOBAL_LOAD = re.compile(r"\b(LDG|LD)\.")
GLOBAL_STORE = re.compile(r"\b(STG|ST)\.")
LOC = re.compile(r'"([^"]+)", line (\d+)')


def short(path: str) -> str:
    for root in ("/kernels/", "/include/"):
        if root in path:
            return path[path.rindex(root) + 1:]
    return path.rsplit("/", 1)[-1]


def kernels(text: str):
    """(mangled name, list of (instruction, [source locations innermost first]))."""
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
                    # "File A, line a inlined at File B, line b": innermost first.
                    chain = [(short(f), int(n)) for f, n in LOC.findall(group[0])]
                    group = []
                instructions.append((m.group(1), chain))
        yield name, instructions, labels


def where(chain) -> str:
    if not chain:
        return "?"
    inner = f"{chain[0][0]}:{chain[0][1]}"
    return inner if len(chain) == 1 else f"{inner} (in {chain[1][0]}:{chain[1][1]})"


def report(name: str, instructions, labels) -> None:
    print(f"== {name}: {len(instructions)} instructions")
    f64 = collections.Counter(where(c) for t, c in instructions if F64.search(t))
    print(f"binary64 instructions: {sum(f64.values())}")
    for site, n in sorted(f64.items()):
        print(f"  {n:4d}  {site}")
    div = collections.Counter((t.split()[1] if t.startswith("@") else t.split()[0], where(c))
                              for t, c in instructions if DIV.search(t))
    print(f"division and square-root sites (MUFU.RCP/RSQ/SQRT, CALL): {sum(div.values())}")
    for (op, site), n in sorted(div.items(), key=lambda kv: kv[0][1]):
        print(f"  {n:4d}  {op:15s} {site}")
    print("loops (backward branches): body instructions, global loads/stores, main source lines")
    for i, (t, _) in enumerate(instructions):
        m = re.search(r"\bBRA\b.*?(\.L_x_\d+)", t)
        if not m or m.group(1) not in labels or labels[m.group(1)] > i:
            continue
        body = instructions[labels[m.group(1)]:i + 1]
        lines = collections.Counter()
        for _, c in body:
            # The innermost line of a block body (cuda/block_*.hpp: where the loops are).
            block = [f"{f.rsplit('/', 1)[-1]}:{n}" for f, n in c if "/block_" in f]
            lines[block[0] if block else where(c)] += 1
        loads = sum(1 for tt, _ in body if GLOBAL_LOAD.search(tt))
        stores = sum(1 for tt, _ in body if GLOBAL_STORE.search(tt))
        top = ", ".join(f"{k} x{v}" for k, v in lines.most_common(3))
        print(f"  {len(body):5d} instr, {loads:3d} loads, {stores:3d} stores  {top}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sass", help="nvdisasm --print-line-info-inline output")
    p.add_argument("--kernel", action="append", default=[],
                   help="report only kernels whose mangled name contains this (repeatable)")
    args = p.parse_args()
    with open(args.sass) as f:
        text = f.read()
    found = 0
    for name, instructions, labels in kernels(text):
        if args.kernel and not any(k in name for k in args.kernel):
            continue
        found += 1
        report(name, instructions, labels)
    if found == 0:
        print(f"sass_report.py: no kernel in {args.sass} matches", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
