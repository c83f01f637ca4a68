"""What a runtime did, per op: one record per call, and the report made from them.

Every call is recorded once, at the site that decided its route, as
``(op, route, reason, cache)``: ``route`` a :class:`Route`, ``reason`` why (a
bypass's reason, "floats lifted"...), ``cache`` whether a cache entry answered
it (``"hit"``), one was made for it (``"miss"``) or none was consulted (None).
The report and :func:`eagerdecomp.profile` read these records; nothing infers a
route from which counter moved.

Records are counted per thread (each thread writes only its own shard), so
concurrent callers never lose an update and the hot path takes no lock;
reading the report sums the shards.
"""

from __future__ import annotations

import enum
import itertools
import threading
from collections import Counter
from dataclasses import dataclass, field

from eagerdecomp.decompositions.rng import EAGER_STREAM, STREAM_DIFFERS
from eagerdecomp.ops.variants import functional_variant

__all__ = ["Stats", "Route", "Report", "OpRow", "LIFTED", "FAMILY", "DISK", "COMPILED"]

LIFTED = "floats lifted"  # the reason of a replay whose float arguments were kernel inputs
FAMILY = "shape family"  # the reason of a replay of a shape-generic kernel for a new exact key
DISK = "loaded from disk"  # the reason of a replay of a kernel the persistent cache held (eagerdecomp.disk)
COMPILED = "compiled"  # the reason of a hit answered by a compiled kernel (eagerdecomp.compiled)
CPP_HIT = "C++"  # the reason of a hit served by the C++ hit path (eagerdecomp.runtime.hits)
CPP_HIT_LIFTED = "C++, floats lifted"  # the same, for a kernel with lifted float inputs


class Route(str, enum.Enum):
    """Where a call went. A ``str`` so reports and JSON show the plain name."""

    PASSTHROUGH = "passthrough"  # an opset op, run as it is
    REPLAY = "replay"  # a traced kernel replayed (cache hit)
    TRACE = "trace"  # traced into a kernel, then run (cache miss)
    DIRECT = "direct"  # a key not hot yet: decomposed on the real tensors, checked as a trace (runtime.tiers)
    EAGER = "eager"  # decomposed on the real tensors: no replayable kernel (reason says why)
    UNSUPPORTED = "unsupported"  # no path to the opset: raised
    FALLTHROUGH = "fallthrough"  # no path to the opset: the op's own kernel ran (on_unsupported=)
    COMPOSITE = "composite"  # device switch: no path, so PyTorch's composite kernel ran
    COMMUNICATION = "communication"  # a collective: passed through to the process group
    CUSTOM_OP = "custom op"  # a custom op whose Python implementation ran under eagerdecomp
    CUSTOM_KERNEL = "custom kernel"  # a custom op's opaque kernel: passed through
    CPU_FALLBACK = "cpu fallback"  # no path to the opset: the CPU's kernel ran on host copies

    def __str__(self) -> str:
        return self.value


_ROUTED = (Route.COMMUNICATION, Route.CUSTOM_OP, Route.CUSTOM_KERNEL)


class Stats:
    """Per-thread call records of one runtime, plus what its kernels run."""

    def __init__(self):
        self._tls = threading.local()
        self._shards: list = []
        self._passed: dict = {}  # op -> itertools.count of its pass-through calls
        self._lock = threading.Lock()  # shard list and kernel facts; never on the per-call path
        self.leaf_ops: dict = {}  # op -> set of opset ops its kernels call
        self.fixups: dict = {}  # op -> set of output fix-ups its kernels apply
        self.random = set()  # ops whose kernels draw random numbers
        self.by_value = set()  # ops whose float arguments had to be keyed by value
        self.exact_only: dict = {}  # op -> reasons some of its calls keep exact-shape kernels
        self.unproven: dict = {}  # op -> why some of its shape families check each new key
        self.compile_s: dict = {}  # op -> seconds spent compiling its kernels
        self.uncompiled: dict = {}  # op -> reasons some of its kernels stay on replay
        self.python_only: dict = {}  # op -> reasons some of its keys have no C++ program
        self.host: dict = {}  # op -> [blocking op, bytes to host, bytes back, seconds copying] (the CPU tier)
        self.hits = None  # the runtime's C++ hit counts (eagerdecomp.runtime.hits)
        self.kernels_of = None  # op -> cached kernels: what an op served only in C++ runs
        self.key_passed = None  # the mode key's C++ state: its pass-through counts (runtime.keymode)
        self.paths: Counter = Counter()  # mode entries per path ("C++ key", "Python: <why>")

    def record(self, op, route: Route, reason: str | None = None, cache: str | None = None) -> None:
        """Count one call of ``op`` under ``route`` (the one place a call's route is recorded)."""
        try:
            shard = self._tls.shard
        except AttributeError:
            shard = self._tls.shard = Counter()
            with self._lock:
                self._shards.append(shard)
        shard[op, route, reason, cache] += 1

    def pass_counters(self, ops) -> dict:
        """``{op: itertools.count}`` for ``ops``: the mode's pass-through test and count in one
        lookup (``next()`` on a count is one C call, atomic under the GIL, so no per-thread dict)."""
        with self._lock:
            for op in ops:
                if op not in self._passed:
                    self._passed[op] = itertools.count()
        return self._passed

    def passthrough(self, op) -> None:
        """``record(op, Route.PASSTHROUGH)``, the hot path's own (see :meth:`pass_counters`)."""
        c = self._passed.get(op)
        if c is None:
            # NOTE: not added to the counters: the mode reads them as its opset test, so an op
            # passed through for another reason (infrastructure) must not join them
            self.record(op, Route.PASSTHROUGH)
        else:
            next(c)

    def counts(self) -> Counter:
        """``(op, route, reason, cache) -> calls``, summed over threads."""
        total: Counter = Counter()
        with self._lock:
            shards = list(self._shards)
            passed = list(self._passed.items())
        for shard in shards:
            total.update(shard.copy())
        for op, c in passed:
            n = c.__reduce__()[1][0]  # the count's next value: calls so far
            if n:
                total[op, Route.PASSTHROUGH, None, None] += n
        if self.key_passed is not None:  # opset ops the mode's C++ key passed through
            for op, n in self.key_passed.passed():
                total[op, Route.PASSTHROUGH, None, None] += n
        if self.hits is not None:  # hits served in C++, counted there (exact: atomics)
            # kind: 1 floats lifted, 2 compiled, 4 the CPU tier (csrc/hit.cpp)
            for op, kind, n, *_ in self.hits.counts():
                if kind & 4:
                    total[op, Route.CPU_FALLBACK, self.host.get(op, (None,))[0], "hit"] += n
                else:
                    reason = COMPILED if kind & 2 else CPP_HIT_LIFTED if kind & 1 else CPP_HIT
                    total[op, Route.REPLAY, reason, "hit"] += n
        return total

    def copied(self, op, blocking: str, to_host: int, to_device: int, seconds: float) -> None:
        """Note what a call of ``op`` on the CPU tier copied, and the op that blocked its path."""
        with self._lock:
            row = self.host.setdefault(op, [blocking, 0, 0, 0.0])
            row[1] += to_host
            row[2] += to_device
            row[3] += seconds

    def traffic(self) -> dict:
        """``op -> (bytes to host, bytes back, seconds copying)`` of the CPU tier, C++ calls included."""
        with self._lock:
            out = {op: row[1:] for op, row in self.host.items()}
        if self.hits is not None:
            for op, kind, _, to_host, to_device, seconds in self.hits.counts():
                if kind & 4:
                    h, d, s = out.get(op, (0, 0, 0.0))
                    out[op] = [h + to_host, d + to_device, s + seconds]
        return {op: tuple(v) for op, v in out.items()}

    def ops(self, route: Route) -> set:
        """The ops with at least one call recorded under ``route``."""
        return {op for (op, r, _, _) in self.counts() if r is route}

    def record_kernel(self, kernel) -> None:
        """Note what ``kernel`` runs (on each trace, and on the first hit of an op)."""
        with self._lock:
            self.leaf_ops.setdefault(kernel.op, set()).update(kernel.leaf_ops)
            self.fixups.setdefault(kernel.op, set()).update(kernel.fixups)
            if kernel.random:
                self.random.add(kernel.op)

    def record_ops(self, op, ran) -> None:
        """Note the opset ops a direct run of ``op`` called (:mod:`eagerdecomp.runtime.direct`)."""
        with self._lock:
            self.leaf_ops.setdefault(op, set()).update(ran)
            if any(_seeded(o) for o in ran):
                self.random.add(op)

    def exact_shapes(self, op, reason: str) -> None:
        """Note that a call of ``op`` was kept to an exact-shape kernel, and why."""
        reasons = self.exact_only.get(op)
        if reasons is None or reason not in reasons:
            with self._lock:
                self.exact_only.setdefault(op, set()).add(reason)

    def compiled(self, op, seconds: float) -> None:
        """Note that a kernel of ``op`` was compiled, in ``seconds``."""
        with self._lock:
            self.compile_s[op] = self.compile_s.get(op, 0.0) + seconds

    def not_compiled(self, op, reason: str) -> None:
        """Note that a kernel of ``op`` stays on replay under ``compile=``, and why."""
        with self._lock:
            self.uncompiled.setdefault(op, set()).add(reason)

    def per_key_checks(self, op, reason: str) -> None:
        """Note that a shape family of ``op`` is not proved: its new exact keys run eager's meta kernel."""
        reasons = self.unproven.get(op)
        if reasons is None or reason not in reasons:
            with self._lock:
                self.unproven.setdefault(op, set()).add(reason)

    def python_replay(self, op, reason: str) -> None:
        """Note that a key of ``op`` has no C++ program (stays on Python replay), and why."""
        reasons = self.python_only.get(op)
        if reasons is None or reason not in reasons:
            with self._lock:
                self.python_only.setdefault(op, set()).add(reason)

    def keyed_by_value(self, op) -> None:
        with self._lock:
            self.by_value.add(op)

    def clear(self) -> None:
        with self._lock:
            for shard in self._shards:
                shard.clear()
            for op in self._passed:  # in place: modes hold this dict
                self._passed[op] = itertools.count()
            self.leaf_ops, self.fixups, self.random, self.by_value = {}, {}, set(), set()
            self.exact_only, self.compile_s, self.uncompiled, self.python_only = {}, {}, {}, {}
            self.unproven = {}
            self.host = {}
        if self.hits is not None:
            self.hits.clear_counts()
        if self.key_passed is not None:
            self.key_passed.clear_passed()
        self.paths.clear()

    def report(self) -> Report:
        rows: dict = {}
        counts = self.counts()
        if self.kernels_of is not None:
            # NOTE: an op another runtime installed is served in C++ from this runtime's first
            # call, so Python never saw its kernel here: read what it runs from the cache
            for op in {k[0] for k in counts if k[2] in (CPP_HIT, CPP_HIT_LIFTED)} - self.leaf_ops.keys():
                for kernel in self.kernels_of(op):
                    self.record_kernel(kernel)
        for (op, route, reason, cache), n in counts.items():
            row = rows.get(op)
            if row is None:
                row = rows[op] = OpRow(op=str(op))
            row.add(route, reason, cache, n)
        for op, (to_host, to_device, seconds) in self.traffic().items():
            if op in rows:
                rows[op].to_host, rows[op].to_device, rows[op].copy_s = to_host, to_device, seconds
        for op, row in rows.items():
            row.into = sorted(str(o) for o in self.leaf_ops.get(op, ()))
            row.fixups = sorted(self.fixups.get(op, ()))
            # NOTE: a call decomposed on the bypass path (an explicit generator) has no kernel to read
            row.random = op in self.random or (row.route == "bypassed" and _seeded(op))
            if row.random:
                row.stream_differs, row.eager_stream = _stream(op)
            row.by_value = op in self.by_value
            row.exact_shapes = sorted(self.exact_only.get(op, ()))
            row.per_key_checks = sorted(self.unproven.get(op, ()))
            row.compile_s = self.compile_s.get(op, 0.0)
            row.not_compiled = sorted(self.uncompiled.get(op, ()))
            row.python_replay = sorted(self.python_only.get(op, ()))
        return Report([rows[op] for op in sorted(rows, key=str)], dict(self.paths))


def _seeded(op) -> bool:
    return any(t.name == "nondeterministic_seeded" for t in getattr(op, "tags", ()))


def _stream(op) -> tuple:
    """``(where its draws differ from eager's, or None; whether they are eager's)`` for a random op,
    read through its functional op (``random_`` is ``random``'s)."""
    functional = functional_variant(op) or op
    for candidate in (op, functional):
        if candidate in STREAM_DIFFERS:
            return STREAM_DIFFERS[candidate], False
    return None, op in EAGER_STREAM or functional in EAGER_STREAM


@dataclass
class OpRow:
    """One op's calls. ``hits`` are kernel replays; ``remembered`` calls answered by a
    negative cache entry (a remembered bypass or refusal), whose reasons are in ``negative``
    together with the miss that made the entry; ``bypassed`` counts calls that were never
    keyed (by reason)."""

    op: str
    passthrough: int = 0
    hits: int = 0
    remembered: int = 0
    misses: int = 0
    traces: int = 0
    direct: int = 0  # calls of keys not hot yet, decomposed directly (eagerdecomp.runtime.tiers)
    bypassed: dict = field(default_factory=dict)
    negative: dict = field(default_factory=dict)
    unsupported: int = 0
    fallthrough: int = 0
    composite: int = 0  # device switch: no path, PyTorch's composite kernel ran
    calls: int = 0
    routed: dict = field(default_factory=dict)  # route name -> calls (communication, custom op, custom kernel)
    into: list = field(default_factory=list)
    fixups: list = field(default_factory=list)
    random: bool = False  # its kernels draw random numbers
    stream_differs: str | None = None  # where its draws differ from eager's under the same seed, and why
    eager_stream: bool = False  # its draws are eager's (decompositions/rng.py EAGER_STREAM)
    lifted: bool = False
    by_value: bool = False
    family: int = 0  # hits answered by a shape-generic kernel for a new exact key
    loaded: int = 0  # hits answered by a kernel loaded from the persistent cache
    exact_shapes: list = field(default_factory=list)  # why some calls kept exact-shape kernels
    per_key_checks: list = field(default_factory=list)  # why a shape family is not proved (see family.py)
    compiled: int = 0  # hits answered by a compiled kernel (compile=)
    compile_s: float = 0.0  # seconds spent compiling this op's kernels
    not_compiled: list = field(default_factory=list)  # why some of its kernels stay on replay (compile=)
    cpp_hits: int = 0  # hits served by the C++ hit path (lifted ones included)
    python_replay: list = field(default_factory=list)  # why some of its keys have no C++ program
    on_cpu: int = 0  # calls run by the CPU tier (eagerdecomp.runtime.host)
    blocked_by: str | None = None  # the CPU tier's reason: the op that blocked the path, and why
    to_host: int = 0  # bytes the CPU tier copied to the host ...
    to_device: int = 0  # ... and back to the device
    copy_s: float = 0.0  # seconds it spent copying

    def add(self, route: Route, reason, cache, n: int) -> None:
        """Fold ``n`` records of one ``(route, reason, cache)`` into the row."""
        self.calls += n
        if cache == "miss" and reason != FAMILY and reason != DISK:  # an entry made without a trace
            self.misses += n
        elif cache == "hit" and route is not Route.REPLAY:
            self.remembered += n
        if route is Route.REPLAY:
            self.hits += n
            self.lifted = self.lifted or reason == LIFTED or reason == CPP_HIT_LIFTED
            self.family += n if reason == FAMILY else 0
            self.loaded += n if reason == DISK else 0
            self.compiled += n if reason == COMPILED else 0
            self.cpp_hits += n if reason == CPP_HIT or reason == CPP_HIT_LIFTED else 0
        elif route is Route.TRACE:
            self.traces += n
        elif route is Route.DIRECT:
            self.direct += n
        elif route is Route.PASSTHROUGH:
            self.passthrough += n
        elif route is Route.COMPOSITE:
            self.composite += n
        elif route is Route.CPU_FALLBACK:
            self.on_cpu += n
            self.blocked_by = reason or self.blocked_by
        elif route in _ROUTED:
            self.routed[route.value] = self.routed.get(route.value, 0) + n
        else:  # EAGER, UNSUPPORTED, FALLTHROUGH: a reason says why
            self.unsupported += n if route is not Route.EAGER else 0
            self.fallthrough += n if route is Route.FALLTHROUGH else 0
            if reason is not None:
                into = self.negative if cache else self.bypassed
                into[reason] = into.get(reason, 0) + n

    @property
    def route(self) -> str:
        if self.unsupported:
            return "unsupported"
        if self.on_cpu:
            return Route.CPU_FALLBACK.value
        if self.bypassed or self.negative:
            return "bypassed"
        if self.hits or self.misses or self.direct:
            return "decomposed"
        if self.composite:
            return Route.COMPOSITE.value
        if self.routed:
            return max(self.routed, key=self.routed.get)
        return "passthrough"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


@dataclass
class Report:
    """What a mode did, per op. ``str(report)`` is a table; fields are public."""

    rows: list
    paths: dict = field(default_factory=dict)  # mode entries per path: "C++ key", "Python: <why>"

    def by_route(self, route: str) -> list:
        return [r for r in self.rows if r.route == route]

    @property
    def decomposed(self) -> list:
        return self.by_route("decomposed")

    def row(self, op) -> OpRow | None:
        return next((r for r in self.rows if r.op == str(op)), None)

    def __str__(self) -> str:
        width = max([48] + [len(r.op) for r in self.rows])
        head = f"{'op':{width}} {'route':14} {'calls':>7} {'hits':>6} {'miss':>5} {'trace':>5} {'direct':>6}  notes"
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
            notes += [f"exact shapes: {why}" for why in r.exact_shapes]
            notes += [f"checked per shape: {why}" for why in r.per_key_checks]
            if r.compiled:
                notes.append(f"compiled x{r.compiled} ({r.compile_s:.2f} s to compile)")
            notes += [f"not compiled: {why}" for why in r.not_compiled]
            notes += [f"python replay: {why}" for why in r.python_replay]
            if r.fallthrough:
                notes.append(f"ran natively x{r.fallthrough}")
            if r.on_cpu:
                notes.append(
                    f"on the CPU x{r.on_cpu} (blocked at {r.blocked_by}): {_size(r.to_host)} to the host, "
                    f"{_size(r.to_device)} back, {r.copy_s * 1e3:.2f} ms copying"
                )
            if r.stream_differs:
                notes.append(f"random stream differs from eager: {r.stream_differs}")
            elif r.eager_stream:
                notes.append("draws eager's random numbers")
            elif r.random:
                notes.append("draws random numbers (stream not checked against eager's)")
            lines.append(
                f"{r.op:{width}} {r.route:14} {calls:>7} {r.hits:>6} {r.misses:>5} {r.traces:>5} {r.direct:>6}  "
                + "; ".join(notes)
            )
        routes = ["passthrough", "decomposed", "bypassed", "unsupported"]
        routes += sorted({r.route for r in self.rows} - set(routes))  # collectives, custom ops
        counts = {k: len(self.by_route(k)) for k in routes}
        lines.append(", ".join(f"{v} {k}" for k, v in counts.items()) + " ops")
        if self.paths:
            lines.append("entered on: " + ", ".join(f"{k} x{v}" for k, v in sorted(self.paths.items())))
        return "\n".join(lines)
