"""Selection of the conformance suite and collection of its results.

``EAGERDECOMP_CONFORMANCE=full`` (what ``make conformance`` sets) runs every
OpInfo of ``op_db`` at every supported dtype among :data:`DTYPES`, on every
sample, and writes ``reports/conformance.md`` and ``.json``. Without it,
``make test`` runs the fast slice (:func:`fast_slice`): every OpInfo, at one
dtype each, on its first samples, which keeps every op's path honest within
CI's budget. ``EAGERDECOMP_CONFORMANCE_SAMPLES=N`` caps a full run at N samples
per OpInfo and dtype (the summary says so). ``EAGERDECOMP_CONFORMANCE_SHARD=i/n`` runs
the i-th of n disjoint parts of the selection (``make conformance SHARD=i/n``) and writes
its rows to ``reports/shards/PART/`` (``EAGERDECOMP_CONFORMANCE_PART``, else the test
files' names); ``make conformance-merge`` writes the one summary from
all n parts, so a full run can be spread over machines or sessions. Under pytest-xdist (``-n N``; ``make
conformance`` passes ``-n $(JOBS)``) each worker hands its rows to the controller,
which writes the one summary.
"""

from __future__ import annotations

import dataclasses
import os
import time
import zlib

import pytest
import torch

FULL = os.environ.get("EAGERDECOMP_CONFORMANCE", "").lower() == "full"
# a full run may cap the samples per (OpInfo, dtype) to fit a time budget; 0 means every sample
MAX_SAMPLES = int(os.environ.get("EAGERDECOMP_CONFORMANCE_SAMPLES", "0")) or None
DTYPES = (torch.float32, torch.float64, torch.int64, torch.bool, torch.bfloat16)
FAST_SAMPLES = 1  # samples per (OpInfo, dtype) in the fast slice (make conformance: every one)


def _shard(spec: str):
    if not spec:
        return None
    i, _, n = spec.partition("/")
    i, n = int(i), int(n)
    if not 1 <= i <= n:
        raise ValueError(f"EAGERDECOMP_CONFORMANCE_SHARD={spec!r}: expected i/n with 1 <= i <= n")
    return i, n


SHARD = _shard(os.environ.get("EAGERDECOMP_CONFORMANCE_SHARD", ""))


def in_shard(test_id: str) -> bool:
    """Whether a test id falls in this run's shard (a stable hash, so parts never overlap)."""
    return SHARD is None or zlib.crc32(test_id.encode()) % SHARD[1] == SHARD[0] - 1


# Where the fast slice takes its one dtype from, in order of preference: float64 first,
# so differentiable ops also check their gradients; a stable ~1/6 of ops run at another
# dtype (chosen by a hash of the name) so the slice keeps every dtype family in play.
_FAST_ORDER = (torch.float64, torch.float32, torch.int64, torch.bool, torch.bfloat16)


def _op_db():
    from torch.testing._internal.common_methods_invocations import op_db

    return op_db


def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def supported(opinfo) -> list:
    ds = opinfo.supported_dtypes("cpu")
    return [d for d in DTYPES if d in ds]


def fast_slice(opinfo, dtypes: list) -> list:
    """The fast slice's dtypes for one OpInfo (at most two)."""
    if not dtypes:
        return []
    first = next(d for d in _FAST_ORDER if d in dtypes)
    h = zlib.crc32(opinfo.full_name.encode())
    others = [d for d in dtypes if d is not first]
    if others and h % 6 == 0:
        return [first, others[(h // 6) % len(others)]]
    return [first]


def params() -> list:
    out = []
    for opinfo in _op_db():
        dtypes = supported(opinfo)
        for dtype in dtypes if FULL else fast_slice(opinfo, dtypes):
            test_id = f"{opinfo.full_name}-{dtype_name(dtype)}"
            if in_shard(test_id):
                out.append(pytest.param(opinfo, dtype, id=test_id))
    return out


class Results:
    """Every sample's outcome, for the summary written at the end of a full run."""

    def __init__(self):
        from .summary import checkout_commit

        self.rows: list = []  # (op name, dtype name, sample index, Outcome, expected reason or None)
        self.started = time.time()
        # the code a run tests is the code it imported at its start: a checkout that moves on
        # during a long run (the next shard's fixes) must not name the run's results
        self.commit = checkout_commit(os.path.dirname(__file__))

    def add(self, name, dtype, index, outcome, expected):
        self.rows.append((name, dtype, index, outcome, expected))


_RESULTS = Results()


@pytest.fixture(scope="session")
def results():
    return _RESULTS


# NOTE: the mode answers a key's first calls direct and traces the key once it is hot
# (eagerdecomp/runtime/tiers.py). A sample is one call, so left alone the suite would check the
# direct tier only, never a traced kernel (fake tensors, the meta's layouts, a replay): an FFT
# prim whose kernel returned another layout than its meta was wrong on replay alone. A full run
# traces every key at its first call (the steady state); the fast slice traces one OpInfo in
# four (a stable hash of its name) and runs the rest direct: both tiers in make test. (Tracing
# costs: this file and test_preset.py took 2 min 48 s all direct and 4 min 34 s with every
# other OpInfo traced, -n 2 on a machine busy with two other jobs.)
# EAGERDECOMP_TRACE_AFTER, where set, wins.
@pytest.fixture(autouse=True)
def tier(request, monkeypatch):
    callspec = getattr(request.node, "callspec", None)
    opinfo = callspec.params.get("opinfo") if callspec else None
    if opinfo is None or "EAGERDECOMP_TRACE_AFTER" in os.environ:
        return
    if FULL or zlib.crc32(opinfo.full_name.encode()) % 4 == 0:
        monkeypatch.setenv("EAGERDECOMP_TRACE_AFTER", "0")


_ROWS_KEY = "eagerdecomp_conformance_rows"


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    # xdist controller: a worker finished; take its rows (plain data over execnet)
    from .harness import Outcome

    for name, dtype, index, outcome, why in getattr(node, "workeroutput", {}).get(_ROWS_KEY, ()):
        _RESULTS.add(name, dtype, index, Outcome(**outcome), why)


def pytest_sessionfinish(session, exitstatus):
    worker = getattr(session.config, "workeroutput", None)
    if worker is not None:  # an xdist worker: the controller writes the summary
        worker[_ROWS_KEY] = [(n, d, i, dataclasses.asdict(o), w) for n, d, i, o, w in _RESULTS.rows]
        return
    # a run narrowed with -k, -m, a test id or --lf is not the suite: it writes no summary over the last real one;
    # nor does --collect-only, whose empty shard make conformance-resume would take for a finished one
    opt = session.config.option
    narrowed = (
        opt.keyword
        or opt.markexpr
        or opt.collectonly
        or getattr(opt, "lf", False)
        or any("::" in a for a in session.config.args)
    )
    if narrowed:
        return
    from .harness import reports_dir
    from .summary import write_shard, write_summary

    reports = reports_dir(os.path.join(str(session.config.rootpath), "reports"))
    if SHARD is not None:  # (a shard of the cross-sample tests alone has no rows: its failures count)
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        failed = [r.nodeid for r in (reporter.stats.get("failed", []) if reporter else [])]
        files = sorted({os.path.basename(item.fspath).removesuffix(".py") for item in session.items})
        part = os.environ.get("EAGERDECOMP_CONFORMANCE_PART") or "+".join(files) or "none"
        write_shard(_RESULTS, reports, SHARD, failed, int(exitstatus), full=FULL, part=part)
    elif _RESULTS.rows:
        write_summary(_RESULTS, reports, full=FULL)
