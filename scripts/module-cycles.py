#!/usr/bin/env python3
"""Fails if the crate's top-level modules import each other in a cycle, if one imports a
module of a layer above its own (LAYERS, the pipeline's order), or if files of
one folder do (siblings: `estimate/plan.rs` and `estimate/compare.rs`; a folder's `mod.rs`,
which declares and re-exports its files, is left out).

A module is a file or folder directly under src/ (src/report/ and everything in it is
`report`). An edge A -> B is any `crate::B` path (in `use` or inline) written in A's
files. Submodules of one module may refer to each other freely; `lib.rs` is the root
and is left out. Prints the graph and the cycles, if any; exit 1 on a cycle.

    python3 scripts/module-cycles.py
"""
import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

# The pipeline's layers, lowest first: a module imports modules of its own layer or of
# layers below, never above (docs/architecture.md, "Layers", says what each is). Every
# top-level module is in one.
LAYERS = [
    ("utilities", {"error", "format", "fs", "phase", "events", "ffi", "names"}),
    ("values", {"timeline", "vars", "workload", "stats", "leaks", "oom", "cuda", "optim"}),
    ("sources", {"program", "models"}),
    ("replay", {"replay"}),
    ("analyses", {"estimate", "runs"}),
    ("reports", {"report"}),
    ("driver", {"profiler"}),
    ("command", {"cli"}),
]


def module_of(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".rs")


def code_of(path: Path) -> str:
    """A source file without its comments (comments and doc links do not import)."""
    return "\n".join(line.split("//")[0] for line in path.read_text().splitlines())


def cycles_of(edges: dict) -> list:
    """The import cycles of a graph (node -> set of nodes; edges to nodes outside it are
    left out): its strongly connected components of more than one node (Tarjan's
    algorithm), each sorted."""
    index, low, stack, on, cycles = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in edges:
                continue
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
                cycles.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return cycles


def main() -> int:
    modules = {module_of(p) for p in SRC.rglob("*.rs") if p.name != "lib.rs" or p.parent != SRC}
    modules.discard("lib")
    edges = {m: set() for m in modules}
    pattern = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")
    group = re.compile(r"\buse crate::\{([^;]*)\}", re.S)
    for p in SRC.rglob("*.rs"):
        m = module_of(p)
        if m == "lib":
            continue
        code = code_of(p)
        targets = set(pattern.findall(code))
        for g in group.findall(code):
            targets |= {t.strip().split("::")[0] for t in g.split(",") if t.strip()}
        for t in targets:
            if t in modules and t != m:
                edges[m].add(t)
    cycles = cycles_of(edges)
    for m in sorted(edges):
        print(f"{m} -> {', '.join(sorted(edges[m])) or '(nothing)'}")
    layer = {m: i for i, (_, ms) in enumerate(LAYERS) for m in ms}
    unplaced = sorted(m for m in modules if m not in layer and m != "bin")
    upward = [
        (m, t)
        for m in sorted(edges)
        for t in sorted(edges[m])
        if m in layer and t in layer and layer[t] > layer[m]
    ]
    for m in unplaced:
        print(f"module {m} is in no layer of scripts/module-cycles.py's LAYERS", file=sys.stderr)
    for m, t in upward:
        print(
            f"{m} ({LAYERS[layer[m]][0]}) imports {t}, a layer above it ({LAYERS[layer[t]][0]})",
            file=sys.stderr,
        )
    if unplaced or upward:
        return 1
    print("layers: " + " -> ".join(f"{n} ({', '.join(sorted(ms))})" for n, ms in LAYERS))
    if cycles:
        for c in cycles:
            print("import cycle among: " + ", ".join(c), file=sys.stderr)
        return 1
    print(f"no import cycle among {len(modules)} modules")
    return sibling_cycles()


def file_module(path: Path) -> tuple:
    """`estimate/plan.rs` -> ("estimate", "plan"); `estimate/model/mod.rs` -> ("estimate", "model")."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "mod":
        parts = parts[:-1]
    return tuple(parts)


def sibling_cycles() -> int:
    """Cycles among the files of one folder: an edge A -> B is a `super::B` or a
    `crate::...::B` path in A, B a file beside A (not the folder's mod.rs)."""
    files = [p for p in SRC.rglob("*.rs") if "bin" not in p.relative_to(SRC).parts]
    by_module = {file_module(p): p for p in files}
    edges = {}
    for p in files:
        if p.name in ("mod.rs", "lib.rs"):
            continue
        me = file_module(p)
        code = code_of(p)
        targets = set()
        for m in re.finditer(r"\bsuper::(?:\{([^}]*)\}|([a-z_][a-z0-9_]*))", code):
            for n in (m.group(1).split(",") if m.group(1) else [m.group(2)]):
                n = n.strip().split("::")[0]
                if n:
                    targets.add(me[:-1] + (n,))
        paths = re.findall(r"\bcrate::((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*)", code)
        for g in re.findall(r"\buse crate::\{([^;]*)\}", code, re.S):
            paths += [t.strip() for t in g.split(",") if t.strip()]
        for path in paths:
            segs = path.split("::")
            for k in range(len(segs), 0, -1):
                if tuple(segs[:k]) in by_module:
                    targets.add(tuple(segs[:k]))
                    break
        edges[me] = {
            t
            for t in targets
            if t != me and t[:-1] == me[:-1] and t in by_module and by_module[t].name != "mod.rs"
        }
    cycles = cycles_of(edges)
    for c in cycles:
        names = ", ".join("src/" + str(by_module[m].relative_to(SRC)) for m in c)
        print(f"import cycle among the files: {names}", file=sys.stderr)
    if cycles:
        return 1
    print(f"no import cycle among the files of any folder ({len(edges)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
