"""Coverage: which aten ops reach a given opset through decompositions, and which do not.

Built on the one-level graph of :mod:`eagerdecomp.coverage.graph` (for every op,
the ops its decomposition calls directly). For an opset ``S``, an op reaches
``S`` when it is in ``S``, or it has a decomposition and every direct child
reaches ``S``: the least fixpoint, computed with one counter per op (the HTML
page of :mod:`eagerdecomp.coverage.page` runs the same algorithm in JavaScript). An op
that does not reach it has *no path* (the chain down to the op that blocks it is
named) or is *undetermined* (an op on the way could not be lowered on any
sample input; the reason is given, never guessed).

Example::

    >>> import eagerdecomp.coverage as cov
    >>> graph = cov.load_graph()                       # doctest: +SKIP
    >>> report = cov.analyse(graph, "core_aten")       # doctest: +SKIP
    >>> report.row("aten.silu.default").leaves         # doctest: +SKIP
    ['aten.mul.Tensor', 'aten.sigmoid.default']
    >>> print(report.summary())                        # doctest: +SKIP
    >>> report.implement_next(3)                       # doctest: +SKIP
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import asdict, dataclass, field

from eagerdecomp.coverage.graph import Graph, build_graph, cache_path, flavour_of, load_graph, name, save_graph, verify
from eagerdecomp.ops.opset import OpSet

__all__ = [
    "Row",
    "Coverage",
    "analyse",
    "check",
    "STATUSES",
    # the graph, from coverage.graph
    "Graph",
    "build_graph",
    "load_graph",
    "save_graph",
    "cache_path",
    "verify",
]

# What the analysis can say about one op under one opset.
STATUSES = {
    "in opset": "the backend runs it",
    "reaches": "decomposes, recursively, into opset ops only",
    "no path": "some op on every route has no decomposition (the blocking op)",
    "undetermined": "an op on the way could not be lowered on any sample input (see its reason)",
}


@dataclass
class Row:
    """The verdict for one op under one opset."""

    op: str
    status: str  # a key of STATUSES
    depth: int = 0  # decomposition levels down to the opset (0 = in the opset)
    leaves: list = field(default_factory=list)  # opset ops it lands on
    blocker: str = ""  # for "no path"/"undetermined": the op that stops it
    chain: list = field(default_factory=list)  # op -> ... -> blocker
    reason: str = ""  # why the blocker stops
    caveats: list = field(default_factory=list)  # ops on the way whose decomposition declined or failed some inputs


def _reach(nodes: dict, ops: frozenset) -> tuple:
    """Least fixpoint: ``(depth by reachable op, parents by op)``; ``ops`` are opset names."""
    parents = defaultdict(list)
    missing = {}
    for op, node in nodes.items():
        if op in ops or node["kind"] == "infrastructure":
            continue
        if node["kind"] == "decomposes":
            missing[op] = len(node["children"])
            for c in node["children"]:
                parents[c].append(op)
    depth: dict = {}
    for op in ops:
        depth[op] = 0
    for op, node in nodes.items():
        if node["kind"] == "infrastructure":
            depth.setdefault(op, 0)
    for op, m in missing.items():
        if m == 0:  # NOTE: no children (lift_fresh returns its argument): one level, nothing below
            depth[op] = 1
    queue = deque(depth)
    while queue:
        op = queue.popleft()
        for p in parents.get(op, ()):
            if p in depth:
                continue
            missing[p] -= 1
            if missing[p] == 0:
                depth[p] = 1 + max(depth[c] for c in nodes[p]["children"])
                queue.append(p)
    return depth, parents


class Coverage:
    """Verdicts for every op of a graph flavour under one opset; see :func:`analyse`."""

    def __init__(self, graph: Graph, opset: OpSet):
        self.graph = graph
        self.opset = opset
        self.flavour = flavour_of(opset)
        self.nodes = graph.nodes(self.flavour)
        self.opset_names = frozenset(name(op) for op in opset.ops)
        self.depth, self.parents = _reach(self.nodes, self.opset_names)
        self._leaves: dict = {}
        self._caveats: dict = {}
        self.rows = {op: self._row(op) for op in graph.aten_ops()}

    def leaves(self, op: str) -> frozenset:
        if op in self.opset_names:
            return frozenset([op])
        hit = self._leaves.get(op)
        if hit is None:
            node = self.nodes.get(op, {})
            hit = frozenset().union(*[self.leaves(c) for c in node.get("children", ())])
            self._leaves[op] = hit
        return hit

    def caveats(self, op: str) -> frozenset:
        """Ops on ``op``'s way down (itself included) whose decomposition declined or raised
        on some sample inputs while it worked on others: for those inputs there is no path."""
        if op in self.opset_names:
            return frozenset()
        hit = self._caveats.get(op)
        if hit is None:
            node = self.nodes.get(op, {})
            own = frozenset([op]) if node.get("notes") else frozenset()
            hit = own.union(*[self.caveats(c) for c in node.get("children", ())])
            self._caveats[op] = hit
        return hit

    def _blocker(self, op: str) -> tuple:
        """``(chain, reason, definite)``: down the first unreachable child until an op stops."""
        chain, seen = [op], {op}
        while True:
            node = self.nodes.get(chain[-1])
            if node is None:
                return chain, "not in the graph (not analysed)", False
            if node["kind"] != "decomposes":
                definite = node["kind"] in ("no decomposition", "declined")
                return chain, node["reason"] or node["kind"], definite
            stuck = [c for c in node["children"] if c not in self.depth]
            nxt = next((c for c in stuck if c not in seen), None)
            if nxt is None:
                return chain + [stuck[0]], "decomposition cycle", True
            chain.append(nxt)
            seen.add(nxt)

    def _row(self, op: str) -> Row:
        if op in self.opset_names:
            return Row(op, "in opset", 0, [op])
        if op in self.depth:
            return Row(op, "reaches", self.depth[op], sorted(self.leaves(op)), caveats=sorted(self.caveats(op)))
        chain, reason, definite = self._blocker(op)
        return Row(op, "no path" if definite else "undetermined", blocker=chain[-1], chain=chain, reason=reason)

    def row(self, op) -> Row:
        return self.rows[op if isinstance(op, str) else name(op)]

    def by_status(self, status: str) -> list:
        return [r for r in self.rows.values() if r.status == status]

    def counts(self) -> dict:
        return {s: len(self.by_status(s)) for s in STATUSES}

    def unlocked_by(self, extra: str, reached=None) -> set:
        """Ops that reach the opset once ``extra`` joins it (``extra`` included)."""
        reached = self.depth if reached is None else reached
        missing: dict = {}
        out, queue = {extra}, deque([extra])
        while queue:
            op = queue.popleft()
            for p in self.parents.get(op, ()):
                if p in reached or p in out:
                    continue
                left = missing.get(p)
                if left is None:
                    left = sum(1 for c in self.nodes[p]["children"] if c not in reached)
                left -= 1
                missing[p] = left
                if left == 0:
                    out.add(p)
                    queue.append(p)
        return out

    def implement_next(self, k: int = 10) -> list:
        """Greedy: ``[(op, n aten ops it unlocks)]``, each pick assuming the previous ones are done."""
        reached = dict(self.depth)
        picks = []
        candidates = {op for op in self.nodes if op not in reached}
        if self.flavour == "aten":
            # NOTE: one prims op in the opset switches the runtime to refs-based tables (see
            # table.default_table), which this flavour's graph does not describe
            candidates = {op for op in candidates if not op.startswith("prims.")}
        for _ in range(k):
            best, best_gain = None, 0
            for c in sorted(candidates):
                gain = sum(1 for o in self.unlocked_by(c, reached) if o.startswith("aten."))
                if gain > best_gain:
                    best, best_gain = c, gain
            if best is None:
                break
            picks.append((best, best_gain))
            for o in self.unlocked_by(best, reached):
                reached[o] = 0
            candidates -= set(reached)
        return picks

    # -- output -----------------------------------------------------------------------------
    def summary(self) -> str:
        c = self.counts()
        total = sum(c.values())
        parts = ", ".join(f"{n} {s}" for s, n in c.items())
        partial = sum(1 for r in self.by_status("reaches") if r.caveats)
        return (
            f"{self.opset.name or 'custom opset'} ({len(self.opset)} ops, {self.flavour} tables): "
            f"{total} aten overloads: "
            f"{parts} ({partial} of those that reach it have an op on the way that declines or fails some inputs)"
        )

    def to_dict(self, top: int = 10) -> dict:
        return {
            "opset": self.opset.name,
            "flavour": self.flavour,
            "counts": self.counts(),
            "implement_next": [{"op": op, "unlocks": n} for op, n in self.implement_next(top)],
            "ops": [asdict(r) for r in self.rows.values()],
        }

    def table(self, top: int = 10, show=("reaches", "no path", "undetermined")) -> str:
        lines = [self.summary(), ""]
        lines.append("Implement next (greedy; each assumes the ones above are done):")
        for i, (op, n) in enumerate(self.implement_next(top), 1):
            lines.append(f"  {i:2}. {op:50} unlocks {n} aten ops")
        width = max(len(r.op) for r in self.rows.values())
        for status in show:
            rows = self.by_status(status)
            lines += ["", f"{status} ({len(rows)}): {STATUSES[status]}"]
            for r in rows:
                if status == "reaches":
                    leaves = (
                        ", ".join(o.removeprefix("aten.") for o in r.leaves)
                        or "(no op: computes nothing a backend runs)"
                    )
                    some = f"  [some inputs fail in: {', '.join(r.caveats)}]" if r.caveats else ""
                    lines.append(f"  {r.op:{width}}  depth {r.depth}  -> {leaves}{some}")
                else:
                    via = " -> ".join(r.chain[1:]) if len(r.chain) > 1 else "itself"
                    lines.append(f"  {r.op:{width}}  blocked by {via}: {r.reason}")
        return "\n".join(lines)


def analyse(graph: Graph, opset) -> Coverage:
    """Verdicts for every aten overload under ``opset`` (a preset name, an OpSet or ops)."""
    return Coverage(graph, OpSet.coerce(opset))


def check(report: Coverage, real: dict) -> tuple:
    """Compare ``report`` with :func:`verify`'s result for the same opset: ``(counts, mismatches)``.

    Per op with a verdict and samples: "reaches" must lower on every sample (unless a
    caveat says some inputs fail) landing only on predicted leaves; "no path" must get
    stuck on some sample. A mismatch is ``(op, what, detail)``.
    """
    from collections import Counter

    counts, mismatches = Counter(), []
    for op, got in sorted(real.items()):
        row = report.rows.get(op)
        if row is None:
            continue
        if got is None:
            counts["lowering crashed"] += 1
        elif row.status == "undetermined" or not got["samples"]:
            counts["not compared (undetermined, or no sample)"] += 1
        elif row.status in ("reaches", "in opset"):
            if got["ok"] < got["samples"]:
                key = "reaches, some inputs fail (flagged)" if row.caveats else "MISMATCH: reaches, but lowering failed"
                counts[key] += 1
                if not row.caveats:
                    mismatches.append((op, "lowering failed", (got["stuck"] or got["failed"])[:1]))
            elif not set(got["leaves"]) <= set(row.leaves):
                counts["reaches, agrees; lowering ran leaves not predicted"] += 1
                mismatches.append((op, "leaves not predicted", sorted(set(got["leaves"]) - set(row.leaves))))
            else:
                counts["reaches, agrees"] += 1
        elif got["ok"] < got["samples"]:
            counts["no path, agrees" if got["stuck"] else "no path; lowering raised another error"] += 1
        else:
            counts["MISMATCH: no path, but lowering succeeded on every sample"] += 1
            mismatches.append((op, "lowering succeeded", row.chain))
    return dict(counts), mismatches
