"""The one-level decomposition graph that :mod:`eagerdecomp.coverage` analyses.

One graph per table flavour (aten-based tables for aten opsets, refs-based ones
when the opset holds prims; see :func:`eagerdecomp.table.default_table`): for
every op, the ops its decomposition calls *directly* when none of them is
lowered further. It is found by lowering the op on concrete sample inputs
(:mod:`eagerdecomp.coverage.inputs`) with the project's own
:class:`~eagerdecomp.runtime.lower.Lowerer`, told that every op but this one is served:
decompositions are bus stops, and these are the first stops. An op without a
sample, or whose decomposition raised on every sample, is *undetermined*, with
the reason: never guessed.

Building takes minutes (every OpInfo sample runs, and meta kernels can crash the
process on guessed arguments, so ops are analysed in forked workers of a fresh
process: :mod:`eagerdecomp.coverage.workers`), so the package ships the graph built
for the torch it was released with (:data:`SHIPPED`, written by ``make coverage-graph``).
Every graph carries a :func:`fingerprint` of the torch build, the code that builds it
and the decomposition tables; one whose fingerprint differs from this process's is
never used. When the shipped graph does not match (another torch, edited
decompositions), :func:`load_graph` builds the graph once, with a progress bar, and
caches it under ``cache_dir("coverage")`` (:mod:`eagerdecomp.paths`).

Example::

    >>> from eagerdecomp.coverage.graph import load_graph
    >>> graph = load_graph()                                   # doctest: +SKIP
    >>> graph.nodes("aten")["aten.silu.default"]["children"]   # doctest: +SKIP
    ['aten.mul.Tensor', 'aten.sigmoid.default']
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from eagerdecomp.coverage.workers import ProgressBar, run_job
from eagerdecomp.ops.opset import OpSet
from eagerdecomp.ops.schema import op_from_name, overloads
from eagerdecomp.runtime.paths import cache_dir

__all__ = [
    "Node",
    "Graph",
    "NODE_KINDS",
    "one_level",
    "build_graph",
    "load_graph",
    "save_graph",
    "cache_path",
    "fingerprint",
    "read_shipped",
    "write_shipped",
    "SHIPPED",
    "verify",
    "flavour_of",
    "name",
]

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

    from eagerdecomp.decompositions.table import default_table

    # NOTE: default_table drops opset ops from the table; an empty aten opset and a one-op
    # prims opset (no prims op is a table key) select a flavour and drop nothing.
    return {"aten": default_table(OpSet([], name="aten")), "prims": default_table(OpSet(["prims::add"], name="prims"))}


def universe() -> list:
    import torch._prims  # noqa: F401

    return list(overloads("aten") + overloads("prims"))


# -- one level of one op -------------------------------------------------------------------------


class _AllBut:
    """The opset seen while finding ``op``'s direct children: everything but ``op`` itself
    (an op that re-enters itself with other arguments is lowered again, as the runtime would)."""

    def __init__(self, op):
        self.op = op

    def __contains__(self, other) -> bool:
        return other != self.op


def _via(op, table) -> str:
    from eagerdecomp.runtime.lower import IDENTITY_OPS, is_infrastructure

    if is_infrastructure(op):
        return "infrastructure"
    if op in IDENTITY_OPS:
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

    from eagerdecomp.coverage.inputs import _signature, quiet, snapshot
    from eagerdecomp.runtime.lower import Lowerer, Stuck, is_infrastructure

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


# -- building the graph (in a fresh process: see _serve) -------------------------------------------


def _analyse_op(op, pool, tables) -> tuple:
    from eagerdecomp.coverage.inputs import samples_for

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
    from eagerdecomp.coverage.inputs import Pool
    from eagerdecomp.coverage.workers import guarded_map

    torch.set_num_threads(1)  # forked workers must not inherit an OpenMP pool
    tables = _tables()
    t0 = time.perf_counter()
    progress(f"{len(ops)} ops: loading PyTorch's OpInfo database, then running its samples")
    pool = Pool.from_opinfo(ops, names=opinfo_names, bar=getattr(progress, "bar", None))
    progress(f"ran OpInfo samples: {len(pool.by_op)} ops called ({time.perf_counter() - t0:.0f} s)")
    graph = {flavour: {} for flavour in tables}
    todo = list(ops)
    for _ in range(MAX_ROUNDS):
        results = guarded_map(lambda op: _analyse_op(op, pool, tables), todo, workers, progress)
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
    return op_from_name(op_name)


def _serve() -> None:
    """Entry point of the building process: job JSON in argv[1], graph JSON to argv[2]."""
    job = json.loads(sys.argv[1])
    # NOTE: thousands of ops on odd inputs print C++ deprecation warnings straight to fd 2;
    # progress goes to a copy of it, the rest to /dev/null
    err = os.fdopen(os.dup(2), "w")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)

    def progress(msg):
        bar.interrupt()  # a message ends the bar's line; the bar redraws below it
        print(f"[eagerdecomp coverage] {msg}", file=err, flush=True)

    bar = ProgressBar(err, "analysing ops", prefix="[eagerdecomp coverage] ")
    progress.bar = bar  # guarded_map draws the count of ops analysed on it

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
    from eagerdecomp.ops.opset import resolve_op

    return resolve_op(op_name)


# the modules whose code decides the graph: a change to any of them rebuilds it (with the
# project's family modules, table.FAMILY_MODULES)
_GRAPH_SOURCES = (
    "coverage/graph.py",
    "coverage/inputs.py",
    "coverage/workers.py",
    "runtime/lower.py",
    "runtime/routes.py",
    "decompositions/registry.py",
    "decompositions/table.py",
    "ops/variants.py",
    "ops/opset.py",
    "ops/schema.py",
    "ops/overlap.py",
)


def fingerprint() -> str:
    """What decides the graph: the torch build (version, commit, CUDA/HIP) and the sources
    of :data:`_GRAPH_SOURCES` and the decomposition family modules.

    A graph is used only where its fingerprint equals this one: a graph built for other
    code or another torch would answer for ops it never analysed, so it is rebuilt instead.

    NOTE: read from the files, not from the tables built in this process: building both
    flavours' tables costs seconds, which every cached answer would pay, and the graph is
    built in a fresh process where this process's own registrations do not exist anyway.
    """
    from eagerdecomp.decompositions.table import FAMILY_MODULES

    # NOTE: two builds with one version string can differ (a source build at another
    # commit, a CUDA build's extra ops): the commit and the accelerator are part of it
    build = f"{torch.__version__}|{torch.version.git_version}|{torch.version.cuda}|{torch.version.hip}|{FORMAT}"
    h = hashlib.sha256(build.encode())
    here = Path(__file__).parent.parent  # the package: sources are named from there
    for path in _GRAPH_SOURCES + tuple(f"decompositions/{m}.py" for m in FAMILY_MODULES):
        # NOTE: a missing file is an error, not a skip: a moved module would otherwise drop
        # out of the fingerprint silently, and a stale graph would answer for new code
        h.update(path.encode() + (here / path).read_bytes())
    return h.hexdigest()[:16]


# the layout of the graph files; a change rebuilds every graph (it is part of the fingerprint)
FORMAT = "eagerdecomp coverage graph 2"

# the graph the package ships: built by `make coverage-graph` (write_shipped) for the torch
# pinned in the Makefile, gzip'd JSON (the plain JSON is ~10x larger)
SHIPPED = Path(__file__).parent / "data" / "graph.json.gz"


def build_graph(ops=None, opinfo_names=None, workers: int = 2, quiet: bool = False) -> Graph:
    """Build the one-level graph (minutes for every op; ``ops``/``opinfo_names`` narrow it).

    Ops met as children of ``ops`` are analysed too, so the graph is closed.
    """
    job = {
        "kind": "graph",
        "ops": None if ops is None else [name(o) if not isinstance(o, str) else o for o in ops],
        "opinfo_names": sorted(opinfo_names) if opinfo_names is not None else None,
        "workers": workers,
    }
    t0 = time.perf_counter()
    flavours = run_job(job, quiet)
    return Graph(flavours, build_seconds=time.perf_counter() - t0)


def load_graph(rebuild: bool = False, quiet: bool = False) -> Graph:
    """The full graph for this torch and these sources.

    In order: the disk cache (a graph this machine built), the graph the package ships
    (:data:`SHIPPED`) when its fingerprint is this process's, else built (minutes, with a
    progress bar on stderr unless ``quiet``) and cached. ``rebuild=True`` builds it anyway.
    :attr:`Graph.source` says which (``"cache"``, ``"shipped"``, ``"built"``).
    """
    path = cache_path()
    if not rebuild:
        if path.exists():
            with open(path) as f:
                data = json.load(f)
            # NOTE: the file's name carries the fingerprint; the one inside guards a copied
            # or renamed file (files of the first format have none: their name is the check)
            if data.get("fingerprint", fingerprint()) == fingerprint():
                return Graph(data["flavours"], build_seconds=data.get("build_seconds"), path=str(path), source="cache")
        shipped, why = read_shipped()
        if shipped is not None:
            return shipped
    else:
        why = "asked to rebuild it"
    if not quiet:
        print(
            f"eagerdecomp: building the coverage graph for torch {torch.__version__} ({why}); "
            f"minutes, once: it is cached in {path.parent}",
            file=sys.stderr,
            flush=True,
        )
    graph = build_graph(quiet=quiet)
    save_graph(graph, path)
    graph.source = "built"
    for stale in path.parent.glob(f"coverage-torch{torch.__version__}-*.json"):
        if stale != path:  # built for older sources of eagerdecomp
            stale.unlink(missing_ok=True)
    return graph


def cache_path() -> Path:
    """Where :func:`load_graph` keeps the graph for this torch and these sources."""
    return cache_dir("coverage") / f"coverage-torch{torch.__version__}-{fingerprint()}.json"


def save_graph(graph: Graph, path=None) -> None:
    """Write ``graph`` where :func:`load_graph` finds it (or to ``path``)."""
    path = Path(path or cache_path())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump({"fingerprint": fingerprint(), "flavours": graph.flavours, "build_seconds": graph.build_seconds}, f)
    os.replace(tmp, path)
    graph.path = str(path)


def read_shipped(path=None) -> tuple:
    """``(graph, None)`` from the shipped file when its fingerprint is this process's, else
    ``(None, why not)``: a stale graph is never used."""
    path = Path(path or SHIPPED)
    if not path.exists():
        return None, f"the package ships no graph at {path}"
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    if data.get("fingerprint") != fingerprint():
        return None, (
            f"the shipped graph is for torch {data.get('torch', '?')} and other sources "
            f"(fingerprint {data.get('fingerprint')}, here {fingerprint()})"
            if data.get("torch") == torch.__version__
            else f"the shipped graph is for torch {data.get('torch', '?')}"
        )
    return Graph(data["flavours"], build_seconds=data.get("build_seconds"), path=str(path), source="shipped"), None


def write_shipped(graph: Graph, path=None) -> Path:
    """Write ``graph`` as the file the package ships (:data:`SHIPPED` by default), stamped
    with this process's :func:`fingerprint`. The bytes depend only on the graph and the
    fingerprint (sorted keys, no timestamp), so rebuilding an unchanged graph changes no byte."""
    path = Path(path or SHIPPED)
    data = {
        "format": FORMAT,
        "fingerprint": fingerprint(),
        "torch": torch.__version__,
        "torch_git": torch.version.git_version,
        "flavours": graph.flavours,
    }
    raw = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    tmp = path.with_suffix(".tmp")
    # NOTE: mtime=0 and no file name in the header: the same graph gives the same bytes
    with open(tmp, "wb") as out, gzip.GzipFile(filename="", mode="wb", fileobj=out, compresslevel=9, mtime=0) as z:
        z.write(raw)
    os.replace(tmp, path)
    return path


class Graph:
    """``flavours[flavour][op name] -> Node dict``: the one-level graphs."""

    def __init__(self, flavours: dict, build_seconds=None, path=None, source=None):
        self.flavours = flavours
        self.build_seconds = build_seconds
        self.path = path
        self.source = source  # where load_graph found it: "cache", "shipped" or "built"

    def nodes(self, flavour: str) -> dict:
        return self.flavours[flavour]

    def aten_ops(self) -> list:
        return sorted(n for n in self.flavours["aten"] if n.startswith("aten."))


# -- checking the graph against real lowering ------------------------------------------------------


def _verify_op(op, pool, opset, table) -> dict:
    from torch.utils._pytree import tree_map

    from eagerdecomp.coverage.inputs import quiet, samples_for, snapshot
    from eagerdecomp.runtime.lower import Lowerer, Stuck, is_infrastructure

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
    from eagerdecomp.coverage.inputs import Pool
    from eagerdecomp.coverage.workers import guarded_map
    from eagerdecomp.decompositions.table import default_table

    torch.set_num_threads(1)
    pool = Pool.from_opinfo(ops, names=opinfo_names)
    out = []
    for spec in opsets:
        opset = OpSet.coerce(spec)
        table = default_table(opset)
        results = guarded_map(lambda op: _verify_op(op, pool, opset, table), ops, workers, progress)
        out.append({name(op): (r if isinstance(r, dict) else None) for op, r in results.items()})
    return out


def verify(opsets, ops, opinfo_names=None, workers: int = 2, quiet: bool = True) -> list:
    """Lower ``ops`` on their own samples for real under each opset of ``opsets`` (preset names,
    OpSets or lists of ops): the check of :func:`analyse`. One dict per opset,
    ``{op: {"samples", "ok", "stuck", "failed", "leaves"}}`` (None where lowering crashed)."""
    specs = [
        o if isinstance(o, str) else [n if isinstance(n, str) else name(n) for n in OpSet.coerce(o).ops] for o in opsets
    ]
    job = {
        "kind": "verify",
        "opsets": specs,
        "ops": [o if isinstance(o, str) else name(o) for o in ops],
        "opinfo_names": sorted(opinfo_names) if opinfo_names is not None else None,
        "workers": workers,
    }
    return run_job(job, quiet)
