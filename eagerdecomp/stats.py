"""Per-op counters of a runtime and their report.

Every call is counted under exactly one route: passed through, decomposed
(hit or miss; misses that produced a kernel count as traces), bypassed (with
its reason), or unsupported (and, under ``on_unsupported="fallthrough"`` or
``"warn"``, run natively).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["Stats", "Report", "OpRow"]


class Stats:
    def __init__(self):
        self.passthrough = Counter()
        self.hits = Counter()
        self.misses = Counter()
        self.traces = Counter()
        self.bypassed = Counter()  # (op, reason) -> n: calls that skipped the cache
        self.negative = Counter()  # (op, reason) -> n: cache entries that said "run eagerly"
        self.unsupported = Counter()
        self.fallthrough = Counter()
        self.leaf_ops: dict = {}  # op -> set of opset ops its kernels call
        self.fixups: dict = {}  # op -> set of output fix-ups its kernels apply
        self.random = set()  # ops whose kernels draw random numbers
        self.lifted = set()  # ops replayed with float arguments as kernel inputs
        self.by_value = set()  # ops whose float arguments had to be keyed by value

    def record_kernel(self, kernel) -> None:
        """Note what ``kernel`` runs (on each trace, and on the first hit of an op)."""
        self.leaf_ops.setdefault(kernel.op, set()).update(kernel.leaf_ops)
        self.fixups.setdefault(kernel.op, set()).update(kernel.fixups)
        if kernel.random:
            self.random.add(kernel.op)

    def clear(self) -> None:
        self.__init__()

    def report(self) -> "Report":
        ops = set(self.passthrough) | set(self.hits) | set(self.misses) | set(self.unsupported)
        ops |= {op for op, _ in self.bypassed}
        rows = []
        for op in sorted(ops, key=str):
            rows.append(
                OpRow(
                    op=str(op),
                    passthrough=self.passthrough[op],
                    hits=self.hits[op],
                    misses=self.misses[op],
                    traces=self.traces[op],
                    bypassed={r: n for (o, r), n in self.bypassed.items() if o == op},
                    negative={r: n for (o, r), n in self.negative.items() if o == op},
                    unsupported=self.unsupported[op],
                    fallthrough=self.fallthrough[op],
                    into=sorted(str(o) for o in self.leaf_ops.get(op, ())),
                    fixups=sorted(self.fixups.get(op, ())),
                    random=op in self.random,
                    lifted=op in self.lifted,
                    by_value=op in self.by_value,
                )
            )
        return Report(rows)


@dataclass
class OpRow:
    op: str
    passthrough: int = 0
    hits: int = 0
    misses: int = 0
    traces: int = 0
    bypassed: dict = field(default_factory=dict)
    negative: dict = field(default_factory=dict)
    unsupported: int = 0
    fallthrough: int = 0
    into: list = field(default_factory=list)
    fixups: list = field(default_factory=list)
    random: bool = False
    lifted: bool = False
    by_value: bool = False

    @property
    def calls(self) -> int:
        return self.passthrough + self.hits + self.misses + sum(self.bypassed.values())

    @property
    def route(self) -> str:
        if self.unsupported:
            return "unsupported"
        if self.bypassed or self.negative:
            return "bypassed"
        if self.hits or self.misses:
            return "decomposed"
        return "passthrough"


@dataclass
class Report:
    """What a mode did, per op. ``str(report)`` is a table; fields are public."""

    rows: list

    def by_route(self, route: str) -> list:
        return [r for r in self.rows if r.route == route]

    @property
    def decomposed(self) -> list:
        return self.by_route("decomposed")

    def row(self, op) -> OpRow | None:
        return next((r for r in self.rows if r.op == str(op)), None)

    def __str__(self) -> str:
        width = max([48] + [len(r.op) for r in self.rows])
        head = f"{'op':{width}} {'route':12} {'calls':>7} {'hits':>6} {'miss':>5} {'trace':>5}  notes"
        lines = [head, "-" * len(head)]
        for r in self.rows:
            calls = r.calls
            notes = []
            if r.into:
                notes.append("-> " + ", ".join(o.removeprefix("aten.") for o in r.into))
            notes += [f"bypass[{k}]={v}" for k, v in r.bypassed.items()]
            notes += [f"eager[{k}]={v}" for k, v in r.negative.items()]
            notes += [f"fix-up: {f}" for f in r.fixups]
            if r.lifted:
                notes.append("float args lifted")
            if r.by_value:
                notes.append("float args keyed by value")
            if r.fallthrough:
                notes.append(f"ran natively x{r.fallthrough}")
            if r.random:
                notes.append("draws random numbers (stream may differ from the native kernel)")
            lines.append(f"{r.op:{width}} {r.route:12} {calls:>7} {r.hits:>6} {r.misses:>5} {r.traces:>5}  {'; '.join(notes)}")
        counts = {k: len(self.by_route(k)) for k in ("passthrough", "decomposed", "bypassed", "unsupported")}
        lines.append(", ".join(f"{v} {k}" for k, v in counts.items()) + " ops")
        return "\n".join(lines)
