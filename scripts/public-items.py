#!/usr/bin/env python3
"""The crate's public items, counted from the API docs that CI builds.

    python3 scripts/public-items.py [DOC_DIR] [--list] [--max N] [--one-path]

DOC_DIR is the rustdoc output of the `doc-only` build (default:
target/doc-only/doc/tch_memprof, what `.ci/run` builds before this runs). An *item* is a
page rustdoc writes for the crate's public API: a module, struct, enum, trait, function,
constant, static, type alias or macro (methods, fields and variants belong to their type
and are not counted). A *second path* is a public re-export (`pub use`) of an item that
is public at another path too: rustdoc lists it in the module's "Re-exports" section
instead of giving the item a page there. The count printed is items plus second paths:
the names a user of the crate can write.

Pages rustdoc leaves at an item's private path to send the reader to its public one are
not items. `--max N` fails (exit 1) when that count is over N (CI holds the surface
with it: lower the number as the API shrinks); `--one-path` fails when any item has a
second path. `--list` prints every item and every second path.
"""
import html
import os
import re
import sys

KINDS = ("mod", "struct", "enum", "trait", "fn", "constant", "static", "type", "macro", "union")


def main() -> int:
    args = sys.argv[1:]
    listing = "--list" in args
    one_path = "--one-path" in args
    args = [a for a in args if a not in ("--list", "--one-path")]
    limit = None
    if "--max" in args:
        i = args.index("--max")
        try:
            limit = int(args[i + 1])
        except (IndexError, ValueError):
            print("public-items: --max needs a number", file=sys.stderr)
            return 2
        del args[i : i + 2]
    root = args[0] if args else "target/doc-only/doc/tch_memprof"
    if not os.path.isfile(os.path.join(root, "index.html")):
        print(
            f"public-items: no API docs in {root} (build them first: DOCS_RS=1 "
            "CARGO_TARGET_DIR=target/doc-only cargo doc --no-deps --features doc-only)",
            file=sys.stderr,
        )
        return 2
    items = []
    second = []
    for folder, _, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        module = "tch_memprof" if rel == "." else "tch_memprof::" + rel.replace(os.sep, "::")
        for f in sorted(files):
            m = re.fullmatch(r"(\w+)\.(\w+)\.html", f)
            if m and redirect(os.path.join(folder, f)):
                # An item of a private module re-exported elsewhere: rustdoc leaves a page
                # that sends the reader to the item's one public path.
                continue
            if m and m.group(1) in KINDS:
                items.append((m.group(1), f"{module}::{m.group(2)}"))
            elif f == "index.html":
                if rel != ".":
                    items.append(("mod", module))
                page = open(os.path.join(folder, f), encoding="utf-8").read()
                second += [(module, r) for r in reexports(page)]
    count = len(items) + len(second)
    if listing:
        for kind, path in sorted(items, key=lambda k: k[1]):
            print(f"{kind:9} {path}")
        for module, r in second:
            print(f"{'re-export':9} {module}: {r}")
    print(f"public-items: {len(items)} items, {len(second)} second paths: {count} names")
    if one_path and second:
        print(
            "public-items: an item is public at one path only; these are second paths: "
            + "; ".join(f"{m}: {r}" for m, r in second),
            file=sys.stderr,
        )
        return 1
    if limit is not None and count > limit:
        print(
            f"public-items: {count} public names, more than the {limit} allowed (a new public "
            "item: is it one a user of the library needs? If so, raise --max in .ci/run)",
            file=sys.stderr,
        )
        return 1
    return 0


def redirect(path: str) -> bool:
    with open(path, encoding="utf-8") as f:
        return 'http-equiv="refresh"' in f.read(600)


def reexports(page: str):
    """The `pub use` lines of a module's page (rustdoc's "Re-exports" section)."""
    m = re.search(r'id="reexports".*?(?=<h2|</section>|$)', page, re.S)
    if not m:
        return []
    out = []
    for code in re.findall(r"<code>(.*?)</code>", m.group(0), re.S):
        text = html.unescape(re.sub(r"<[^>]+>", "", code)).strip()
        if text.startswith("pub use"):
            out.append(text)
    return out


if __name__ == "__main__":
    sys.exit(main())
