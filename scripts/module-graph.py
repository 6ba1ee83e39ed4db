#!/usr/bin/env python3
"""The module import graph of one crate (default: the server), from its `crate::`,
`super::` and `self::` paths, the circles in it and the imports that run upward.

A module that declares or re-exports its children is not counted as importing them, and a
child's use of its ancestors is not counted as a circle with them: only modules neither of
which contains the other can form one (`a.rs` uses `b`, `b.rs` uses `a`).

Upward imports are of two kinds. An import of an item the crate root itself defines
(`crate::AppState` while `lib.rs` holds it) runs up to the top of the crate. And when the
crate root's doc comment lists its layers, from the top, one item per layer (its list may
go on over lines indented under it) after a line that starts with "Layers":

    //! - app: `app`, `testing`
    //! - state: `state`
    //! - domain: `jobs`, `health`,
    //!   `plugins`

an import from a module of a lower layer into one of a higher layer is upward (modules of
one layer may use each other; the circle check still applies). A top-level module that no
layer names is reported, so a new module gets a place.

    scripts/module-graph.py [crate/src] [--top] [--dot]
    scripts/module-graph.py --workspace

`--top` folds modules into the crate's top-level ones (`api`, `jobs`, `health`, ...);
`--dot` prints Graphviz instead of a list. The circles, the upward imports and their counts
go to stderr. Exits 1 when there is a circle, an upward import or a module without a layer.

`--workspace` checks every crate of the repository instead (each folder with a `Cargo.toml`
and a `src/`: the root workspace's members, the dashboard's and the plugins' own
workspaces) for circles only, printing each crate's count and its circles; it exits 1 when
any crate has one.
"""

import os
import re
import sys

PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE = re.compile(r"\buse\s+((?:crate|super|self)::[^;]*);", re.S)


def modules(src):
    """Module path (tuple) -> file, for every .rs file under src (the library's, when it has
    a `lib.rs`: `main.rs` is then a crate of its own that uses the library by name)."""
    found = {}
    has_lib = os.path.exists(os.path.join(src, "lib.rs"))
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(root, f), src)[:-3].split(os.sep)
            if has_lib and rel == ["main"]:
                continue
            if rel[-1] == "mod" or rel == ["lib"] or rel == ["main"]:
                rel = rel[:-1]
            found[tuple(rel)] = os.path.join(root, f)
    return found


def expand_use(tree):
    """`a::{b, c::{d, self}}` -> ["a::b", "a::c::d", "a::c"] (just enough for module paths)."""
    # Renames go before the spaces do: `x as y` must not read as `xasy`.
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+\w+", "", tree))
    m = re.match(r"^(.*?)::\{(.*)\}$", tree)
    if not m:
        return [tree]
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


def paths_of(f):
    """Every `crate::`/`super::`/`self::` path a file names, its `use` trees expanded."""
    text = strip_comments(open(f, encoding="utf-8").read())
    paths = []
    for u in USE.finditer(text):
        paths += expand_use(u.group(1))
    text = USE.sub("", text)
    return paths + [m.group(1) + m.group(2) for m in PATH.finditer(text)]


def root_imports(src):
    """(module, path) for each `crate::X` naming an item of the crate root itself (not a
    module). `super::` paths are left out: a top-level file's `super::` comes from an inline
    module (`mod tests { use super::*; }`), which the graph does not see."""
    known = modules(src)
    found = set()
    for me, f in known.items():
        if not me:
            continue
        for p in paths_of(f):
            if p.startswith("crate::") and resolve(me, p, known) == ():
                found.add((me, p))
    return sorted(found)


def layers(src):
    """Top-level module -> (rank, layer name), ranks counted from the top, as the crate
    root's doc comment lists them; {} when it lists none."""
    root = os.path.join(src, "lib.rs")
    if not os.path.exists(root):
        return {}
    ranks, started, layer = {}, False, None
    for line in open(root, encoding="utf-8"):
        if not line.startswith("//!"):
            continue
        raw = line[3:].rstrip()
        doc = raw.strip()
        if doc.startswith("Layers"):
            started = True
            continue
        if not started:
            continue
        m = re.match(r"^- ([\w-]+): (.*)$", doc)
        if m:
            layer = (len({r for r, _ in ranks.values()}), m.group(1))
            names = m.group(2)
        elif layer and doc and raw.startswith("   "):
            names = doc  # a layer's list, continued
        elif ranks and doc:
            break
        else:
            continue
        for name in re.findall(r"`(\w+)`", names):
            ranks[name] = layer
    return ranks


def upward(edges, ranks):
    """The edges from a lower layer into a higher one, and the top-level modules no layer
    names."""
    up, unranked = [], set()
    for a, tos in edges.items():
        if not a:
            continue
        for b in tos:
            if not b:
                continue
            for m in (a[0], b[0]):
                if m not in ranks:
                    unranked.add(m)
            if a[0] in ranks and b[0] in ranks and ranks[a[0]][0] > ranks[b[0]][0]:
                up.append((a, b))
        if a[0] not in ranks:
            unranked.add(a[0])
    return sorted(up), sorted(unranked)


def graph(src):
    known = modules(src)
    edges = {m: set() for m in known}
    for me, f in known.items():
        for p in paths_of(f):
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


def crate_sources(root):
    """The `src/` folder of every crate under `root`, in path order; build output, installed
    packages and hidden folders are left out."""
    found = []
    for here, dirs, files in os.walk(root):
        dirs[:] = sorted(
            d for d in dirs if not d.startswith(".") and d not in ("target", "node_modules", "src")
        )
        if "Cargo.toml" in files and os.path.isdir(os.path.join(here, "src")):
            found.append(os.path.join(here, "src"))
    return found


def workspace(root):
    """Circles of every crate under `root`; the exit status."""
    total = 0
    for src in crate_sources(root):
        found = circles(graph(src))
        total += len(found)
        print(f"{os.path.relpath(os.path.dirname(src), root)}: {len(found)} circle(s)")
        for c in found:
            print("  circle: " + " <-> ".join(name(m) for m in c))
    print(f"{total} circle(s) in all")
    return 1 if total else 0


def name(m):
    return "::".join(m) or "crate"


def main():
    if "--workspace" in sys.argv:
        sys.exit(workspace(os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))))
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
    to_root = root_imports(src)
    for m, p in to_root:
        print(f"up to the crate root: {name(m)} uses {p}", file=sys.stderr)
    importers = {m[0] for m, _ in to_root} if "--top" in sys.argv else {m for m, _ in to_root}
    print(f"{len(importers)} module(s) import the crate root's own items", file=sys.stderr)
    ranks = layers(src)
    up, unranked = upward(edges, ranks) if ranks else ([], [])
    for a, b in up:
        print(
            f"upward: {name(a)} ({ranks[a[0]][1]}) -> {name(b)} ({ranks[b[0]][1]})",
            file=sys.stderr,
        )
    for m in unranked:
        print(f"no layer: {m}", file=sys.stderr)
    if ranks:
        print(f"{len(up)} upward import(s) across layers", file=sys.stderr)
    else:
        print("no layers declared in the crate root", file=sys.stderr)
    sys.exit(1 if found or up or unranked or (ranks and to_root) else 0)


if __name__ == "__main__":
    main()
