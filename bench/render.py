"""Render the benchmarks' JSON (bench/results/*.json) into the docs, between markers.

A block ``<!-- bench:NAME -->`` ... ``<!-- /bench:NAME -->`` in a Markdown file is replaced by
the tables of ``bench/results/NAME.json``, each under the command, machine and torch version
that produced it. ``<!-- bench:NAME:TITLE -->`` renders only the table titled TITLE.

    python bench/render.py            # rewrite docs/*.md and README.md in place
    python bench/render.py --check    # exit 1 if a file is out of date (make lint runs it)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
BLOCK = re.compile(r"(<!-- bench:([\w-]+)(?::([^>]*?))? -->\n).*?(<!-- /bench:\2 -->)", re.S)


def _cell(value, fmt=None):
    if isinstance(value, (int, float)) and not isinstance(value, bool) and fmt:
        return fmt.format(value)
    return "" if value is None else str(value).replace("|", "\\|")  # a pipe would end the cell


def table_md(t: dict) -> str:
    fmts = t.get("formats", {})
    lines = ["| " + " | ".join(map(_cell, t["columns"])) + " |", "|" + "---|" * len(t["columns"])]
    for row in t["rows"]:
        lines.append("| " + " | ".join(_cell(v, fmts.get(c)) for c, v in zip(t["columns"], row)) + " |")
    return "\n".join(lines + [f"\n{n}" for n in t.get("notes", [])])


def render(name: str, title: str | None) -> str:
    doc = json.loads((RESULTS / f"{name}.json").read_text())
    m = doc["machine"]
    where = f"{m['cpu']}, {m['cores']} cores, {m['threads']} torch thread(s)" + (
        f", {m['accelerator']}" if m.get("accelerator") else ""
    )
    src = f"`{doc['command']}` · {where} · torch {doc['torch']} · eagerdecomp {doc['eagerdecomp']}"
    tables = [t for t in doc["tables"] if title is None or t["title"] == title]
    if not tables:
        raise SystemExit(f"bench/results/{name}.json has no table titled {title!r}")
    body = "\n\n".join((f"**{t['title']}**\n\n" if title is None else "") + table_md(t) for t in tables)
    return f"{body}\n\n<sub>{src}</sub>\n"


def rewrite(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + render(m.group(2), m.group(3)) + m.group(4), text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    opts = ap.parse_args(argv)
    stale = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        old = path.read_text()
        new = rewrite(old)
        if new != old:
            stale.append(path.relative_to(ROOT))
            if not opts.check:
                path.write_text(new)
    if opts.check and stale:
        print("out of date (run python bench/render.py):", *stale)
        return 1
    print("rendered" if not opts.check else "up to date", *stale)
    return 0


if __name__ == "__main__":
    sys.exit(main())
