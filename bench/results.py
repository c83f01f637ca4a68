"""One JSON shape for every benchmark, so the docs render measured tables and never retype them.

A benchmark builds :class:`Table` objects as it prints, then ``save(path, tables)`` writes::

    {"bench": "step", "command": "python bench/step.py --rounds 15",
     "machine": {...}, "torch": "2.13.0+cpu", "eagerdecomp": "0.1.0",
     "tables": [{"title": ..., "columns": [...], "rows": [[...], ...], "notes": [...]}]}

``bench/render.py`` turns those files into docs/performance.md and README's headline table.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from dataclasses import asdict, dataclass, field

import torch

import eagerdecomp as ed

__all__ = ["Table", "machine", "save", "add_json_flag"]


@dataclass
class Table:
    """A measured table: ``rows`` hold numbers (rendered with ``formats``) or strings."""

    title: str
    columns: list
    rows: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    # per column, a format spec for numbers ("{:.2f}x", "{:.1f}"); missing: str()
    formats: dict = field(default_factory=dict)

    def add(self, *row):
        assert len(row) == len(self.columns), (row, self.columns)
        self.rows.append(list(row))


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device: str = "cpu") -> dict:
    """What the numbers were measured on: the CPU, its cores, torch's threads, the accelerator."""
    out = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "os": platform.system(),
    }
    if device not in ("cpu", "edref") and torch.cuda.is_available():
        out["accelerator"] = torch.cuda.get_device_name()
    return out


def command() -> str:
    """The command line that ran the benchmark, from the repository root, without ``--json PATH``
    (where the output went is not a measurement parameter)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    args, skip = [], False
    for a in sys.argv[1:]:
        if skip or a.startswith("--json"):
            skip = a == "--json"
            continue
        args.append(a)
    script = os.path.relpath(os.path.abspath(sys.argv[0]), root)
    return " ".join(["python", shlex.quote(script), *map(shlex.quote, args)])


def add_json_flag(parser) -> None:
    parser.add_argument("--json", metavar="PATH", help="also write the tables as JSON (bench/render.py reads it)")


def save(path: str | None, bench: str, tables: list, device: str = "cpu") -> None:
    """Write ``tables`` with the command line, machine and versions that produced them."""
    if not path:
        return
    doc = {
        "bench": bench,
        "command": command(),
        "machine": machine(device),
        "torch": torch.__version__,
        "eagerdecomp": ed.__version__,
        "tables": [asdict(t) for t in tables],
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {path}")
