#!/usr/bin/env python3
"""Compares `heddle-agent bench nccl` tables with nccl-tests' for scripts/device/bench.sh:
per size from 256 MiB, ours over theirs for busbw (out-of-place and in-place), and the wall
times. Usage: bench_compare.py DIR OP...; DIR holds nccl-tests-OP.txt, heddle-OP.txt,
heddle-2proc-OP.rank0.txt and wall.txt."""

import os
import sys

MIN_SIZE = 256 << 20


def table(path):
    """{size: (count, busbw out-of-place, busbw in-place or None)} of a nccl-tests table."""
    rows = {}
    if not os.path.exists(path):
        return rows
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        f = line.split()
        if len(f) < 9 or not f[0].isdigit():
            continue
        try:
            oop = float(f[7])
            ip = float(f[11]) if len(f) >= 13 and f[11] != "N/A" else None
        except ValueError:
            continue
        rows[int(f[0])] = (int(f[1]), oop, ip)
    return rows


def ratio(a, b):
    return f"{a / b:6.3f}" if a is not None and b else "   n/a"


def main():
    d, ops = sys.argv[1], sys.argv[2:]
    walls = {}
    for line in open(os.path.join(d, "wall.txt")):
        tool, op, form, secs = line.split()
        walls[(tool, op, form)] = float(secs)
    print("heddle-agent bench nccl against nccl-tests 2.19.6 (-b 8 -e 8G -f 2 -w 5 -n 20), busbw ratio ours/theirs")
    print(f"{'op':15} {'size':>12} {'theirs oop':>10} {'-g2 oop':>8} {'-g2 ip':>8} {'2proc oop':>9} {'2proc ip':>8}  counts")
    worst = None
    for op in ops:
        theirs = table(os.path.join(d, f"nccl-tests-{op}.txt"))
        ours = table(os.path.join(d, f"heddle-{op}.txt"))
        two = table(os.path.join(d, f"heddle-2proc-{op}.rank0.txt"))
        for size in sorted(s for s in theirs if s >= MIN_SIZE):
            tc, to, ti = theirs[size]
            oc, oo, oi = ours.get(size, (None, None, None))
            _, po, pi = two.get(size, (None, None, None))
            for r in (oo, oi, po, pi):
                if r is not None and to:
                    q = r / to
                    worst = q if worst is None else min(worst, q)
            same = "same" if oc == tc else f"ours {oc} theirs {tc}"
            print(f"{op:15} {size:12d} {to:10.2f} {ratio(oo, to):>8} {ratio(oi, ti):>8} {ratio(po, to):>9} {ratio(pi, ti):>8}  {same}")
        sizes_t, sizes_o = set(theirs), set(ours)
        if sizes_t != sizes_o:
            print(f"{op:15} row sets differ: only nccl-tests {sorted(sizes_t - sizes_o)[:6]}, only ours {sorted(sizes_o - sizes_t)[:6]}")
    print()
    print(f"{'wall time (s)':15} {'nccl-tests -g2':>14} {'heddle -g2':>10} {'heddle 2proc':>12}")
    for op in ops:
        w = lambda k: f"{walls[k]:.1f}" if k in walls else "-"  # noqa: E731
        print(f"{op:15} {w(('nccl-tests', op, '-g2')):>14} {w(('heddle', op, '-g2')):>10} {w(('heddle', op, '2proc')):>12}")
    if worst is not None:
        print(f"\nlowest ratio from 256 MiB: {worst:.3f}")


if __name__ == "__main__":
    main()
