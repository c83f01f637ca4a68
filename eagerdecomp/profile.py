"""Profile a real program under :class:`~eagerdecomp.EagerDecompMode`: which ops it hit,
which were decomposed and into what, which had no path, and where the time went.

Every call that reaches the mode is timed and put under one route:

``passthrough``  an opset op, run as it is;
``replay``       a cache hit: a traced kernel replayed;
``tracing``      a cache miss: the decomposition traced into a kernel (plus its first run);
``direct``       a key not hot yet: its decomposition run on the real tensors, no kernel made
                 (the first calls of each key; ``EAGERDECOMP_TRACE_AFTER``, runtime/tiers.py);
``eager``        a bypass (a remembered one too): decomposed on the real tensors, call after call;
``fallthrough``  no path to the opset: the op's own kernel ran (``on_unsupported="fallthrough"``);
``cpu fallback`` no path on an accelerator: the CPU tier ran it (``on_unsupported="cpu"``); the time
                 it spent copying each way is ``Profile.copy_s``;

and the routes of ops outside ATen compute (``communication``, ``custom op``,
``custom kernel``). The route is the one the runtime recorded for the call.

The time outside the mode (Python, autograd, the framework) is the rest of the wall
time. Timing is done by a subclass of the mode used only here, so the ordinary mode
pays nothing for it. Hits are served by the Python hit path in a profile (a C++ hit
records no route per call), so ``replay`` times that path, not ``csrc/hit.cpp``'s.

Example::

    >>> import torch, eagerdecomp as ed
    >>> from eagerdecomp.profile import profile
    >>> p = profile(torch.nn.functional.silu, torch.randn(64))
    >>> p.calls["direct"]  # a key's first calls run direct; it is traced once hot
    1
    >>> print(p)  # doctest: +SKIP
"""

from __future__ import annotations

import runpy
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from eagerdecomp.mode import EagerDecompMode
from eagerdecomp.runtime.stats import Report, Route, Stats

__all__ = ["profile", "profile_script", "Profile", "ROUTES"]

# The profile's name for each recorded route (eagerdecomp.stats.Route), in display order.
_NAMES = {
    Route.PASSTHROUGH: "passthrough",
    Route.REPLAY: "replay",
    Route.TRACE: "tracing",
    Route.DIRECT: "direct",
    Route.EAGER: "eager",
    Route.FALLTHROUGH: "fallthrough",
    Route.UNSUPPORTED: "unsupported",
    Route.COMPOSITE: "composite",
    Route.COMMUNICATION: "communication",
    Route.CUSTOM_OP: "custom op",
    Route.CUSTOM_KERNEL: "custom kernel",
    Route.CPU_FALLBACK: "cpu fallback",
}
ROUTES = tuple(_NAMES.values())


class _LastRoute(Stats):
    """Stats that also remember the route of the call just recorded, for the timer."""

    def record(self, op, route, reason=None, cache=None) -> None:
        super().record(op, route, reason, cache)
        self.last = route

    def passthrough(self, op) -> None:
        super().passthrough(op)
        self.last = Route.PASSTHROUGH


class _TimedMode(EagerDecompMode):
    """EagerDecompMode that times each call and files it under the route the runtime recorded."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.runtime.stats = _LastRoute()
        self._passed = {}  # every call goes to the runtime, whose pass-through route records it
        # NOTE: every call is filed under the route Python records for it, so hits are served by
        # the Python hit path here (a C++ hit records nothing per call); a profile times that path
        self.runtime.hits = None
        self.seconds: dict = defaultdict(float)  # (op, route) -> s
        self.counts: Counter = Counter()  # (op, route) -> calls

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        stats = self.runtime.stats
        stats.last = None
        t0 = time.perf_counter()
        try:
            return super().__torch_dispatch__(func, types, args, kwargs)
        finally:
            dt = time.perf_counter() - t0
            route = _NAMES.get(stats.last, "unsupported")  # None: it raised before recording
            self.seconds[func, route] += dt
            self.counts[func, route] += 1


@dataclass
class Profile:
    """What :func:`profile` saw. ``report`` is the mode's per-op :class:`Report`."""

    report: Report
    opset: str
    wall: float  # seconds, the whole call
    seconds: dict = field(default_factory=dict)  # route -> seconds inside the mode
    calls: Counter = field(default_factory=Counter)  # route -> calls
    by_op: dict = field(default_factory=dict)  # op name -> {route: (calls, seconds)}
    result: object = None  # what the profiled function returned
    copy_s: float = 0.0  # of the "cpu fallback" time: seconds spent copying to the host and back

    @property
    def outside(self) -> float:
        """Seconds spent outside the mode (Python, autograd, framework code)."""
        return max(self.wall - sum(self.seconds.values()), 0.0)

    def to_dict(self) -> dict:
        return {
            "opset": self.opset,
            "wall_s": self.wall,
            "outside_s": self.outside,
            "copy_s": self.copy_s,
            "routes": {r: {"calls": self.calls[r], "seconds": self.seconds.get(r, 0.0)} for r in ROUTES},
            "ops": [
                {
                    "op": row.op,
                    "route": row.route,
                    "calls": row.calls,
                    "into": row.into,
                    "time": {r: {"calls": c, "seconds": s} for r, (c, s) in self.by_op.get(row.op, {}).items()},
                }
                for row in self.report.rows
            ],
        }

    def __str__(self) -> str:
        lines = [f"eagerdecomp profile, opset {self.opset}: {self.wall * 1e3:.1f} ms wall"]
        lines.append(f"  {'route':12} {'calls':>8} {'ms':>10} {'share':>7}")
        for r in ROUTES:
            s = self.seconds.get(r, 0.0)
            lines.append(
                f"  {r:12} {self.calls[r]:>8} {s * 1e3:>10.2f} {100 * s / self.wall if self.wall else 0:>6.1f}%"
            )
        if self.copy_s:  # (part of the cpu fallback row above)
            lines.append(f"  {'  copying':12} {'':>8} {self.copy_s * 1e3:>10.2f}  of cpu fallback")
        lines.append(
            f"  {'outside':12} {'':>8} {self.outside * 1e3:>10.2f} "
            f"{100 * self.outside / self.wall if self.wall else 0:>6.1f}%"
        )
        routes = Counter(r.route for r in self.report.rows)
        lines.append(
            f"ops hit: {len(self.report.rows)} ({routes['passthrough']} passed through, "
            f"{routes['decomposed']} decomposed, "
            f"{routes['bypassed']} decomposed eagerly, {routes['unsupported']} without a path)"
        )
        decomposed = [r for r in self.report.rows if r.route in ("decomposed", "bypassed")]
        if decomposed:
            lines.append("decomposed, into:")
            for r in decomposed:
                into = ", ".join(o.removeprefix("aten.") for o in r.into)
                lines.append(
                    f"  {r.op} x{r.calls} -> {into or ('(decomposed eagerly)' if r.route == 'bypassed' else '(no op)')}"
                )
        unsupported = self.report.by_route("unsupported")
        if unsupported:
            lines.append("no path to the opset (ran natively; implement these or register decompositions):")
            lines += [f"  {r.op} x{r.calls}" for r in unsupported]
        slow = sorted(((sum(s for _, s in t.values()), op) for op, t in self.by_op.items()), reverse=True)[:10]
        lines.append("most time:")
        for _, op in slow:
            detail = ", ".join(f"{r} {c}x {sec * 1e3:.2f} ms" for r, (c, sec) in self.by_op[op].items())
            lines.append(f"  {op}: {detail}")
        return "\n".join(lines)


def profile(fn, *args, opset="core_aten", on_unsupported="fallthrough", **kwargs) -> Profile:
    """Run ``fn(*args, **kwargs)`` under the mode for ``opset`` and return a :class:`Profile`.

    Ops with no path to the opset run natively (``on_unsupported="fallthrough"``) so
    the whole program runs and every such op is listed, not just the first; on an
    accelerator, ``on_unsupported="cpu"`` runs them on the CPU tier and times its copies.
    """
    mode = _TimedMode(opset, on_unsupported=on_unsupported)
    t0 = time.perf_counter()
    with mode:
        result = fn(*args, **kwargs)
    wall = time.perf_counter() - t0
    seconds: dict = defaultdict(float)
    calls: Counter = Counter()
    by_op: dict = defaultdict(dict)
    for (op, route), s in mode.seconds.items():
        n = mode.counts[op, route]
        seconds[route] += s
        calls[route] += n
        by_op[str(op)][route] = (n, s)
    name = mode.opset.name or f"custom ({len(mode.opset)} ops)"
    copy_s = sum(s for _, _, s in mode.runtime.stats.traffic().values())
    return Profile(mode.report(), name, wall, dict(seconds), calls, dict(by_op), result, copy_s)


def profile_script(path: str, argv=(), opset="core_aten") -> Profile:
    """Run the Python script at ``path`` (as ``__main__``, with ``sys.argv = [path, *argv]``) under :func:`profile`."""
    saved = sys.argv
    sys.argv = [path, *argv]
    try:
        return profile(runpy.run_path, path, run_name="__main__", opset=opset)
    finally:
        sys.argv = saved
