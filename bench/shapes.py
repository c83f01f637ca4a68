"""Programs whose shapes change every step: dynamic padding and KV-cache generation.

    python bench/shapes.py [--rounds N] [--profile] [--device cuda]

1. **Dynamic-padding training**: a 2-layer BERT (transformers, random weights, built from a
   config offline) trained with AdamW on 12 batches whose sequence length changes every step.
   Each round runs, from a cold kernel cache: the 12 steps at 12 lengths, and the same 12 steps
   at one length, under ``EagerDecompMode("core_aten")``; then both on the reference device
   edref with ``eagerdecomp.enable`` (cold too); native CPU steps are interleaved with each.
   Reported: medians over rounds of the 12-step totals, their ratios, and the kernels traced
   (the most any decomposed op traced over the 12 lengths).
2. **KV-cache generation**: greedy ``generate()`` of 48 tokens with a tiny Llama (random
   weights): the first call from a cold cache and the second, native vs the mode vs edref;
   kernels traced after the first decoding step's shapes.
3. ``--profile``: where a cold first step's time goes (cumulative seconds of the tracing
   parts, cProfile) and the per-kernel trace cost.
4. **Unseen lengths, side by side** (``unseen``): after warm-up, each round trains the BERT one
   step at a length it has never met, then again at that length (warm), and natively at it.
5. **generate() with a new prompt length** (``prompt``): each round, greedy ``generate()`` with a
   prompt length whose KV lengths no earlier call met, then the same call again (seen), and natively.
6. **Cold processes** (``cold``): the first BERT training step, the first ``generate()`` and the
   demo's first step, each in a fresh process: native; the mode with no disk cache; the mode with
   a kernel bundle (``python -m eagerdecomp cache build``, built at the start of the run from
   ``eagerdecomp/workloads.py``'s workloads, whose BERT lengths and prompts are none of these).

``--sections`` picks which run (default all); ``--json PATH`` writes the tables of 4-6 for
``bench/render.py`` (docs/performance.md).

The in-memory kernel cache is cleared before every cold run and the persistent one is off
(``EAGERDECOMP_DISK_CACHE=0``), so every cold run traces. Sections 4 and 5 run with it on, as
by default, in a fresh folder: a new shape pays what the disk costs it.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

os.environ.setdefault("EAGERDECOMP_DISK_CACHE", "0")

import torch  # noqa: E402
from results import Table, add_json_flag, save  # noqa: E402

import eagerdecomp as ed  # noqa: E402
from eagerdecomp import workloads  # noqa: E402

LENGTHS = [13, 27, 9, 31, 18, 22, 16, 29, 11, 24, 20, 35]
BATCH = workloads.BATCH
VOCAB = workloads.VOCAB
NEW_TOKENS = 48
DEVICE = "cpu"  # --device: where the models and batches live (native and the mode alike)
SECTIONS = ("padding", "generation", "demo", "unseen", "prompt", "cold")


def _sync():
    if DEVICE != "cpu":
        torch.accelerator.synchronize()


def _bert():
    return workloads.bert().to(DEVICE)  # the model the bundle's workload trains (one definition)


def _llama():
    return workloads.llama().to(DEVICE)


def _batches(lengths, device=None):
    return workloads.bert_batches(lengths, device or DEVICE)


_step = workloads.bert_step


def _traced(report) -> dict:
    return {r.op: r.traces for r in report.rows if r.traces}


def _run_steps(model, batches, ctx, native_model=None, native_batches=None):
    """Total seconds of the steps under ``ctx``; native steps interleaved (their total too)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    nopt = torch.optim.AdamW(native_model.parameters(), lr=1e-3) if native_model is not None else None
    total = native = 0.0
    steps = []
    for i, b in enumerate(batches):
        if native_model is not None:
            _sync()
            t0 = time.perf_counter()
            _step(native_model, nopt, native_batches[i])
            _sync()
            native += time.perf_counter() - t0
        with ctx():
            _sync()
            t0 = time.perf_counter()
            _step(model, opt, b)
            _sync()
            steps.append(time.perf_counter() - t0)
            total += steps[-1]
    _run_steps.last = steps
    return total, native


class _Mode:
    def __init__(self):
        self.mode = None

    def __call__(self):
        self.mode = self.mode or ed.EagerDecompMode("core_aten")
        return self.mode


def padding(rounds: int, dev) -> dict:
    base = _bert()
    res = {k: [] for k in ("native", "mode dyn", "mode one", "edref dyn", "edref one")}
    traced = {}
    for _ in range(rounds):
        for lengths, tag in ((LENGTHS, "dyn"), ([LENGTHS[0]] * len(LENGTHS), "one")):
            ed.cache_clear()
            ctx = _Mode()
            ours, theirs = copy.deepcopy(base), copy.deepcopy(base)
            mode_t, nat_t = _run_steps(ours, _batches(lengths), ctx, theirs, _batches(lengths))
            res[f"mode {tag}"].append(mode_t)
            res.setdefault(f"mode {tag} later", []).append(sum(_run_steps.last[1:]))
            diff = max((a - b).abs().max().item() for a, b in zip(ours.parameters(), theirs.parameters()))
            res.setdefault("param diff", []).append(diff)
            if tag == "dyn":
                res["native"].append(nat_t)
                traced = _traced(ctx.mode.report())
            else:
                traced_one = _traced(ctx.mode.report())
            if dev is not None:
                ed.cache_clear()
                model = copy.deepcopy(base).to(dev)
                b = ed.enable(dev)
                try:
                    t, _ = _run_steps(model, _batches(lengths, dev), _nullctx)
                finally:
                    ed.disable(dev)
                res[f"edref {tag}"].append(t)
                if tag == "dyn":
                    res["edref traced"] = _traced(b.report())
    diffs = res.pop("param diff")
    return {
        "times": {k: statistics.median(v) for k, v in res.items() if v and k != "edref traced"},
        "diff": max(diffs),
        "traced": traced,
        "traced one": traced_one,
        "edref traced": res.get("edref traced", {}),
    }


class _disk_on:
    """The persistent cache on, as by default, over a temporary folder, for the duration (a new
    shape then pays what the disk costs it: a lookup, a write)."""

    def __enter__(self):
        import tempfile

        self.tmp = tempfile.TemporaryDirectory()
        self.old = {k: os.environ.get(k) for k in ("EAGERDECOMP_CACHE_DIR", "EAGERDECOMP_DISK_CACHE")}
        os.environ.update(EAGERDECOMP_CACHE_DIR=self.tmp.name, EAGERDECOMP_DISK_CACHE="1")
        return self

    def __exit__(self, *exc):
        for k, v in self.old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self.tmp.cleanup()
        return False


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def generation(rounds: int, dev) -> dict:
    from transformers import LogitsProcessor, LogitsProcessorList

    model = _llama()
    ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    out: dict = {k: [] for k in ("native 1st", "native 2nd", "mode 1st", "mode 2nd", "edref 1st", "edref 2nd")}
    after_first = []

    class Marks(LogitsProcessor):
        """Notes the kernels traced so far at each decoding step (its forward has run)."""

        def __init__(self, report):
            self.report, self.marks = report, []

        def __call__(self, input_ids, scores):
            self.marks.append(sum(r.traces for r in self.report().rows))
            return scores

    def gen(m, x, procs=None):
        _sync()
        t0 = time.perf_counter()
        y = m.generate(x, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, logits_processor=procs)
        _sync()
        return time.perf_counter() - t0, y

    for _ in range(rounds):
        for k in ("1st", "2nd"):
            out[f"native {k}"].append(gen(model, ids)[0])
        ed.cache_clear()
        with ed.EagerDecompMode("core_aten") as mode:
            marks = Marks(mode.report)
            t1, y1 = gen(model, ids, LogitsProcessorList([marks]))
            t2, y2 = gen(model, ids)
        out["mode 1st"].append(t1)
        out["mode 2nd"].append(t2)
        # NOTE: marks[0] is after the prefill, marks[1] after the first decoding step
        after_first.append(marks.marks[-1] - marks.marks[1])
        ref = model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
        assert torch.equal(y1, ref) and torch.equal(y2, ref), "generate() under the mode differs from native"
        total = sum(r.traces for r in mode.report().rows)
        out.setdefault("disk 1st", []), out.setdefault("disk 2nd", [])
        with _disk_on():
            ed.cache_clear()
            with ed.EagerDecompMode("core_aten"):
                gen(model, ids)  # writes the kernels
            ed.cache_clear()  # memory only: the next first call reads them from disk
            with ed.EagerDecompMode("core_aten"):
                out["disk 1st"].append(gen(model, ids)[0])
                out["disk 2nd"].append(gen(model, ids)[0])
        if dev is not None:
            ed.cache_clear()
            dmodel = copy.deepcopy(model).to(dev)
            ed.enable(dev)
            try:
                for k in ("1st", "2nd"):
                    out[f"edref {k}"].append(gen(dmodel, ids.to(dev))[0])
            finally:
                ed.disable(dev)
    return {
        "times": {k: statistics.median(v) for k, v in out.items() if v},
        "after_first": max(after_first),
        "traced": total,
    }


DEMO_CHILD = """
import contextlib, os, statistics, time, torch, warnings
warnings.simplefilter("ignore")
torch.set_num_threads(1)
import eagerdecomp as ed
from eagerdecomp.demo import TransformerBlock, train_step
torch.manual_seed(0)
model = TransformerBlock()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = TransformerBlock.batch()
times = []
native = os.environ.get("DEMO_NATIVE") == "1"
with contextlib.nullcontext() if native else ed.EagerDecompMode("core_aten") as mode:
    for _ in range(6):
        t0 = time.perf_counter()
        train_step(model, opt, x, y)
        times.append(time.perf_counter() - t0)
rows = [] if native else mode.report().rows
print(times[0], statistics.median(times[1:]), sum(r.traces for r in rows), sum(r.loaded for r in rows),
      ed.cache_info().preloaded)
"""


def demo_processes(rounds: int = 3) -> dict:
    """The demo's TransformerBlock in fresh processes sharing a new disk cache: one that fills
    it, then ``rounds`` pairs of a warm process and a native one (no mode), alternating.
    Each run is ``(first step s, steady step s, kernels traced, loaded, programs preloaded)``."""
    import subprocess
    import sys
    import tempfile

    def child(env):
        r = subprocess.run([sys.executable, "-c", DEMO_CHILD], env=env, capture_output=True, text=True, timeout=900)
        if r.returncode:
            raise RuntimeError(r.stderr[-2000:])
        first, steady, traced, loaded, preloaded = r.stdout.split()
        return float(first), float(steady), int(traced), int(loaded), int(preloaded)

    out = {"cold": None, "warm": [], "native": []}
    with tempfile.TemporaryDirectory() as root:
        env = dict(os.environ, EAGERDECOMP_CACHE_DIR=root, EAGERDECOMP_DISK_CACHE="1")
        out["cold"] = child(env)
        for _ in range(rounds):
            out["warm"].append(child(env))
            out["native"].append(child(dict(env, DEMO_NATIVE="1")))
    return out


def profile_first_step() -> None:
    """Where the cold first step of the dynamic-padding run spends its time."""
    import cProfile
    import pstats

    from eagerdecomp.runtime import core as runtime

    base = _bert()
    ed.cache_clear()
    costs = {"exact": [], "family": []}
    orig = (runtime.trace, runtime.trace_family)

    def timed(kind, fn):
        def wrap(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                costs[kind].append(time.perf_counter() - t0)

        return wrap

    runtime.trace, runtime.trace_family = timed("exact", orig[0]), timed("family", orig[1])
    prof = cProfile.Profile()
    try:
        model, batches = copy.deepcopy(base), _batches(LENGTHS[:2])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with ed.EagerDecompMode("core_aten"):
            t0 = time.perf_counter()
            prof.enable()
            _step(model, opt, batches[0])
            prof.disable()
            first = time.perf_counter() - t0
            n_first = {k: len(v) for k, v in costs.items()}
            t0 = time.perf_counter()
            _step(model, opt, batches[1])
            second = time.perf_counter() - t0
    finally:
        runtime.trace, runtime.trace_family = orig
    stats = pstats.Stats(prof)
    parts = {
        "symbolic fakes + guards (symbolic.py, produce_guards)": (
            "symbolic.py",
            "symbolic_layout",
            "produce_guards_expression",
        ),
        "meta reference (exact.reference)": ("exact.py", "reference"),
        "lowering over fakes (Lowerer.lower)": ("lower.py", "lower"),
        "output checks and fix-ups (exact.finish_outputs)": ("exact.py", "finish_outputs"),
        "FX codegen (GraphModule.__init__)": ("graph_module.py", "__init__"),
        "family agreement checks (family.agrees)": ("family.py", "agrees"),
    }
    print(
        f"cold first step {first:.2f} s (traced {n_first['family']} shape-generic + {n_first['exact']} exact kernels); "
        f"second step at a new length {second:.2f} s"
    )
    for label, (file, *funcs) in parts.items():
        cum = max((v[3] for (f, _, fn), v in stats.stats.items() if f.endswith(file) and fn in funcs), default=0.0)
        print(f"  {label:55} {cum:6.2f} s")
    for kind, v in costs.items():
        if v:
            print(
                f"  per-kernel trace cost, {kind:6}: median {statistics.median(v) * 1e3:6.1f} ms, "
                f"mean {statistics.mean(v) * 1e3:6.1f} ms over {len(v)}"
            )


class _Traces:
    """Kernels traced (exact and shape-generic, every runtime) while entered: ``.n``."""

    def __enter__(self):
        self.start = ed.cache_info().traced
        return self

    @property
    def n(self) -> int:
        return ed.cache_info().traced - self.start

    def __exit__(self, *exc):
        return False


def _timed(fn):
    _sync()
    t0 = time.perf_counter()
    out = fn()
    _sync()
    return time.perf_counter() - t0, out


def unseen(rounds: int) -> dict:
    """Per round: one BERT step at a length the process never met, the same step again (warm),
    and natively at it; after a warm-up at LENGTHS (which traces the kernels)."""
    base = _bert()
    ours, theirs = copy.deepcopy(base), copy.deepcopy(base)
    opt, nopt = (torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (ours, theirs))
    ed.cache_clear()
    mode = ed.EagerDecompMode("core_aten")
    warmup = _batches(LENGTHS)
    with mode:
        for b in warmup:
            _step(ours, opt, b)
    # lengths no call met: not the warm-up's, within the model's 128 positions
    fresh = [n for n in range(40, 128) if n not in LENGTHS][:: max(1, 88 // max(rounds, 1))][:rounds]
    rows = {"native": [], "unseen": [], "warm": [], "traced": []}
    for n in fresh:
        (b,) = _batches([n])
        rows["native"].append(_timed(lambda: _step(theirs, nopt, b))[0])
        with mode, _Traces() as tr:
            rows["unseen"].append(_timed(lambda: _step(ours, opt, b))[0])
        rows["traced"].append(tr.n)
        with mode:
            rows["warm"].append(_timed(lambda: _step(ours, opt, b))[0])
    return rows | {"lengths": fresh}


def prompt(rounds: int) -> dict:
    """Per round: greedy generate() from a prompt length whose KV lengths (prompt .. prompt +
    NEW_TOKENS) no earlier call met, the same call again (seen), and natively; after a warm-up."""
    model = _llama()
    g = torch.Generator().manual_seed(2)
    ed.cache_clear()
    mode = ed.EagerDecompMode("core_aten")
    first = torch.randint(0, VOCAB, (1, 8), generator=g).to(DEVICE)  # (outside: an explicit generator has no path)
    with mode:
        workloads.generate(model, first, NEW_TOKENS)
    # disjoint KV ranges: 8..56 was the warm-up's; each round starts past the last one's end
    limit = model.config.max_position_embeddings - NEW_TOKENS
    starts = list(range(8 + NEW_TOKENS + 1, limit, NEW_TOKENS + 1))[:rounds]
    rows = {"native": [], "new": [], "seen": [], "traced": [], "same": []}
    for p in starts:
        ids = torch.randint(0, VOCAB, (1, p), generator=g).to(DEVICE)
        t, ref = _timed(lambda: workloads.generate(model, ids, NEW_TOKENS))
        rows["native"].append(t)
        with mode, _Traces() as tr:
            t, y1 = _timed(lambda: workloads.generate(model, ids, NEW_TOKENS))
        rows["new"].append(t)
        rows["traced"].append(tr.n)
        with mode:
            t, y2 = _timed(lambda: workloads.generate(model, ids, NEW_TOKENS))
        rows["seen"].append(t)
        rows["same"].append(torch.equal(y1, ref) and torch.equal(y2, ref))
    return rows | {"prompts": starts}


COLD_CHILD = """
import contextlib, json, statistics, sys, time, warnings
warnings.simplefilter("ignore")
import torch
torch.set_num_threads(1)
import eagerdecomp as ed
from eagerdecomp import workloads as W
what, native, STEPS = sys.argv[1], sys.argv[2] == "native", int(sys.argv[3])
ctx = contextlib.nullcontext if native else (lambda: ed.EagerDecompMode("core_aten"))
if what == "bert":
    model = W.bert()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = W.bert_batches([13])[0]
    run = lambda: W.bert_step(model, opt, batch)
elif what == "llama":
    model = W.llama()
    ids = torch.randint(0, W.VOCAB, (1, 8), generator=torch.Generator().manual_seed(2))
    run = lambda: W.generate(model, ids, 48)
else:
    from eagerdecomp.demo import TransformerBlock, train_step
    torch.manual_seed(0)
    model = TransformerBlock()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = TransformerBlock.batch()
    run = lambda: train_step(model, opt, x, y)
times, traced = [], []
with ctx():
    for _ in range(STEPS):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
        traced.append(ed.cache_info().traced)
# steady: the last half of the steps (every hot key traced by then; see runtime/tiers.py)
out = {"first": times[0], "steady": statistics.median(times[STEPS // 2 :]), "traced": traced[0], "times": times}
print(json.dumps(out))
"""
STEPS = 10  # steps per fresh process: the curve of the cold section

# cold: tiers on (the default); trace first: EAGERDECOMP_TRACE_AFTER=0, every key traced at its
# first call (as before tiers); bundle: a bundle built at the start, tiers on
VARIANTS = ("native", "cold", "trace first", "bundle")

COLD_WORK = {
    "bert": "BERT 2x64, first training step (length 13)",
    "llama": "Llama 2x64, first generate() (48 tokens)",
    "demo": "demo TransformerBlock, first training step",
}


def cold(rounds: int) -> dict:
    """Each workload's first step in fresh processes: native, the mode cold (no disk cache), the
    mode with a bundle built at the start (its own empty disk cache per process); ``rounds`` of each,
    interleaved. Returns ``{workload: {variant: [run dicts]}}`` and the bundle build's seconds."""
    out: dict = {w: {v: [] for v in VARIANTS} for w in COLD_WORK}
    with tempfile.TemporaryDirectory() as root:
        bundle = os.path.join(root, "bundle")
        env = {k: v for k, v in os.environ.items() if k != "EAGERDECOMP_BUNDLE"}
        t0 = time.perf_counter()
        r = subprocess.run(
            [sys.executable, "-m", "eagerdecomp", "cache", "build", "-o", bundle],
            env=dict(env, EAGERDECOMP_CACHE_DIR=os.path.join(root, "unused")),
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if r.returncode:
            raise RuntimeError(r.stderr[-2000:])
        built = time.perf_counter() - t0
        variants = {
            "native": dict(env, EAGERDECOMP_DISK_CACHE="0"),
            "cold": dict(env, EAGERDECOMP_DISK_CACHE="0"),
            "trace first": dict(env, EAGERDECOMP_DISK_CACHE="0", EAGERDECOMP_TRACE_AFTER="0"),
            "bundle": dict(env, EAGERDECOMP_DISK_CACHE="1", EAGERDECOMP_BUNDLE=bundle),
        }
        for i in range(rounds):
            for w in COLD_WORK:
                for v, venv in variants.items():
                    venv = dict(venv, EAGERDECOMP_CACHE_DIR=os.path.join(root, f"own-{w}-{v}-{i}"))
                    r = subprocess.run(
                        [sys.executable, "-c", COLD_CHILD, w, v, str(STEPS)],
                        env=venv,
                        capture_output=True,
                        text=True,
                        timeout=900,
                    )
                    if r.returncode:
                        raise RuntimeError(r.stderr[-2000:])
                    out[w][v].append(json.loads(r.stdout.strip().splitlines()[-1]))
    return {"runs": out, "built": built}


def _med(xs):
    return statistics.median(xs)


def side_by_side(u: dict | None, p: dict | None, c: dict | None) -> list:
    """Print and return the tables of sections 4-6."""
    tables = []
    if u is not None:
        t = Table(
            "A training step at a length never seen, after warm-up (tiny BERT, AdamW, batch 4): ms, medians of rounds",
            [
                "native",
                "unseen length",
                "same length again (warm)",
                "unseen / warm",
                "warm / native",
                "unseen / native",
                "kernels traced (unseen steps, in all)",
            ],
            formats={
                "native": "{:.1f}",
                "unseen length": "{:.1f}",
                "same length again (warm)": "{:.1f}",
                "unseen / warm": "{:.2f}x",
                "warm / native": "{:.2f}x",
                "unseen / native": "{:.2f}x",
            },
        )
        t.add(
            _med(u["native"]) * 1e3,
            _med(u["unseen"]) * 1e3,
            _med(u["warm"]) * 1e3,
            _med([a / b for a, b in zip(u["unseen"], u["warm"])]),
            _med([a / b for a, b in zip(u["warm"], u["native"])]),
            _med([a / b for a, b in zip(u["unseen"], u["native"])]),
            sum(u["traced"]),
        )
        t.notes.append(
            f"{len(u['lengths'])} rounds, lengths {u['lengths'][0]}..{u['lengths'][-1]}; warm-up: 12 steps at "
            f"lengths {min(LENGTHS)}..{max(LENGTHS)}. Ratios are medians of per-round ratios. Disk cache on "
            "(the default), in a fresh folder."
        )
        tables.append(t)
    if p is not None:
        t = Table(
            f"generate() with a prompt length never seen (tiny Llama, greedy, {NEW_TOKENS} tokens): ms, medians",
            [
                "native",
                "new prompt length",
                "same call again (seen)",
                "new / seen",
                "seen / native",
                "new / native",
                "kernels traced (new calls, in all)",
                "tokens equal native's",
            ],
            formats={
                "native": "{:.0f}",
                "new prompt length": "{:.0f}",
                "same call again (seen)": "{:.0f}",
                "new / seen": "{:.2f}x",
                "seen / native": "{:.2f}x",
                "new / native": "{:.2f}x",
            },
        )
        t.add(
            _med(p["native"]) * 1e3,
            _med(p["new"]) * 1e3,
            _med(p["seen"]) * 1e3,
            _med([a / b for a, b in zip(p["new"], p["seen"])]),
            _med([a / b for a, b in zip(p["seen"], p["native"])]),
            _med([a / b for a, b in zip(p["new"], p["native"])]),
            sum(p["traced"]),
            "yes" if all(p["same"]) else "NO",
        )
        t.notes.append(
            f"{len(p['prompts'])} rounds, prompt lengths {', '.join(map(str, p['prompts']))}: each meets KV lengths "
            "no earlier call did (a warm-up generate() from 8 tokens first). Disk cache on (the default), in a "
            "fresh folder."
        )
        tables.append(t)
    if c is not None:
        t = Table(
            "The first step in a fresh process: ms, medians of processes",
            [
                "workload",
                "native 1st",
                "mode 1st, cold",
                "traced",
                "cold, trace first",
                "mode 1st, bundle",
                "traced with bundle",
                "cold / native 1st",
                "trace first / native 1st",
                "bundle / native 1st",
                "mode steady",
                "native steady",
            ],
            formats={
                k: "{:.1f}"
                for k in ("native 1st", "mode 1st, cold", "cold, trace first", "mode 1st, bundle", "mode steady")
            }
            | {"native steady": "{:.1f}"}
            | {k: "{:.1f}x" for k in ("cold / native 1st", "trace first / native 1st", "bundle / native 1st")},
        )
        for w, label in COLD_WORK.items():
            r = c["runs"][w]
            nat, cold_, first_, bun = (_med([x["first"] for x in r[v]]) for v in VARIANTS)
            t.add(
                label,
                nat * 1e3,
                cold_ * 1e3,
                max(x["traced"] for x in r["cold"]),
                first_ * 1e3,
                bun * 1e3,
                max(x["traced"] for x in r["bundle"]),
                _med([a["first"] / b["first"] for a, b in zip(r["cold"], r["native"])]),
                _med([a["first"] / b["first"] for a, b in zip(r["trace first"], r["native"])]),
                _med([a["first"] / b["first"] for a, b in zip(r["bundle"], r["native"])]),
                _med([x["steady"] for x in r["cold"] + r["trace first"] + r["bundle"]]) * 1e3,
                _med([x["steady"] for x in r["native"]]) * 1e3,
            )
        n = len(c["runs"]["bert"]["native"])
        t.notes.append(
            f"{n} fresh processes per cell, interleaved. cold: no disk cache, tiers on (the default: a key runs "
            "direct twice, then is traced); trace first: EAGERDECOMP_TRACE_AFTER=0 (every key traced at its first "
            "call, as before tiers); bundle: EAGERDECOMP_BUNDLE at a bundle built by `python -m eagerdecomp cache "
            f"build` ({c['built']:.0f} s, from eagerdecomp/workloads.py's workloads: BERT at other lengths, Llama "
            "from other prompts, the demo) and an empty disk cache of its own. traced: the most kernels a process "
            f"traced in its first step; steady: median of steps {STEPS // 2 + 1}-{STEPS}."
        )
        tables.append(t)
        curve = Table(
            f"Steps 1-{STEPS} in a fresh process: ms per step, medians of processes",
            ["workload", "variant"] + [str(i + 1) for i in range(STEPS)],
            formats={str(i + 1): "{:.1f}" for i in range(STEPS)},
        )
        for w, label in COLD_WORK.items():
            for v in VARIANTS:
                runs = c["runs"][w][v]
                curve.add(label.split(",")[0], v, *(_med([x["times"][i] for x in runs]) * 1e3 for i in range(STEPS)))
        curve.notes.append("The same processes as the table above: each step timed on its own.")
        tables.append(curve)
    for t in tables:
        print(f"\n{t.title}")
        fmts = t.formats
        for row in t.rows:
            print(
                "  "
                + " | ".join(
                    f"{col}: {fmts[col].format(v) if col in fmts and isinstance(v, (int, float)) else v}"
                    for col, v in zip(t.columns, row)
                )
            )
        for note in t.notes:
            print(f"  ({note})")
    return tables


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--no-edref", action="store_true")
    p.add_argument("--demo-only", action="store_true", help="only the demo in fresh processes (disk cache)")
    p.add_argument(
        "--device",
        default="cpu",
        help="cpu or cuda: where native and the mode run (edref and the two-process demo run on CPU only)",
    )
    p.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma separated, of {', '.join(SECTIONS)} (default all; the JSON holds unseen, prompt, cold)",
    )
    p.add_argument("--unseen-rounds", type=int, default=15, help="rounds of the unseen and prompt sections")
    add_json_flag(p)
    args = p.parse_args()
    sections = set(args.sections.split(","))
    if sections - set(SECTIONS):
        p.error(f"unknown sections {sorted(sections - set(SECTIONS))}")
    global DEVICE
    DEVICE = args.device
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    dev = None
    if not args.no_edref and DEVICE == "cpu":
        try:
            from eagerdecomp.device.refdev import reference_device

            dev = reference_device()
        except Exception as e:  # noqa: BLE001
            print(f"edref unavailable: {e}")
    print(
        f"torch {torch.__version__}, {DEVICE}, 1 thread, {args.rounds} rounds (medians) | "
        f"shape families {'on' if os.environ.get('EAGERDECOMP_SHAPE_GENERIC', '1') != '0' else 'off'}\n"
    )
    if args.demo_only:
        return demo_table(args.rounds)
    if args.profile:
        profile_first_step()
        print()
    if sections & {"unseen", "prompt", "cold"}:
        with _disk_on():
            u = unseen(args.unseen_rounds) if "unseen" in sections else None
            g = prompt(args.unseen_rounds) if "prompt" in sections else None
        c = cold(args.rounds) if "cold" in sections and DEVICE == "cpu" else None
        save(args.json, "shapes", side_by_side(u, g, c), DEVICE)
    if "padding" in sections:
        padding_table(args.rounds, dev)
    if "generation" in sections:
        generation_table(args.rounds, dev)
    if "demo" in sections and DEVICE == "cpu":
        demo_table(args.rounds)


def padding_table(rounds: int, dev) -> None:
    r = padding(rounds, dev)
    t = r["times"]
    worst = max(r["traced"].values(), default=0)
    print(f"dynamic padding, BERT 2x64, AdamW, 12 steps (lengths {LENGTHS[0]}..{max(LENGTHS)}), cold cache:")
    print(
        f"  native {t['native']:.2f} s | "
        f"mode, 12 lengths {t['mode dyn']:.2f} s ({t['mode dyn'] / t['native']:.1f}x native) | "
        f"mode, one length {t['mode one']:.2f} s | "
        f"12 lengths / one length under the mode: {t['mode dyn'] / t['mode one']:.2f}x"
    )
    if "edref dyn" in t:
        print(
            f"  edref+enable, 12 lengths {t['edref dyn']:.2f} s | one length {t['edref one']:.2f} s | "
            f"ratio {t['edref dyn'] / t['edref one']:.2f}x"
        )
    print(
        f"  steps 2-12 only (the first step traces the same kernels in both): 12 lengths {t['mode dyn later']:.2f} s, "
        f"one length {t['mode one later']:.2f} s: {t['mode dyn later'] / t['mode one later']:.2f}x"
    )
    print(f"  parameters after the 12 AdamW steps, mode vs native (dropout off): max |diff| {r['diff']:.1e}")
    print(
        f"  kernels traced over the 12 lengths: {sum(r['traced'].values())} for {len(r['traced'])} ops, "
        f"at most {worst} for one op"
        + (f" ({', '.join(k for k, v in r['traced'].items() if v == worst)})" if worst > 2 else "")
    )
    # an op called with different non-tensor arguments (transpose's dims) is several families:
    # per op, the kernels traced over 12 lengths for each one traced at a single length
    one = r["traced one"]
    per = {op: n / one[op] for op, n in r["traced"].items() if one.get(op)}
    extra = {op: n for op, n in r["traced"].items() if op not in one}
    top = max(per.values(), default=0.0)
    print(
        f"  kernels per op over 12 lengths / at one length: at most {top:.2f}x"
        + (f" ({', '.join(op for op, v in per.items() if v == top)})" if top > 1 else "")
        + (f"; ops traced only with 12 lengths: {extra}" if extra else "")
    )


def generation_table(rounds: int, dev) -> None:
    g = generation(rounds, dev)
    t = g["times"]
    print(f"\ngeneration, tiny Llama 2x64, greedy, {NEW_TOKENS} new tokens, KV cache:")
    print(
        f"  native 1st {t['native 1st']:.2f} s, 2nd {t['native 2nd']:.2f} s | mode 1st {t['mode 1st']:.2f} s "
        f"({t['mode 1st'] / t['native 1st']:.1f}x native), "
        f"2nd {t['mode 2nd']:.2f} s ({t['mode 2nd'] / t['native 2nd']:.1f}x native) | "
        f"mode 1st/2nd {t['mode 1st'] / t['mode 2nd']:.2f}x"
    )
    if "edref 1st" in t:
        print(
            f"  edref+enable 1st {t['edref 1st']:.2f} s, 2nd {t['edref 2nd']:.2f} s | "
            f"1st/2nd {t['edref 1st'] / t['edref 2nd']:.2f}x"
        )
    print(f"  kernels traced: {g['traced']} in all, {g['after_first']} after the first decoding step's shapes")
    if "disk 1st" in t:
        print(
            f"  mode, memory cache cleared, disk cache warm: 1st {t['disk 1st']:.2f} s, 2nd {t['disk 2nd']:.2f} s | "
            f"1st/2nd {t['disk 1st'] / t['disk 2nd']:.2f}x"
        )


def demo_table(rounds: int) -> None:
    runs = demo_processes(rounds)
    print(
        "\ndemo TransformerBlock (AdamW), fresh processes sharing a disk cache (1 thread; medians of "
        f"{len(runs['warm'])} warm/native pairs):"
    )
    first, steady, traced, loaded, _ = runs["cold"]
    print(
        f"  process 1 (cold disk): first step {first:.3f} s, steady {steady:.3f} s ({first / steady:.1f}x) | "
        f"kernels traced {traced}"
    )
    for name, label in (("warm", "later processes (warm disk)"), ("native", "native, no mode")):
        r = runs[name]
        first, steady = statistics.median(x[0] for x in r), statistics.median(x[1] for x in r)
        ratio = statistics.median(x[0] / x[1] for x in r)
        extra = (
            (
                f" | kernels traced {max(x[2] for x in r)}, loaded {max(x[3] for x in r)}, "
                f"programs preloaded {max(x[4] for x in r)}"
            )
            if name == "warm"
            else ""
        )
        print(
            f"  {label:28} first step {first * 1e3:6.1f} ms, "
            f"steady {steady * 1e3:5.1f} ms, first/steady {ratio:.1f}x{extra}"
        )


if __name__ == "__main__":
    main()
