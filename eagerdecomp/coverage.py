"""Coverage: which aten ops reach a given opset through decompositions, and which do not.

The analysis rests on one graph per table flavour (aten-based tables for aten
opsets, refs-based ones when the opset holds prims; see
:func:`eagerdecomp.table.default_table`): for every op, the ops its
decomposition calls *directly* when none of them is lowered further. It is
found by lowering the op on concrete sample inputs
(:mod:`eagerdecomp.coverage_inputs`) with the project's own
:class:`~eagerdecomp.lower.Lowerer`, told that every op but this one is
served: decompositions are bus stops, and these are the first stops.

Then, for any opset ``S`` of that flavour, an op reaches ``S`` when it is in
``S``, or it has a decomposition and every direct child reaches ``S`` (the
least fixpoint, computed with one counter per op; the HTML page runs the same
algorithm in JavaScript). An op without a sample, or whose decomposition
raised on every sample, is *undetermined*, with the reason: never guessed.

Building the graph takes minutes (it runs every OpInfo sample, and meta
kernels can crash the process on guessed arguments, so ops are analysed in
forked workers); it is cached under ``~/.cache/eagerdecomp`` keyed by the
torch version, the sources of eagerdecomp and the decomposition tables.

Example::

    >>> import eagerdecomp.coverage as cov
    >>> graph = cov.load_graph()                       # doctest: +SKIP
    >>> report = cov.analyse(graph, "core_aten")       # doctest: +SKIP
    >>> report.row("aten.silu.default").leaves         # doctest: +SKIP
    ['aten.exp.default', 'aten.add.Tensor', ...]
    >>> print(report.summary())                        # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections import defaultdict, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .errors import EagerDecompError
from .opset import OpSet, _all_overloads

__all__ = [
    "Node",
    "Graph",
    "Row",
    "Coverage",
    "build_graph",
    "load_graph",
    "save_graph",
    "cache_path",
    "analyse",
    "verify",
    "flavour_of",
    "STATUSES",
]

# What the analysis can say about one op under one opset.
STATUSES = {
    "in opset": "the backend runs it",
    "reaches": "decomposes, recursively, into opset ops only",
    "no path": "some op on every route has no decomposition (the blocking op)",
    "undetermined": "an op on the way could not be lowered on any sample input (see its reason)",
}

# What the graph says about one op, independently of the opset.
NODE_KINDS = ("decomposes", "no decomposition", "declined", "undetermined", "infrastructure")


@dataclass
class Node:
    """One op's entry in the one-level graph of one flavour."""

    kind: str
    children: list = field(default_factory=list)  # direct children (names), when kind == "decomposes"
    via: str = ""  # what decomposes it: a table entry's qualified name, a CompositeImplicitAutograd kernel...
    reason: str = ""  # why it is not "decomposes"
    samples: int = 0  # samples lowered successfully
    notes: list = field(default_factory=list)  # samples that declined or failed, when others succeeded


def name(op) -> str:
    """``aten.add.Tensor``: the name form used in graphs, reports and the page."""
    return str(op)


def flavour_of(opset: OpSet) -> str:
    """``"prims"`` when ``opset`` holds a prims op (tables then prefer ``torch._refs``), else ``"aten"``."""
    return "prims" if any(op.namespace == "prims" for op in opset.ops) else "aten"


def _tables() -> dict:
    """The default table of each flavour, before any opset op is dropped from it."""
    import torch._prims  # noqa: F401

    from .table import default_table

    # NOTE: default_table drops opset ops from the table; an empty aten opset and a one-op
    # prims opset (no prims op is a table key) select a flavour and drop nothing.
    return {"aten": default_table(OpSet([], name="aten")), "prims": default_table(OpSet(["prims::add"], name="prims"))}


def universe() -> list:
    import torch._prims  # noqa: F401

    return _all_overloads("aten") + _all_overloads("prims")


# -- one level of one op -------------------------------------------------------------------------

class _AllBut:
    """The opset seen while finding ``op``'s direct children: everything but ``op`` itself
    (an op that re-enters itself with other arguments is lowered again, as the runtime would)."""

    def __init__(self, op):
        self.op = op

    def __contains__(self, other) -> bool:
        return other != self.op


def _via(op, table) -> str:
    from .lower import _IDENTITY, is_infrastructure

    if is_infrastructure(op):
        return "infrastructure"
    if op in _IDENTITY:
        return "returns its argument"
    if torch.Tag.inplace_view in op.tags:
        return "in-place view: functional view + as_strided_"
    fn = table.get(op)
    if fn is not None:
        inner = getattr(fn, "func", fn)  # functools.partial (in-place/out= variants)
        return f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__qualname__', type(inner).__name__)}"
    if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
        return "CompositeImplicitAutograd kernel"
    return ""


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:160] if text else ''}"


def one_level(op, samples, table) -> tuple:
    """``(Node, calls)``: ``op``'s direct children on ``samples``, and the calls it made of
    them (``{child: [(args, kwargs)]}``, a few per child: samples for the children)."""
    from torch.utils._pytree import tree_map

    from .coverage_inputs import _signature, quiet, snapshot
    from .lower import Lowerer, Stuck, is_infrastructure

    via = _via(op, table)
    if via == "infrastructure":
        return Node("infrastructure", via=via), {}
    if via == "returns its argument":
        return Node("decomposes", via=via), {}
    if not via:
        return Node("no decomposition", reason="no table entry and no CompositeImplicitAutograd kernel"), {}
    if not samples:
        return Node("undetermined", via=via, reason="no sample input"), {}
    children: set = set()
    calls: dict = {}
    ok, declined, failed = 0, [], []
    for s in samples:
        seen: set = set()

        def emit(func, args, kwargs, seen=seen):
            if not is_infrastructure(func):
                seen.add(func)
                made = calls.setdefault(func, {})
                if len(made) < CALLS_PER_CHILD:
                    try:
                        made.setdefault(_signature(args, kwargs), tree_map(snapshot, (tuple(args), dict(kwargs))))
                    except Exception:  # noqa: BLE001 - an unusable layout: no sample, no harm
                        pass
            return func(*args, **kwargs)

        try:
            args, kwargs = tree_map(snapshot, (s.args, s.kwargs))
            with quiet(), torch.random.fork_rng():
                Lowerer(_AllBut(op), table, emit).lower(op, args, kwargs)
        except Stuck as e:
            declined.append(e.reason)
            continue
        except RecursionError:
            declined.append("decomposition recursed past Python's limit")
            continue
        except Exception as e:  # noqa: BLE001 - reported, with the error, never guessed around
            failed.append(f"{s.source} sample: {_first_line(e)}")
            continue
        ok += 1
        children |= seen
    if ok:
        notes = [f"declined a sample: {r}" for r in dict.fromkeys(declined)] + failed[:2]
        node = Node("decomposes", sorted(map(name, children)), via, samples=ok, notes=notes)
    elif declined:
        node = Node("declined", via=via, reason=declined[0])
    else:
        node = Node("undetermined", via=via, reason="its decomposition raised on every sample input: " + failed[0])
    return node, {func: list(made.values()) for func, made in calls.items()}


# calls kept per child and analysis, and rounds of analysing ops again on calls their callers made
CALLS_PER_CHILD = 2
MAX_ROUNDS = 6


# -- crash-guarded workers ------------------------------------------------------------------------

def _guarded_map(fn, items: list, workers: int, progress=None) -> dict:
    """``{item: fn(item)}``, computed in forked workers; an item whose call kills its worker
    maps to ``None`` and the rest of that worker's share goes on in a fresh fork."""
    results: dict = {}
    pending = list(items)
    total = len(items)
    while pending:
        shares = [pending[i::workers] for i in range(workers)]
        running = []
        for share in filter(None, shares):
            fd, path = tempfile.mkstemp(prefix="eagerdecomp-cov-")
            os.close(fd)
            pid = os.fork()
            if pid == 0:  # the worker: one record before and one after each item
                code = 0
                try:
                    with open(path, "ab", buffering=0) as out:
                        for i, item in enumerate(share):
                            out.write(pickle.dumps(("start", i)))
                            try:
                                result = fn(item)
                            except Exception as e:  # noqa: BLE001
                                result = e
                            out.write(pickle.dumps(("done", i, result)))
                except BaseException:  # noqa: BLE001
                    code = 1
                finally:
                    os._exit(code)
            running.append((pid, path, share))
        pending = []
        for pid, path, share in running:
            os.waitpid(pid, 0)
            started, done = -1, set()
            with open(path, "rb") as f:
                while True:
                    try:
                        record = pickle.load(f)
                    except EOFError:
                        break
                    except Exception:  # noqa: BLE001 - a record cut short by the crash
                        break
                    if record[0] == "start":
                        started = record[1]
                    else:
                        done.add(record[1])
                        results[share[record[1]]] = record[2]
            os.unlink(path)
            if started >= 0 and started not in done:
                results[share[started]] = None  # it took the worker down
            pending += [item for i, item in enumerate(share) if i > started and i not in done]
            if progress:
                progress(f"analysed {len(results)}/{total} ops")
    return results


# -- building the graph (in a fresh process: see _serve) -------------------------------------------

def _analyse_op(op, pool, tables) -> tuple:
    from .coverage_inputs import samples_for

    needs_samples = any(_via(op, t) not in ("", "infrastructure", "returns its argument") for t in tables.values())
    samples, why_none = samples_for(op, pool) if needs_samples else ([], None)
    nodes, calls = {}, {}
    for flavour, table in tables.items():
        node, found = one_level(op, samples, table)
        if node.kind == "undetermined" and not samples and why_none:
            node.reason = f"no sample input: {why_none}"
        nodes[flavour] = asdict(node)
        for child, made in found.items():
            calls.setdefault(name(child), []).extend(made)
    return nodes, calls


def _build(ops: list, opinfo_names, workers: int, progress) -> dict:
    from .coverage_inputs import Pool

    torch.set_num_threads(1)  # forked workers must not inherit an OpenMP pool
    tables = _tables()
    t0 = time.perf_counter()
    pool = Pool.from_opinfo(ops, names=opinfo_names)
    progress(f"ran OpInfo samples: {len(pool.by_op)} ops called ({time.perf_counter() - t0:.0f} s)")
    graph = {flavour: {} for flavour in tables}
    todo = list(ops)
    for _ in range(MAX_ROUNDS):
        results = _guarded_map(lambda op: _analyse_op(op, pool, tables), todo, workers, progress)
        fresh: dict = {}
        for op, result in results.items():
            if result is None or isinstance(result, Exception):
                why = "the op's kernel crashed the process on a sample input" if result is None else _first_line(result)
                for flavour in graph:
                    graph[flavour][name(op)] = asdict(Node("undetermined", via=_via(op, tables[flavour]), reason=why))
                continue
            nodes, calls = result
            for flavour, node in nodes.items():
                graph[flavour][name(op)] = node
            # NOTE: a decomposition can call a child with arguments the child's own samples
            # never had (a broadcast, a dtype) and so take another branch in the child's
            # decomposition: the calls callers really made become samples of the child, and
            # ops that got new ones are analysed again, until none does.
            for child_name, made in calls.items():
                child = _resolve(child_name)
                for args, kwargs in made if child is not None else ():
                    if pool.add_recorded(child, args, kwargs):
                        fresh[child_name] = child
        todo = list(fresh.values())
        if not todo:
            break
        progress(f"{len(todo)} ops again, on calls their callers made")
    else:
        progress(f"stopped after {MAX_ROUNDS} rounds; {len(todo)} ops had calls from callers not analysed")
    return graph


def _resolve(op_name: str):
    from .opset import _op_from_name

    return _op_from_name(op_name)


def _serve() -> None:
    """Entry point of the building process: job JSON in argv[1], graph JSON to argv[2]."""
    job = json.loads(sys.argv[1])
    # NOTE: thousands of ops on odd inputs print C++ deprecation warnings straight to fd 2;
    # progress goes to a copy of it, the rest to /dev/null
    err = os.fdopen(os.dup(2), "w")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)

    def progress(msg):
        print(f"[eagerdecomp coverage] {msg}", file=err, flush=True)

    if job.get("ops") is None:
        ops = universe()
    else:
        ops = [o for n in job["ops"] for o in _resolve_all(n)]
    if job["kind"] == "graph":
        out = _build(ops, job.get("opinfo_names"), job.get("workers", 2), progress)
    else:
        out = _verify(ops, job["opsets"], job.get("opinfo_names"), job.get("workers", 2), progress)
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


def _resolve_all(op_name):
    from .opset import resolve_op

    return resolve_op(op_name)


def _run_job(job: dict, quiet: bool = False) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        proc = subprocess.run(
            [sys.executable, "-c", "from eagerdecomp.coverage import _serve; _serve()", json.dumps(job), out],
            env=env,
            stderr=subprocess.PIPE if quiet else None,
            text=True,
        )
        if proc.returncode != 0 or not os.path.exists(out):
            tail = (proc.stderr or "")[-2000:] if quiet else "(see the output above)"
            raise EagerDecompError(f"building the coverage graph failed (exit code {proc.returncode}): {tail}")
        with open(out) as f:
            return json.load(f)


# the modules whose code decides the graph: a change to any of them rebuilds it
# (of this module, only the functions that build it: the analysis can change freely)
_GRAPH_SOURCES = ("coverage_inputs.py", "lower.py", "table.py", "decomps.py", "variants.py", "opset.py")


def _graph_code() -> tuple:
    return (_AllBut, _via, one_level, _guarded_map, _analyse_op, _build, CALLS_PER_CHILD, MAX_ROUNDS)


def _fingerprint(tables: dict) -> str:
    import inspect

    h = hashlib.sha256(torch.__version__.encode())
    here = Path(__file__).parent
    for path in _GRAPH_SOURCES:
        h.update(path.encode() + (here / path).read_bytes())
    for part in _graph_code():
        h.update((inspect.getsource(part) if callable(part) else repr(part)).encode())
    for flavour, table in sorted(tables.items()):
        h.update(flavour.encode())
        for op in sorted(table, key=str):
            h.update(f"{op}={_via(op, table)}".encode())
    return h.hexdigest()[:16]


def cache_dir() -> Path:
    return Path(os.environ.get("EAGERDECOMP_CACHE_DIR") or Path.home() / ".cache" / "eagerdecomp")


def build_graph(ops=None, opinfo_names=None, workers: int = 2, quiet: bool = False) -> "Graph":
    """Build the one-level graph (minutes for every op; ``ops``/``opinfo_names`` narrow it).

    Ops met as children of ``ops`` are analysed too, so the graph is closed.
    """
    job = {"kind": "graph", "ops": None if ops is None else [name(o) if not isinstance(o, str) else o for o in ops],
           "opinfo_names": sorted(opinfo_names) if opinfo_names is not None else None, "workers": workers}
    t0 = time.perf_counter()
    flavours = _run_job(job, quiet)
    return Graph(flavours, build_seconds=time.perf_counter() - t0)


def load_graph(rebuild: bool = False, quiet: bool = False) -> "Graph":
    """The full graph, from the disk cache or built (and cached) when missing or stale."""
    path = cache_path()
    if path.exists() and not rebuild:
        with open(path) as f:
            data = json.load(f)
        return Graph(data["flavours"], build_seconds=data.get("build_seconds"), path=str(path))
    graph = build_graph(quiet=quiet)
    save_graph(graph, path)
    for stale in path.parent.glob(f"coverage-torch{torch.__version__}-*.json"):
        if stale != path:  # built for older sources of eagerdecomp
            stale.unlink(missing_ok=True)
    return graph


def cache_path() -> Path:
    """Where :func:`load_graph` keeps the graph for this torch and these sources."""
    return cache_dir() / f"coverage-torch{torch.__version__}-{_fingerprint(_tables())}.json"


def save_graph(graph: "Graph", path=None) -> None:
    """Write ``graph`` where :func:`load_graph` finds it (or to ``path``)."""
    path = Path(path or cache_path())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump({"flavours": graph.flavours, "build_seconds": graph.build_seconds}, f)
    os.replace(tmp, path)
    graph.path = str(path)


# -- the analysis, for one opset -----------------------------------------------------------------

class Graph:
    """``flavours[flavour][op name] -> Node dict``: the one-level graphs."""

    def __init__(self, flavours: dict, build_seconds=None, path=None):
        self.flavours = flavours
        self.build_seconds = build_seconds
        self.path = path

    def nodes(self, flavour: str) -> dict:
        return self.flavours[flavour]

    def aten_ops(self) -> list:
        return sorted(n for n in self.flavours["aten"] if n.startswith("aten."))


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
            f"{self.opset.name or 'custom opset'} ({len(self.opset)} ops, {self.flavour} tables): {total} aten overloads: "
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
                    leaves = ", ".join(o.removeprefix("aten.") for o in r.leaves) or "(no op: computes nothing a backend runs)"
                    some = f"  [some inputs fail in: {', '.join(r.caveats)}]" if r.caveats else ""
                    lines.append(f"  {r.op:{width}}  depth {r.depth}  -> {leaves}{some}")
                else:
                    via = " -> ".join(r.chain[1:]) if len(r.chain) > 1 else "itself"
                    lines.append(f"  {r.op:{width}}  blocked by {via}: {r.reason}")
        return "\n".join(lines)


def analyse(graph: Graph, opset) -> Coverage:
    """Verdicts for every aten overload under ``opset`` (a preset name, an OpSet or ops)."""
    return Coverage(graph, OpSet.coerce(opset))


# -- checking the graph against real lowering ------------------------------------------------------

def _verify_op(op, pool, opset, table) -> dict:
    from torch.utils._pytree import tree_map

    from .coverage_inputs import quiet, samples_for, snapshot
    from .lower import Lowerer, Stuck, is_infrastructure

    samples, _ = samples_for(op, pool)
    leaves, ok, stuck, failed = set(), 0, [], []
    for s in samples:
        def emit(func, args, kwargs):
            if not is_infrastructure(func):
                leaves.add(name(func))
            return func(*args, **kwargs)

        try:
            args, kwargs = tree_map(snapshot, (s.args, s.kwargs))
            with quiet(), torch.random.fork_rng():
                Lowerer(opset, table, emit).lower(op, args, kwargs) if op not in opset else emit(op, args, kwargs)
            ok += 1
        except Stuck as e:
            stuck.append(" -> ".join(map(name, e.chain)) + ": " + e.reason)
        except Exception as e:  # noqa: BLE001
            failed.append(_first_line(e))
    return {"samples": len(samples), "ok": ok, "stuck": stuck, "failed": failed, "leaves": sorted(leaves)}


def _verify(ops, opsets, opinfo_names, workers, progress) -> list:
    from .coverage_inputs import Pool
    from .table import default_table

    torch.set_num_threads(1)
    pool = Pool.from_opinfo(ops, names=opinfo_names)
    out = []
    for spec in opsets:
        opset = OpSet.coerce(spec)
        table = default_table(opset)
        results = _guarded_map(lambda op: _verify_op(op, pool, opset, table), ops, workers, progress)
        out.append({name(op): (r if isinstance(r, dict) else None) for op, r in results.items()})
    return out


def verify(opsets, ops, opinfo_names=None, workers: int = 2, quiet: bool = True) -> list:
    """Lower ``ops`` on their own samples for real under each opset of ``opsets`` (preset names,
    OpSets or lists of ops): the check of :func:`analyse`. One dict per opset,
    ``{op: {"samples", "ok", "stuck", "failed", "leaves"}}`` (None where lowering crashed)."""
    specs = [o if isinstance(o, str) else [n if isinstance(n, str) else name(n) for n in OpSet.coerce(o).ops] for o in opsets]
    job = {"kind": "verify", "opsets": specs, "ops": [o if isinstance(o, str) else name(o) for o in ops],
           "opinfo_names": sorted(opinfo_names) if opinfo_names is not None else None, "workers": workers}
    return _run_job(job, quiet)
