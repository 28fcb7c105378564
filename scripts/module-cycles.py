#!/usr/bin/env python3
"""Fails when the modules of any crate import each other in a circle.

A module's edges are the other modules of its crate it names (`crate::a::b`, `super::x`, or a
sibling through `self::`), whatever the item: a circle between two files means neither can be
read, tested or moved without the other. `mod x;` declarations are not edges (a parent owning a
child is the tree, not a dependency). Usage: scripts/module-cycles.py [CRATES_DIR]
"""
import pathlib
import re
import sys

PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+|::\{)")
GROUP = re.compile(r"\b(crate|super|self)::\{([^;]*?)\}", re.S)


def modules(src):
    """Maps each module path (tuple) to its file."""
    found = {}
    for f in src.rglob("*.rs"):
        rel = f.relative_to(src).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] in ("mod", "lib", "main"):
            parts = parts[:-1]
        if parts and parts[0] == "bin":
            continue
        found[tuple(parts)] = f
    return found


def strip(text):
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', text)


def resolve(base, segments, mods):
    """The longest module named by base + segments, if it is one of the crate's."""
    path = list(base)
    for s in segments:
        if s == "super":
            path = path[:-1]
        elif s in ("self", "crate"):
            continue
        else:
            path.append(s)
    while path and tuple(path) not in mods:
        path.pop()
    return tuple(path)


def edges(mod, text, mods):
    out = set()
    for m in GROUP.finditer(text):
        root = {"crate": (), "super": mod[:-1], "self": mod}[m.group(1)]
        for item in re.split(r",", m.group(2)):
            segs = [s for s in re.split(r"::", item.strip().split(" as ")[0]) if s and s != "{"]
            segs = [re.sub(r"[^A-Za-z0-9_].*", "", s) for s in segs]
            out.add(resolve(root, [s for s in segs if s], mods))
    for m in PATH.finditer(text):
        root = {"crate": (), "super": mod[:-1], "self": mod}[m.group(1)]
        segs = [s for s in m.group(2).split("::") if s and s != "{"]
        out.add(resolve(root, segs, mods))
    return {e for e in out if e != mod and e != () or (e == () and mod != ())} - {mod}


def cycles(graph):
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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
                comps.append(comp)

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return comps


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "crates")
    failed = False
    for crate in sorted(p for p in root.iterdir() if (p / "src").is_dir()):
        mods = modules(crate / "src")
        graph = {m: edges(m, strip(f.read_text()), mods) for m, f in mods.items()}
        for comp in cycles(graph):
            failed = True
            names = sorted("::".join(m) or "(root)" for m in comp)
            print(f"{crate.name}: modules in a circle: {', '.join(names)}")
    if failed:
        sys.exit(1)
    print("no module circle in any crate")


main()
