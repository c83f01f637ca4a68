"""Run one OpInfo sample natively on CPU and on the reference device with the switch and the
CPU tier (``ed.enable("edref", on_unsupported="cpu")``), and classify the outcome.

Each sample runs on independent copies of its inputs (same sizes, strides, offsets and storage
sharing): natively on CPU, and copied to edref (the same layout there) and run with the switch.
The device run is then read back to the host with its layout and aliasing kept, and compared
with the CPU run on everything :mod:`harness` compares (outputs, values, strides, aliasing with
the inputs, inputs after the call), plus the version counters of the inputs.

Classes (:data:`CLASSES`):

``pass``      eager-exact (``cpu`` when some op of it ran on the CPU tier);
``refused``   eager gives a result, and the tier refused an op whose result must alias its input
              (a view, an in-place view, the set_ family), with its clear error;
``unsupported`` any other UnsupportedOpError where eager gives a result;
``wrong``     a silently different answer;
``error``     any other exception;
``skipped``   a sparse or other non-strided input: edref, like Core ATen, has strided tensors only.

``python -m tests.conformance.device --summary`` writes ``reports/conformance-edref.md`` from
the rows ``tests/conformance/test_device_tier.py`` wrote.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import torch
from torch.utils._pytree import tree_map

import eagerdecomp as ed
from eagerdecomp.errors import UnsupportedOpError
from eagerdecomp.runtime.host import RULES
from eagerdecomp.testing import RecordingMode

from .harness import (
    SAMPLE_TIMEOUT_S,
    SEED,
    UNINITIALIZED,
    Mismatch,
    Outcome,
    SampleTimeout,
    _call,
    _first_line,
    _is_plain,
    _out_factory,
    _tensors,
    _Timer,
    compare_inputs,
    compare_outputs,
    copy_args,
)

__all__ = ["CLASSES", "run_device_sample", "rows_dir", "summary"]

CLASSES = ("pass", "refused", "unsupported", "wrong", "error", "skipped")
ROOT = Path(__file__).resolve().parents[2]
_VIEW_REASONS = tuple(why for _, why in RULES)


def rows_dir() -> Path:
    return ROOT / "reports" / "conformance-edref" / "rows"


def _to_device(tree, dev):
    """A copy on ``dev`` with the same layout and storage sharing (one device storage per host one)."""
    storages: dict = {}

    def move(x):
        if not isinstance(x, torch.Tensor):
            return x
        if not _is_plain(x):
            return x  # (the tier refuses it, as it must)
        key = x.untyped_storage()._cdata
        s = storages.get(key)
        if s is None:
            raw = torch.empty(0, dtype=torch.uint8).set_(x.untyped_storage())
            s = storages[key] = raw.to(dev).untyped_storage()
        return torch.empty(0, dtype=x.dtype, device=dev).set_(s, x.storage_offset(), x.shape, x.stride())

    return tree_map(move, tree)


class _Host:
    """Device tensors read back to the host with their layout, storage sharing and identity kept."""

    def __init__(self):
        self.storages: dict = {}
        self.tensors: dict = {}

    def __call__(self, tree):
        def back(x):
            if not isinstance(x, torch.Tensor) or x.device.type == "cpu" or not _is_plain(x):
                return x
            if id(x) in self.tensors:
                return self.tensors[id(x)][1]
            key = x.untyped_storage()._cdata
            s = self.storages.get(key)
            if s is None:
                raw = torch.empty(0, dtype=torch.uint8, device=x.device).set_(x.untyped_storage())
                s = self.storages[key] = raw.cpu().untyped_storage()
            h = torch.empty(0, dtype=x.dtype).set_(s, x.storage_offset(), x.shape, x.stride())
            self.tensors[id(x)] = (x, h)  # (x kept alive: its id stays its own)
            return h

        return tree_map(back, tree)


def _versions(tensors) -> list:
    return [t._version if _is_plain(t) else None for t in tensors]


def run_device_variant(fn, sample_args, variant, dev, make_out=None, values: bool = True) -> Outcome:
    if any(not _is_plain(t) for t in _tensors(sample_args)):
        return Outcome("skipped", variant, "a non-strided input (edref has strided tensors only)")
    nat_args = copy_args(sample_args)
    got_args = _to_device(copy_args(sample_args), dev)
    if "device" in got_args[2]:  # a factory: made on the device
        got_args[2]["device"] = dev
    if make_out is not None:
        nat_args[2]["out"] = make_out()
        got_args[2]["out"] = tree_map(lambda t: t.to(dev) if isinstance(t, torch.Tensor) else t, make_out())
    nat_in, got_in = _tensors(nat_args), _tensors(got_args)
    nat_v, got_v = _versions(nat_in), _versions(got_in)
    random = False
    try:
        torch.manual_seed(SEED)
        with RecordingMode() as rec:
            native = _call(fn, nat_args)
        random = any(torch.Tag.nondeterministic_seeded in getattr(op, "tags", ()) for op in rec.ops)
    except Exception as e:  # noqa: BLE001
        native_error = e
    else:
        native_error = None
    switch = ed.device.enabled(dev)
    switch.runtime.stats.clear()
    try:
        with _Timer(SAMPLE_TIMEOUT_S):
            torch.manual_seed(SEED)
            got = _call(fn, got_args)
    except Exception as e:  # noqa: BLE001
        if native_error is not None and not isinstance(e, SampleTimeout):
            return Outcome("pass", variant, "eager and the device both raise", notes=["both-raise"])
        if isinstance(e, UnsupportedOpError):
            blocker = str(e.chain[-1]) if e.chain else str(e.op)
            cls = "refused" if any(why in e.reason for why in _VIEW_REASONS) else "unsupported"
            return Outcome(cls, variant, e.reason[:300], blocker=blocker)
        return Outcome("error", variant, f"{type(e).__name__}: {_first_line(e)[:300]}")
    if native_error is not None:
        return Outcome(
            "wrong",
            variant,
            f"eager raises {type(native_error).__name__}: {_first_line(native_error)[:200]}; the device returns one",
        )
    on_cpu = sorted(r.op for r in switch.report().rows if r.on_cpu)
    host = _Host()
    got_h, got_in_h = host(got), host(got_in)
    try:
        compare_outputs(native, got_h, nat_in, got_in_h, values=values and not random)
        compare_inputs(nat_in, got_in_h, values=values and not random)
        after_n, after_g = _versions(nat_in), _versions(got_in)
        dn = [None if a is None else a - b for a, b in zip(after_n, nat_v)]
        dg = [None if a is None else a - b for a, b in zip(after_g, got_v)]
        if dn != dg:
            raise Mismatch(f"version counters advanced by eager {dn}, on the device {dg}")
    except Mismatch as m:
        return Outcome("wrong", variant, str(m), random=random)
    return Outcome("pass", variant, random=random, notes=(["cpu: " + ", ".join(on_cpu)] if on_cpu else []))


def run_device_sample(opinfo, sample, dev) -> list:
    """The fn, in-place and out= variants of one sample on ``dev`` (the switch enabled there)."""
    args = copy_args((sample.input, tuple(sample.args), dict(sample.kwargs)), requires_grad=False)
    values = opinfo.name not in UNINITIALIZED
    results = [run_device_variant(opinfo.op, args, "fn", dev, values=values)]
    if opinfo.inplace_variant is not None:
        results.append(run_device_variant(opinfo.inplace_variant, args, "inplace", dev, values=values))
    if opinfo.supports_out:
        try:
            native = _call(opinfo.op, copy_args(args))
        except Exception:  # noqa: BLE001
            native = None
        make = _out_factory(native) if native is not None else None
        if make is not None:
            results.append(run_device_variant(opinfo.op, args, "out", dev, make_out=make, values=values))
    return results


def write_rows(test_id: str, rows: list) -> None:
    d = rows_dir()
    d.mkdir(parents=True, exist_ok=True)
    (d / (test_id.replace("/", "_") + ".json")).write_text(json.dumps(rows))


def summary() -> str:
    """reports/conformance-edref.md from the rows written so far; returns its text."""
    rows = [r for p in sorted(rows_dir().glob("*.json")) for r in json.loads(p.read_text())]
    counts = Counter(r["cls"] for r in rows)
    on_cpu = [r for r in rows if r["cls"] == "pass" and any(n.startswith("cpu: ") for n in r["notes"])]
    ops = Counter(op for r in on_cpu for n in r["notes"] if n.startswith("cpu: ") for op in n[5:].split(", "))
    lines = [
        "# Conformance on edref with the switch and the CPU tier",
        "",
        "Written by `make conformance-edref` (`tests/conformance/test_device_tier.py`): each OpInfo sample",
        "(fn, in-place and out= variants) natively on CPU and on `edref` with",
        '`ed.enable("edref", on_unsupported="cpu")`; outputs, values, strides, aliasing, inputs after the call',
        "and version counters compared.",
        "",
        "| class | samples |",
        "| --- | ---: |",
    ]
    lines += [f"| {c} | {counts[c]} |" for c in CLASSES]
    lines += ["", f"Samples that passed with some op on the CPU tier: {len(on_cpu)}.", ""]
    if ops:
        lines += ["| op run on the CPU tier | samples |", "| --- | ---: |"]
        lines += [f"| `{op}` | {n} |" for op, n in ops.most_common()]
    for cls in ("wrong", "unsupported", "error", "refused"):
        bad = [r for r in rows if r["cls"] == cls]
        if bad:
            lines += ["", f"## {cls}", ""]
            lines += [f"* `{r['test']}` sample {r['sample']} [{r['variant']}]: {r['detail'][:200]}" for r in bad[:200]]
    text = "\n".join(lines) + "\n"
    out = ROOT / "reports" / "conformance-edref.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text


if __name__ == "__main__":
    if sys.argv[1:] == ["--summary"]:
        print(summary(), end="")
    else:
        raise SystemExit("usage: python -m tests.conformance.device --summary")
