#!/usr/bin/env python3
"""Fails if the crate's top-level modules import each other in a cycle.

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


def module_of(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".rs")


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
        text = p.read_text()
        # Comments and doc links do not import.
        code = "\n".join(line.split("//")[0] for line in text.splitlines())
        targets = set(pattern.findall(code))
        for g in group.findall(code):
            targets |= {t.strip().split("::")[0] for t in g.split(",") if t.strip()}
        for t in targets:
            if t in modules and t != m:
                edges[m].add(t)
    # Tarjan's strongly connected components.
    index, low, stack, on, sccs = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
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
            sccs.append(sorted(comp))

    for v in sorted(modules):
        if v not in index:
            visit(v)
    for m in sorted(edges):
        print(f"{m} -> {', '.join(sorted(edges[m])) or '(nothing)'}")
    cycles = [c for c in sccs if len(c) > 1]
    if cycles:
        for c in cycles:
            print("import cycle among: " + ", ".join(c), file=sys.stderr)
        return 1
    print(f"no import cycle among {len(modules)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
