#!/usr/bin/env python3
"""The pictures of the README and docs/: where each comes from, checked.

    python3 scripts/pictures.py check          # CI: every linked picture is ours and made
    python3 scripts/pictures.py tag FILE TEXT  # scripts/readme-pictures.sh: marks its output

Every picture that README.md or a page of docs/ links must exist in the repository and be
a PNG that scripts/readme-pictures.sh wrote: the script marks each with a PNG text chunk
(keyword `tch-memprof-picture`, the command that made it) after checking what it shows (a
real run's own label and source lines, never a test's temporary folder or a test file);
a picture copied from a test's artifacts, or drawn by hand, has no mark and fails here.
The README names the command under each picture: the line after its image says
`scripts/readme-pictures.sh`. Exits 1 with one line a problem, else prints what it checked.
"""

import re
import struct
import sys
import zlib
from pathlib import Path

KEY = b"tch-memprof-picture"
ROOT = Path(__file__).resolve().parent.parent
SCRIPT = "scripts/readme-pictures.sh"
PNG = b"\x89PNG\r\n\x1a\n"


def chunks(data):
    """The PNG's chunks as (type, body), in order."""
    if not data.startswith(PNG):
        raise ValueError("not a PNG")
    at = len(PNG)
    while at + 8 <= len(data):
        (n,) = struct.unpack(">I", data[at : at + 4])
        kind = data[at + 4 : at + 8]
        yield kind, data[at + 8 : at + 8 + n]
        at += 12 + n


def mark_of(path):
    """The `tch-memprof-picture` text of a PNG, or None."""
    for kind, body in chunks(path.read_bytes()):
        if kind == b"tEXt" and body.startswith(KEY + b"\0"):
            return body[len(KEY) + 1 :].decode("latin-1")
    return None


def tag(path, text):
    """Writes `text` into the PNG as its `tch-memprof-picture` chunk (after IHDR)."""
    data = path.read_bytes()
    kept = [(k, b) for k, b in chunks(data) if not (k == b"tEXt" and b.startswith(KEY + b"\0"))]
    body = KEY + b"\0" + text.encode("latin-1")
    out = [PNG]
    for i, (kind, b) in enumerate(kept):
        out.append(struct.pack(">I", len(b)) + kind + b + struct.pack(">I", zlib.crc32(kind + b)))
        if i == 0:
            t = b"tEXt"
            out.append(struct.pack(">I", len(body)) + t + body + struct.pack(">I", zlib.crc32(t + body)))
    path.write_bytes(b"".join(out))


IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)[^)]*\)|<img[^>]*\bsrc=\"([^\"]+)\"")


def pages():
    yield ROOT / "README.md"
    yield from sorted((ROOT / "docs").rglob("*.md"))


def check():
    problems = []
    checked = 0
    for page in pages():
        lines = page.read_text().splitlines()
        rel_page = page.relative_to(ROOT)
        for no, line in enumerate(lines, 1):
            for m in IMAGE.finditer(line):
                link = m.group(1) or m.group(2)
                where = f"{rel_page}:{no}: {link}"
                if re.match(r"[a-z]+:", link):
                    problems.append(f"{where}: a picture must be a file of the repository, not an address")
                    continue
                target = (page.parent / link.split("#")[0]).resolve()
                if not target.is_file():
                    problems.append(f"{where}: no such file")
                    continue
                try:
                    mark = mark_of(target)
                except ValueError as e:
                    problems.append(f"{where}: {e} (the pictures are PNGs that {SCRIPT} writes)")
                    continue
                if mark is None or not mark.startswith(SCRIPT):
                    problems.append(
                        f"{where}: not made by {SCRIPT} (no `tch-memprof-picture` mark: a test's "
                        f"artifact or a hand-made file; remake it with the script)"
                    )
                    continue
                if page.name == "README.md":
                    after = " ".join(lines[no : no + 3])
                    if SCRIPT not in after:
                        problems.append(f"{where}: the README names no command under the picture ({SCRIPT})")
                        continue
                checked += 1
                print(f"pictures: {where}: {mark}")
    for p in problems:
        print(f"pictures: {p}", file=sys.stderr)
    if problems:
        return 1
    if checked == 0:
        print("pictures: no picture is linked from README.md or docs/ (the check found nothing to check)", file=sys.stderr)
        return 1
    print(f"pictures: {checked} pictures checked")
    return 0


def main(argv):
    if len(argv) == 2 and argv[1] == "check":
        return check()
    if len(argv) == 4 and argv[1] == "tag":
        tag(Path(argv[2]), argv[3])
        return 0
    print("usage: pictures.py check | pictures.py tag FILE TEXT", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
