#!/usr/bin/env python3
"""The module import graph of one crate (default: the server), from its `crate::`,
`super::` and `self::` paths, and the circles in it.

A module that declares or re-exports its children is not counted as importing them, and a
child's use of its ancestors is not counted as a circle with them: only modules neither of
which contains the other can form one (`a.rs` uses `b`, `b.rs` uses `a`).

    scripts/module-graph.py [crate/src] [--top] [--dot]

`--top` folds modules into the crate's top-level ones (`api`, `jobs`, `health`, ...);
`--dot` prints Graphviz instead of a list. Exits 1 when there is a circle.
"""

import os
import re
import sys

PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE = re.compile(r"\buse\s+((?:crate|super|self)::[^;]*);", re.S)


def modules(src):
    """Module path (tuple) -> file, for every .rs file under src."""
    found = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(root, f), src)[:-3].split(os.sep)
            if rel[-1] == "mod" or rel == ["lib"] or rel == ["main"]:
                rel = rel[:-1]
            found[tuple(rel)] = os.path.join(root, f)
    return found


def expand_use(tree):
    """`a::{b, c::{d, self}}` -> ["a::b", "a::c::d", "a::c"] (just enough for module paths)."""
    tree = re.sub(r"\s+", "", tree)
    m = re.match(r"^(.*?)::\{(.*)\}$", tree)
    if not m:
        return [re.sub(r"as\w+$", "", tree)]
    prefix, inner = m.groups()
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    out = []
    for p in filter(None, parts):
        for e in expand_use(p):
            out.append(prefix if e == "self" else f"{prefix}::{e}")
    return out


def resolve(me, path, known):
    """The module a `crate::`/`super::`/`self::` path names (its longest known prefix)."""
    segs = path.split("::")
    if segs[0] == "crate":
        base, segs = (), segs[1:]
    else:
        base = me
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
    best = base
    for i in range(1, len(segs) + 1):
        if base + tuple(segs[:i]) in known:
            best = base + tuple(segs[:i])
    return best


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//")[0] for line in text.splitlines())


def graph(src):
    known = modules(src)
    edges = {m: set() for m in known}
    for me, f in known.items():
        text = strip_comments(open(f, encoding="utf-8").read())
        paths = []
        for u in USE.finditer(text):
            paths += expand_use(u.group(1))
        text = USE.sub("", text)
        paths += [m.group(1) + m.group(2) for m in PATH.finditer(text)]
        for p in paths:
            to = resolve(me, p, known)
            if to and to != me and to[: len(me)] != me and me[: len(to)] != to:
                edges[me].add(to)
    return edges


def fold(edges):
    top = {}
    for a, tos in edges.items():
        if not a:
            continue
        for b in tos:
            if b and a[0] != b[0]:
                top.setdefault((a[0],), set()).add((b[0],))
        top.setdefault((a[0],), set())
    return top


def circles(edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def name(m):
    return "::".join(m) or "crate"


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    src = args[0] if args else os.path.join(os.path.dirname(__file__), "..", "server", "src")
    edges = graph(src)
    if "--top" in sys.argv:
        edges = fold(edges)
    if "--dot" in sys.argv:
        print("digraph modules {")
        for a in sorted(edges):
            for b in sorted(edges[a]):
                print(f'  "{name(a)}" -> "{name(b)}";')
        print("}")
    else:
        for a in sorted(edges):
            if edges[a]:
                print(f"{name(a)} -> {', '.join(name(b) for b in sorted(edges[a]))}")
    found = circles(edges)
    for c in found:
        print("circle: " + " <-> ".join(name(m) for m in c), file=sys.stderr)
    print(f"{len(found)} circle(s)", file=sys.stderr)
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
