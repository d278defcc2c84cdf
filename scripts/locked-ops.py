#!/usr/bin/env python3
"""Instructions and locked instructions executed, per unit of work, from
callgrind profiles (scripts/count-hop-costs.sh runs it).

    locked-ops.py --per N [--top K] SMALL.out LARGE.out

SMALL.out and LARGE.out are `valgrind --tool=callgrind --dump-instr=yes`
profiles of the same program doing less and more of the work; what LARGE
executed beyond SMALL, divided by N (the units of work LARGE did beyond
SMALL), is one unit's cost, without start-up and shutdown. A locked
instruction is one with the `lock` prefix, or an `xchg` with memory (locked
on x86 without the prefix); each is found in the objects' disassembly
(`objdump -d`), at the addresses callgrind gives (the object's own, for
position-independent objects as for the others).
"""
import argparse
import collections
import re
import subprocess
import sys


def parse_callgrind(path):
    """{(object, function, address): instructions executed}."""
    names = {"ob": {}, "fn": {}, "fl": {}}
    table = {"ob": "ob", "cob": "ob", "fn": "fn", "cfn": "fn"}

    def name(kind, value):
        m = re.match(r"\((\d+)\)\s*(.*)", value)
        if not m:
            return value
        tab = names[table.get(kind, "fl")]
        if m.group(2):
            tab[m.group(1)] = m.group(2)
        return tab.get(m.group(1), "?")

    cost = collections.Counter()
    ob = fn = None
    last = 0
    call_line = False  # the cost line after calls= is the call's, inclusive
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line[0] == "#":
                continue
            head = line.split(" ", 1)[0]
            if "=" in head:
                key, value = line.split("=", 1)
                if key == "ob":
                    ob = name(key, value)
                elif key == "fn":
                    fn = name(key, value)
                elif key in ("cob", "cfn", "fl", "fi", "fe", "cfi", "cfl"):
                    name(key, value)
                elif key == "calls":
                    call_line = True
                continue
            if line[0] not in "0123456789+-*":
                continue
            fields = line.split()
            pos = fields[0]
            if pos.startswith("0x"):
                addr = int(pos, 16)
            elif pos[0] in "+-":
                step = int(pos[1:], 16) if pos[1:].startswith("0x") else int(pos[1:])
                addr = last + step if pos[0] == "+" else last - step
            elif pos == "*":
                addr = last
            else:
                continue
            last = addr
            if call_line:
                call_line = False
                continue
            if len(fields) >= 3:
                cost[(ob, fn, addr)] += int(fields[2])
    return cost


def locked_addresses(path):
    """Addresses of the locked instructions in an object."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path],
                         capture_output=True, text=True, check=False).stdout
    found = set()
    for line in out.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(\S.*)", line)
        if not m:
            continue
        insn = m.group(2)
        if insn.startswith("lock") or (insn.startswith("xchg") and "(" in insn):
            found.add(int(m.group(1), 16))
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per", type=float, required=True)
    ap.add_argument("--top", type=int, default=0,
                    help="list the K functions with the most locked instructions")
    ap.add_argument("small")
    ap.add_argument("large")
    args = ap.parse_args()
    cost = parse_callgrind(args.large)
    for key, n in parse_callgrind(args.small).items():
        cost[key] -= n
    locked = {}
    for obj in {ob for ob, _, _ in cost}:
        if obj and obj.startswith("/"):
            locked[obj] = locked_addresses(obj)
    total = sum(cost.values())
    per_fn = collections.Counter()
    for (ob, fn, addr), n in cost.items():
        if addr in locked.get(ob, ()):
            per_fn[fn] += n
    print(f"instructions {total / args.per:.0f}  locked {sum(per_fn.values()) / args.per:.2f}")
    for fn, n in per_fn.most_common(args.top):
        if abs(n / args.per) >= 0.01:
            print(f"  {n / args.per:6.2f}  {fn}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
