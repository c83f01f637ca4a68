"""Coverage by models: which models of a corpus run on an opset, and which ops to add for more.

A corpus gives, per model, the aten overloads it calls (:mod:`eagerdecomp.coverage.record`
writes ours; PyTorch's benchmark logs, ``pytorch_model_ops.json``, are read too). The
answers come from the same per-op verdicts as :class:`~eagerdecomp.coverage.Coverage`:

* a model **runs** when every op it calls is in the opset or reaches it;
* otherwise its **blockers** are the ops with no way down: each unreachable op is followed
  down its decomposition to the unreachable ops that have none (no decomposition, declined,
  undetermined, not analysed) or that close a cycle. Adding all of a model's blockers makes
  it run. A model is **blocked** when a blocker has no path, else **undetermined** (an
  undetermined op never counts as covered);
* **implement next**: single ops ranked by the models they alone unlock (ties: by the blocked
  models that need them);
* **ops to add for N% of models**: greedy, never claimed minimal: repeatedly add the missing
  blockers of one blocked model, choosing the set that completes the most models per op added.

The page (:mod:`eagerdecomp.coverage.page`) runs the same algorithms in JavaScript; a
browser test checks they agree.

Example::

    >>> import eagerdecomp.coverage as cov
    >>> from eagerdecomp.coverage.models import load_corpus, analyse_models
    >>> m = analyse_models(cov.analyse(cov.load_graph(), "core_aten"), load_corpus())   # doctest: +SKIP
    >>> m.share(), m.ops_for(90)                                                         # doctest: +SKIP
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["Corpus", "load_corpus", "passes_through", "ModelCoverage", "analyse_models", "TARGETS", "LEGACY_NAMES"]

TARGETS = (50, 80, 90, 100)

# Overload names of PyTorch's 2022 benchmark logs that today's ATen spells otherwise.
LEGACY_NAMES = {
    "aten.sum.SymInt": "aten.sum.dim_IntList",  # as PyTorch's own loader (operator_inp_utils.py) maps it
    "aten.col2im_backward.default": "aten.im2col.default",  # removed 2022: the backward of col2im is im2col
    "aten.im2col_backward.default": "aten.col2im.default",
    "aten.upsample_bilinear2d_backward.vec": "aten.upsample_bilinear2d_backward.default",  # .vec backwards removed
    "aten.upsample_nearest2d_backward.vec": "aten.upsample_nearest2d_backward.default",
}


def passes_through(op: str) -> bool:
    """Ops of a namespace the runtime passes through untouched (``profiler::`` from
    ``optimizer.step``'s ``record_function``, collectives): never a blocker."""
    from eagerdecomp.runtime import routes

    rule = routes.NAMESPACES.get(op.split(".", 1)[0])
    return rule is not None and rule.name in (routes.INFRASTRUCTURE, routes.COMMUNICATION)


@dataclass
class Corpus:
    """``models[name] = {"family": str, "ops": {op: calls}}`` (all phases summed), and where it came from."""

    name: str
    models: dict
    meta: dict

    def families(self) -> list:
        return sorted({m["family"] for m in self.models.values()})


def load_corpus(path=None) -> Corpus:
    """Our corpus (default: the shipped one, :data:`eagerdecomp.coverage.record.DATA`) or a file
    in PyTorch's ``pytorch_model_ops.json`` format (``{"models": {"suite/Model": {op: n}}}``,
    family = suite, legacy names mapped by :data:`LEGACY_NAMES`)."""
    from eagerdecomp.coverage.record import DATA

    path = Path(path or DATA)
    data = json.loads(path.read_text())
    models = {}
    if "format" in data:  # ours: op names once, phases as [[op index, count]]
        names = data["ops"]
        for model, m in data["models"].items():
            ops: Counter = Counter()
            for pairs in m["phases"].values():
                for i, n in pairs:
                    ops[names[i]] += n
            models[model] = {"family": m["family"], "ops": dict(ops), "phases": sorted(m["phases"])}
        meta = {k: data[k] for k in ("recorded", "versions", "command") if k in data}
        meta["skipped"] = len(data.get("skipped", ()))
    else:
        for model, ops in data["models"].items():
            fixed: Counter = Counter()
            for op, n in ops.items():
                fixed[LEGACY_NAMES.get(op, op)] += n
            models[model] = {"family": model.split("/")[0], "ops": dict(fixed), "phases": ["train"]}
        meta = {"source": data.get("source", ""), "note": data.get("note", "")}
    return Corpus(path.name, models, meta)


class ModelCoverage:
    """Per model of ``corpus``: runs / blocked / undetermined under ``cov``'s opset; see the module."""

    def __init__(self, cov, corpus: Corpus):
        self.cov, self.corpus = cov, corpus
        self._blockers: dict = {}
        self.blockers = {m: self._model_blockers(spec["ops"]) for m, spec in corpus.models.items()}
        self.status = {m: self._status(b) for m, b in self.blockers.items()}
        # with the CPU tier (on_unsupported="cpu"): the ops a model calls that would run there, or
        # the first that cannot (a view, a random op: eagerdecomp.runtime.host), per model not running
        self.on_cpu = {m: self._on_cpu(spec["ops"]) for m, spec in corpus.models.items() if self.status[m] != "runs"}

    # -- per op ---------------------------------------------------------------------------------
    def runs(self, op: str) -> bool:
        """In the opset, or reaches it (infrastructure ops too)."""
        return op in self.cov.depth

    def kind(self, op: str) -> str:
        """Why a blocker stops: its graph kind, "cycle", or "not analysed"."""
        node = self.cov.nodes.get(op)
        return "not analysed" if node is None else node["kind"] if node["kind"] != "decomposes" else "cycle"

    def op_blockers(self, op: str) -> frozenset:
        """The ops with no way down that ``op`` needs (empty when it runs): a depth-first walk
        down unreachable decompositions, collecting the ops without one, and on a cycle the op
        that closes it; adding them all makes ``op`` reach the opset."""
        hit = self._blockers.get(op)
        if hit is not None:
            return hit
        out: set = set()
        if not self.runs(op):
            self._walk(op, out)
        self._blockers[op] = hit = frozenset(out)
        return hit

    def _walk(self, start: str, out: set) -> None:
        nodes = self.cov.nodes

        def decomposes(o):
            node = nodes.get(o)
            return node is not None and node["kind"] == "decomposes"

        if not decomposes(start):
            out.add(start)
            return
        visited, on_path = {start}, {start}
        stack = [(start, iter(nodes[start]["children"]))]
        while stack:  # iterative: decomposition chains can be deep
            o, children = stack[-1]
            c = next(children, None)
            if c is None:
                stack.pop()
                on_path.discard(o)
            elif self.runs(c):
                continue
            elif c in on_path:
                out.add(c)  # a cycle: adding c breaks it
            elif c not in visited:
                visited.add(c)
                if decomposes(c):
                    on_path.add(c)
                    stack.append((c, iter(nodes[c]["children"])))
                else:
                    out.add(c)

    # -- per model ------------------------------------------------------------------------------
    def _model_blockers(self, ops) -> frozenset:
        return frozenset().union(*[self.op_blockers(op) for op in ops if not self.runs(op) and not passes_through(op)])

    def _on_cpu(self, ops) -> tuple:
        """``(ops the tier would run, None)`` or ``(ops, (op, why))`` for the first it refuses."""
        calls = sorted(op for op in ops if not self.runs(op) and not passes_through(op))
        for op in calls:
            why = _tier_refusal(op)
            if why is not None:
                return calls, (op, why)
        return calls, None

    def with_cpu_tier(self) -> int:
        """Models that run with the CPU tier on (those that run without it included)."""
        return sum(1 for m in self.status if m not in self.on_cpu or self.on_cpu[m][1] is None)

    def _status(self, blockers) -> str:
        if not blockers:
            return "runs"
        definite = any(self.kind(b) in ("no decomposition", "declined", "cycle") for b in blockers)
        return "blocked" if definite else "undetermined"

    def counts(self) -> dict:
        c = Counter(self.status.values())
        return {s: c.get(s, 0) for s in ("runs", "blocked", "undetermined")}

    def share(self) -> float:
        """Percent of the corpus's models that run."""
        return 100.0 * self.counts()["runs"] / max(1, len(self.status))

    def families(self) -> dict:
        """``{family: (models that run, models)}``."""
        out: dict = defaultdict(lambda: [0, 0])
        for m, spec in self.corpus.models.items():
            out[spec["family"]][1] += 1
            out[spec["family"]][0] += self.status[m] == "runs"
        return {f: tuple(v) for f, v in sorted(out.items())}

    def implement_next(self, k: int = 10) -> list:
        """``[(op, models it alone unlocks, blocked models that need it)]``, best first."""
        alone, needed = Counter(), Counter()
        for b in self.blockers.values():
            for op in b:
                needed[op] += 1
            if len(b) == 1:
                alone[next(iter(b))] += 1
        ranked = sorted(needed, key=lambda op: (-alone[op], -needed[op], op))
        return [(op, alone[op], needed[op]) for op in ranked[:k]]

    def ops_for(self, percent: float) -> list:
        """Greedy: ops to add so that at least ``percent`` % of the models run, in the order
        picked; each step adds one blocked model's missing blockers, the set that completes the
        most models per op added (ties: fewer ops, then names)."""
        need = -(-len(self.status) * percent // 100)  # ceil
        groups = Counter(b for b in self.blockers.values() if b)
        covered = sum(1 for b in self.blockers.values() if not b)
        picked: list = []
        have: set = set()
        while covered < need and groups:
            best = None
            for req in groups:
                add = req - have
                union = have | add
                done = sum(n for r, n in groups.items() if r <= union)
                key = (-done / len(add), len(add), sorted(add))
                if best is None or key < best[0]:
                    best = (key, add)
            add = best[1]
            picked += sorted(add)
            have |= add
            for r in [r for r in groups if r <= have]:
                covered += groups.pop(r)
        return picked

    # -- output -----------------------------------------------------------------------------------
    def summary(self) -> str:
        c = self.counts()
        return (
            f"{self.cov.opset.name or 'custom opset'}: {self.corpus.name}: {len(self.status)} models: "
            f"{c['runs']} run ({self.share():.1f}%), {c['blocked']} blocked, {c['undetermined']} undetermined; "
            f"with the CPU tier {self.with_cpu_tier()} run"
        )

    def to_dict(self, top: int = 10, targets=TARGETS) -> dict:
        return {
            "opset": self.cov.opset.name,
            "corpus": self.corpus.name,
            "meta": self.corpus.meta,
            "counts": self.counts(),
            "share": round(self.share(), 2),
            "with_cpu_tier": self.with_cpu_tier(),
            "families": {f: {"runs": r, "models": n} for f, (r, n) in self.families().items()},
            "implement_next": [{"op": op, "unlocks": a, "needed_by": n} for op, a, n in self.implement_next(top)],
            "targets": {str(t): self.ops_for(t) for t in targets},
            "models": {
                m: {
                    "family": self.corpus.models[m]["family"],
                    "status": self.status[m],
                    "blockers": sorted(self.blockers[m]),
                    "cpu_tier": _tier_dict(self.on_cpu.get(m)),
                }
                for m in sorted(self.status)
            },
        }

    def table(self, top: int = 10, targets=TARGETS, show_models: bool = True) -> str:
        lines = [self.summary(), "", "Per family:"]
        for f, (r, n) in self.families().items():
            lines.append(f"  {f:34} {r:4}/{n:<4} {100.0 * r / n:5.1f}%")
        lines += ["", "Implement next (models it alone unlocks; blocked models that need it):"]
        for i, (op, a, n) in enumerate(self.implement_next(top), 1):
            lines.append(f"  {i:2}. {op:50} unlocks {a:3}, needed by {n:3}  [{self.kind(op)}]")
        lines += ["", "Ops to add to run a share of the models (greedy, not proven minimal):"]
        for t in targets:
            ops = self.ops_for(t)
            lines.append(f"  {t:g}%: {len(ops)} ops" + (f": {', '.join(ops)}" if ops else ""))
        if show_models:
            width = max(map(len, self.status), default=10)
            lines += ["", "Models (CPU tier: with on_unsupported='cpu', the ops that would run there):"]
            for m in sorted(self.status, key=lambda m: (self.corpus.models[m]["family"], m)):
                b = self.blockers[m]
                lines.append(
                    f"  {m:{width}}  {self.status[m]:12}  {_tier_cell(self.on_cpu.get(m)):22}"
                    + (f"  blocked by {', '.join(sorted(b))}" if b else "")
                )
        return "\n".join(lines)


def _tier_refusal(name: str) -> str | None:
    """Why the CPU tier would refuse the op ``name`` on a device with its own generator, or None."""
    from eagerdecomp.ops.schema import op_from_name
    from eagerdecomp.runtime.host import schema_refusal

    op = op_from_name(name)
    if not isinstance(op, torch._ops.OpOverload):
        return "not an op of this torch"
    why = schema_refusal(op)
    if why is None and torch.Tag.nondeterministic_seeded in op.tags:
        why = "it draws random numbers (the tier runs it only where the device's generator is the CPU's)"
    return why


def _tier_cell(entry) -> str:
    if entry is None:
        return "-"
    ops, refused = entry
    return f"runs, {len(ops)} on CPU" if refused is None else f"refuses {refused[0]}"


def _tier_dict(entry):
    if entry is None:
        return None
    ops, refused = entry
    return {"runs": refused is None, "ops": ops, "refused": list(refused) if refused else None}


def analyse_models(cov, corpus=None) -> ModelCoverage:
    """Per-model verdicts of ``corpus`` (a :class:`Corpus`, a path, or None for ours) under ``cov``'s opset."""
    return ModelCoverage(cov, corpus if isinstance(corpus, Corpus) else load_corpus(corpus))
