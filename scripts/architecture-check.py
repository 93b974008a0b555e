#!/usr/bin/env python3
"""Fails when docs/architecture.md and the tree disagree.

- Every source file under src/ (Rust, C++ and its headers, the report page's script and
  style) must be named in docs/architecture.md by its path below src/, in backquotes
  (`replay/device.rs`, `native/dryrun/trace.cpp`).
- Every such path the document names must exist.
- A Rust module with submodules is a folder with its `mod.rs` (`estimate/model/mod.rs`),
  never a file beside a folder of the same name (`estimate/model.rs` and
  `estimate/model/`): one layout convention.
- A native record (a `#[repr(C)]` struct, the Rust mirror of memprof.h's `MpX`) is
  defined in src/ffi/ only, named `MpX` as in C, visible in src/ffi/ only (`pub(super)`
  or private), and named nowhere outside src/ffi/: the rest of the crate reads the typed
  values src/ffi/ decodes it into. Nor does any file outside src/ffi/ read the contract's
  constants (`native::`) or take the event model from ffi (it is `crate::events`).
- Methods at home: an inherent `impl T` sits in the module that defines `T` (its file,
  or the folder of a `mod.rs` that defines it: `estimate/model/fit.rs` may add methods
  to the `Model` of `estimate/model/mod.rs`); elsewhere only trait impls (`Display`),
  or free functions (presentation in `report/` and `cli/`).
- Every `src/...` path of this crate's modules named in the sources, the build script,
  the scripts, the tests, the README and docs/ must exist (a comment naming a file that
  moved is caught here; other projects' `src/` paths, tch's or PyTorch's, are not
  this crate's modules and are left alone).

Prints what is missing or stale; exit 1 if anything is.

    python3 scripts/architecture-check.py
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
DOC = ROOT / "docs" / "architecture.md"
SOURCE_SUFFIXES = {".rs", ".cpp", ".h", ".js", ".css"}


def sources() -> set[str]:
    return {
        p.relative_to(SRC).as_posix()
        for p in SRC.rglob("*")
        if p.is_file() and p.suffix in SOURCE_SUFFIXES
    }


def code_of(p: Path) -> str:
    """A file's code: comments and string literals out."""
    code = re.sub(r"/\*.*?\*/", "", p.read_text(), flags=re.S)
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', re.sub(r"//[^\n]*", "", code))


def misplaced_impls() -> list[str]:
    """Inherent impls of a type outside the module that defines it."""
    defined, impls = {}, []
    item = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:struct|enum|union)\s+([A-Z]\w*)", re.M)
    inherent = re.compile(r"^\s*impl(?:\s*<[^{]*?>)?\s+([\w:]+)(?:<[^{]*?>)?\s*(for\b[^{]*)?\{", re.M)
    for p in sorted(SRC.rglob("*.rs")):
        rel = p.relative_to(SRC).as_posix()
        code = code_of(p)
        for m in item.finditer(code):
            defined.setdefault(m.group(1), []).append(rel)
        for m in inherent.finditer(code):
            if not m.group(2):
                impls.append((m.group(1).split("::")[-1], rel, code[: m.start()].count("\n") + 1))
    problems = []
    for name, rel, line in impls:
        homes = defined.get(name, [])
        # A type's module: its file, and the folder of its mod.rs.
        inside = any(
            rel == h or (h.endswith("/mod.rs") and rel.startswith(h[: -len("mod.rs")]))
            for h in homes
        )
        if homes and not inside:
            problems.append(
                f"src/{rel}:{line}: `impl {name}` outside {', '.join('src/' + h for h in homes)}: "
                "move the methods home, or make them free functions or a trait impl"
            )
    return problems


def main() -> int:
    problems = []
    files = sources()
    doc = DOC.read_text()
    named = set(re.findall(r"`([a-z_][a-z0-9_/.-]*\.(?:rs|cpp|h|js|css))`", doc))
    for f in sorted(files - named):
        problems.append(f"docs/architecture.md does not name src/{f}")
    for f in sorted(n for n in named if "/" in n or n in files):
        if f not in files and not (ROOT / f).exists():
            problems.append(f"docs/architecture.md names {f}, which does not exist under src/")
    for d in sorted(p for p in SRC.rglob("*") if p.is_dir()):
        beside = d.with_suffix(".rs")
        if beside.is_file():
            problems.append(
                f"src/{beside.relative_to(SRC)} sits beside the folder src/{d.relative_to(SRC)}/: "
                f"make it src/{d.relative_to(SRC)}/mod.rs (one layout convention)"
            )
    # Any repr naming C (`repr(C)`, `repr(C, packed)`, `repr(align(8), C)`), then other
    # attributes or comments, then the item.
    repr_c = re.compile(
        r"#\[repr\([^\]]*\bC\b[^\]]*\]\s*(?:(?:#\[[^\]]*\]|//[^\n]*)\s*)*"
        r"(pub(?:\([^)]*\))?\s+)?(struct|union|enum)\s+(\w+)"
    )
    raw_name = re.compile(r"\bMp[A-Z]\w*")
    for p in sorted(SRC.rglob("*.rs")):
        rel = p.relative_to(SRC).as_posix()
        # Code only: comments and string literals out (a doc example is not a record).
        code = re.sub(r"/\*.*?\*/", "", p.read_text(), flags=re.S)
        code = re.sub(r'"(?:\\.|[^"\\])*"', '""', re.sub(r"//[^\n]*", "", code))
        in_ffi = rel.startswith("ffi/")
        # In ffi/mod.rs, `pub(super)` is the whole crate: a record there stays private.
        allowed = ("",) if rel == "ffi/mod.rs" else ("", "pub(super)", "pub(in crate::ffi)")
        for m in repr_c.finditer(code):
            vis, name = (m.group(1) or "").strip(), m.group(3)
            if not in_ffi:
                problems.append(f"src/{rel} defines the native record {name}: only src/ffi/ may")
            elif not re.fullmatch(r"Mp[A-Z]\w*", name):
                problems.append(f"src/{rel}: the native record {name} must keep its C name (Mp...)")
            elif vis not in allowed:
                problems.append(f"src/{rel}: the native record {name} is `{vis}`: keep it in src/ffi/ (pub(super))")
        if not in_ffi:
            for m in sorted(set(raw_name.findall(code))):
                problems.append(f"src/{rel} names the native record {m}: read the typed value src/ffi/ decodes it into")
            # The contract's constants (`ffi::native`) are read in src/ffi/ alone: the
            # rest of the crate gets typed values (an event's kind, an autocast list).
            if re.search(r"\bnative::|ffi::\{[^}]*\bnative\b|ffi::native\b", code):
                problems.append(f"src/{rel} reads the native layer's constants (`native::`): only src/ffi/ may, the rest reads the typed values it decodes them into")
            # The event model is `events`, not the seam: no event type is taken from ffi.
            if re.search(r"ffi::(?:\{[^}]*\b(?:Event|EventKind|decode)\b|(?:Event|EventKind|decode)\b)", code):
                problems.append(f"src/{rel} takes the event model from ffi: it is `crate::events`")
    problems += misplaced_impls()
    mention = re.compile(r"(?<![\w/.-])src/([A-Za-z0-9_./-]+\.(?:rs|cpp|h|js|css))\b")
    # The crate's modules: what a path of ours begins with.
    ours = {Path(f).parts[0].split(".")[0] for f in files}
    texts = [ROOT / "README.md", ROOT / "build.rs", *ROOT.glob("docs/*.md")]
    texts += [p for p in SRC.rglob("*") if p.is_file() and p.suffix in SOURCE_SUFFIXES]
    texts += [p for p in (ROOT / "scripts").rglob("*") if p.is_file()]
    texts += [p for p in (ROOT / "tests").rglob("*.rs")]
    for t in texts:
        for m in mention.finditer(t.read_text(errors="replace")):
            first = Path(m.group(1)).parts[0].split(".")[0]
            if first in ours and m.group(1) not in files:
                problems.append(f"{t.relative_to(ROOT)} names src/{m.group(1)}, which does not exist")
    for p in problems:
        print(p)
    print(f"architecture check: {len(files)} source files, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
