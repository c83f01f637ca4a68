"""The model zoo check: every model of the shipped corpus, built as ``coverage record`` builds
it (``transformers`` architectures made tiny, random weights, and the hand-written CNNs), takes
one training step and one inference pass natively and under ``EagerDecompMode("core_aten")``,
in a fresh process each; the mode's loss, gradients, batch-norm statistics and outputs must
match native's, and an independent ``RecordingMode`` outside it must see only core ATen.

These are models nobody here wrote: the point is a wrong answer we never tuned for. Dropout is
set to 0 (eager's bernoulli stream comes from the CPU kernel's own generator use, which core
ATen's ``rand`` cannot reproduce: a documented limit, checked in the RNG tests instead).

    python -m tests.zoo NAME [NAME...]      # one JSON row per model on stdout (the child)
    python -m tests.zoo --summary           # reports/zoo/rows/*.json -> reports/zoo.md

``tests/test_zoo.py`` runs it: a slice in ``make test``, every model with ``make zoo``.
"""

from __future__ import annotations

import copy
import json
import re
import sys
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROWS = ROOT / "reports" / "zoo" / "rows"
SUMMARY = ROOT / "reports" / "zoo.md"

# the tolerances of tests/test_models.py: float32 rounding of decomposed chains, not bitwise
LOSS, GRAD, OUT = dict(rtol=1e-4, atol=1e-5), dict(rtol=1e-3, atol=1e-5), dict(rtol=1e-4, atol=1e-5)


def names() -> list:
    """Every model of the shipped corpus, in its order."""
    from eagerdecomp.coverage.models import load_corpus

    return sorted(load_corpus().models)


def row_path(name: str) -> Path:
    return ROWS / (re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".json")


def _no_dropout(model) -> None:
    import torch

    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            m.p = 0.0
        for attr in ("dropout", "attention_dropout", "attn_dropout", "dropout_p", "activation_dropout",
                     "hidden_dropout", "layerdrop", "drop_path_rate"):
            if isinstance(getattr(m, attr, None), float):
                setattr(m, attr, 0.0)
        cfg = getattr(m, "config", None)
        if cfg is not None:
            for key, value in list(vars(cfg).items()):
                if isinstance(value, float) and ("drop" in key or key.startswith("mask_") and key.endswith("_prob")):
                    setattr(cfg, key, 0.0)


def _leaves(out) -> list:
    import torch

    values = out.to_tuple() if hasattr(out, "to_tuple") else out
    return [t.detach() for t in torch.utils._pytree.tree_leaves(values)
            if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _train(model, x, labels):
    """One training step: loss, parameter gradients, floating buffers."""
    from eagerdecomp.coverage.record import _loss, _no_cache

    model.train()
    x = _no_cache(model, x)
    try:
        out = model(**x, labels=labels) if labels is not None else model(**x)
    except Exception:  # noqa: BLE001 - a head whose made-up labels it rejects (as `coverage record`)
        if labels is None:
            raise
        out = model(**x)
    loss = _loss(out)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers() if b.is_floating_point()}
    return loss.detach(), grads, buffers


def _infer(model, x):
    import torch

    from eagerdecomp.coverage.record import _no_cache

    model.eval()
    with torch.no_grad():
        return _leaves(model(**_no_cache(model, x)))


def _worst(got: dict, want: dict, tol: dict) -> tuple:
    """``(name, message)`` of the first tensor outside ``tol``, else None; and the largest
    difference over these tensors relative to their largest value (for the report: a tensor
    of its own is no scale, a gradient that should be 0 is rounding noise around it)."""
    import torch

    first, diff, scale = None, 0.0, 0.0
    for name, w in want.items():
        g = got.get(name)
        if g is None:
            return (name, "missing under the mode"), float("inf")
        if (g.dtype, g.shape) != (w.dtype, w.shape):
            return (name, f"{g.dtype}{list(g.shape)} where native has {w.dtype}{list(w.shape)}"), float("inf")
        if w.numel():
            diff = max(diff, (g.double() - w.double()).abs().nan_to_num(0).max().item())
            scale = max(scale, w.double().abs().nan_to_num(0).max().item())
        try:
            torch.testing.assert_close(g, w, equal_nan=True, **tol)
        except AssertionError as e:
            first = first or (name, " ".join(str(e).split())[:300])
    return first, diff / scale if scale else diff


def check(name: str) -> dict:
    """One model: ``{"name", "verdict", ...}``; verdict is ``match``, ``mismatch``, ``error``
    (the mode raised), ``stray`` (non-core ops reached the kernels) or ``native failed``."""
    import torch

    import eagerdecomp as ed
    from eagerdecomp.coverage.record import build, specs
    from eagerdecomp.testing import RecordingMode

    torch.set_num_threads(1)
    row = {"name": name}
    try:
        spec = next(s for s in specs(only=[name]) if s["name"] == name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, x, labels, family, _ = build(spec)
            _no_dropout(model)
            row["family"], row["params"] = family, sum(p.numel() for p in model.parameters())
            ours = copy.deepcopy(model)
            t0 = time.perf_counter()
            torch.manual_seed(1)
            native = _train(model, x, labels), _infer(model, x)
            row["native s"] = round(time.perf_counter() - t0, 3)
    except Exception as e:  # noqa: BLE001 - not ours to judge: the model does not run natively
        return dict(row, verdict="native failed", detail=f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
                torch.manual_seed(1)
                got = _train(ours, x, labels), _infer(ours, x)
    except ed.EagerDecompError as e:
        return dict(row, verdict="error", detail=f"{type(e).__name__}: {' '.join(str(e).split())[:400]}")
    except Exception as e:  # noqa: BLE001 - a crash that is not one of our errors is a bug
        tb = traceback.format_exc().strip().splitlines()
        return dict(row, verdict="crash", detail=f"{type(e).__name__}: {' '.join(str(e).split())[:300]}", where=tb[-3:])
    row["mode s"] = round(time.perf_counter() - t0, 3)
    rep = mode.report()
    row["decomposed"] = len(rep.decomposed)
    row["traced"] = sum(r.traces for r in rep.rows)
    (loss_n, grads_n, buf_n), out_n = native
    (loss_g, grads_g, buf_g), out_g = got
    failures, worst = [], {}
    for part, g, w, tol in (("loss", {"loss": loss_g}, {"loss": loss_n}, LOSS), ("grads", grads_g, grads_n, GRAD),
                            ("buffers", buf_g, buf_n, OUT),
                            ("outputs", dict(enumerate(out_g)), dict(enumerate(out_n)), OUT)):
        if part == "grads" and grads_g.keys() != grads_n.keys():
            failures.append(f"grads: parameters with a gradient differ ({sorted(grads_g.keys() ^ grads_n.keys())[:3]})")
            continue
        first, worst[part] = _worst(g, w, tol)
        if first:
            failures.append(f"{part}: {first[0]}: {first[1]}")
    row["worst"] = {k: float(f"{v:.3g}") for k, v in worst.items()}
    stray = rec.outside("core_aten")
    if failures:
        return dict(row, verdict="mismatch", detail=failures[:4])
    if stray:
        return dict(row, verdict="stray", detail=[str(op) for op in stray][:8])
    return dict(row, verdict="match")


def summary() -> str:
    """reports/zoo.md from the rows written so far; returns its text."""
    rows = [json.loads(p.read_text()) for p in sorted(ROWS.glob("*.json"))]
    by = {}
    for r in rows:
        by.setdefault(r["verdict"], []).append(r)
    lines = ["# The model zoo under `EagerDecompMode(\"core_aten\")`", "",
             "Written by `make zoo` (`tests/test_zoo.py`, `tests/zoo.py`): one training step and one inference",
             "pass of each corpus model, natively and under the mode, dropout off, 1 thread.", "",
             "| verdict | models |", "| --- | ---: |"]
    lines += [f"| {v} | {len(rs)} |" for v, rs in sorted(by.items(), key=lambda kv: -len(kv[1]))]
    ran = [r for r in rows if "mode s" in r]
    if ran:
        rel = sorted(max(r["worst"].values()) for r in ran if r.get("worst"))
        lines += ["", f"Models that ran under the mode: {len(ran)}; worst relative difference per model "
                      f"(over loss, gradients, buffers and outputs, each part's largest difference over its "
                      f"largest value): median {rel[len(rel) // 2]:.2g}, "
                      f"max {rel[-1]:.2g}."]
    for verdict in ("mismatch", "crash", "stray", "error", "timeout", "native failed"):
        if verdict in by:
            lines += ["", f"## {verdict}", ""]
            lines += [f"* `{r['name']}`: {r.get('detail')}" for r in by[verdict]]
    text = "\n".join(lines) + "\n"
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY.write_text(text)
    return text


def main(argv: list) -> int:
    if argv == ["--summary"]:
        print(summary(), end="")
        return 0
    for name in argv:
        print(json.dumps(check(name)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
