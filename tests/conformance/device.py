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
    _float64_run,
    _is_plain,
    _tensors,
    _Timer,
    compare_inputs,
    compare_outputs,
    copy_args,
    out_maker,
)

__all__ = ["CLASSES", "run_device_sample", "rows_dir", "summary"]

CLASSES = ("pass", "refused", "unsupported", "wrong", "error", "skipped")
ROOT = Path(__file__).resolve().parents[2]
_VIEW_REASONS = tuple(why for _, why in RULES)


def rows_dir() -> Path:
    return ROOT / "reports" / "conformance-edref" / "rows"


# OpInfos whose arguments after the first tensor stay on the CPU, as eager requires on any device
HOST_ARGS = {"tensor_split": "tensor_indices_or_sections must be a CPU tensor"}


def _to_device(tree, dev, keep_host=False):
    """A copy on ``dev`` with the same layout and storage sharing (one device storage per host one).
    The CPU device named as an argument (``x.to("cpu", ...)``) becomes ``dev``. ``keep_host``:
    only the first tensor moves (:data:`HOST_ARGS`)."""
    storages: dict = {}
    moved = []

    def move(x):
        if isinstance(x, torch.device) and x.type == "cpu" or (isinstance(x, str) and x == "cpu"):
            return dev
        if not isinstance(x, torch.Tensor) or (keep_host and moved):
            return x
        moved.append(x)
        if not _is_plain(x):
            return x  # (the tier refuses it, as it must)
        key = x.untyped_storage()._cdata
        s = storages.get(key)
        if s is None:
            raw = torch.empty(0, dtype=torch.uint8).set_(x.untyped_storage())
            s = storages[key] = raw.to(dev).untyped_storage()
        return torch.empty(0, dtype=x.dtype, device=dev).set_(s, x.storage_offset(), x.shape, x.stride())

    return tree_map(move, tree, is_leaf=lambda x: isinstance(x, torch.Size))


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
            torch._C._set_conj(h, x.is_conj())  # (ifft's result is a lazy conjugate, on CPU too)
            torch._C._set_neg(h, x.is_neg())
            self.tensors[id(x)] = (x, h)  # (x kept alive: its id stays its own)
            return h

        return tree_map(back, tree, is_leaf=lambda x: isinstance(x, torch.Size))


def _versions(tensors) -> list:
    return [t._version if _is_plain(t) else None for t in tensors]


def _draws(fn, sample_args, make_out) -> bool:
    """Whether the call draws random numbers, from a recorded run of its own.

    NOTE: not the compared run: under any Python dispatch mode, torch 2.13's composite
    ``linalg.matrix_rank(out=)`` calls the functional ``sum`` and leaves its out unwritten.
    """
    args = copy_args(sample_args)
    if make_out is not None:
        args[2]["out"] = make_out()
    try:
        with RecordingMode() as rec:
            _call(fn, args)
    except Exception:  # noqa: BLE001
        pass
    return any(torch.Tag.nondeterministic_seeded in getattr(op, "tags", ()) for op in rec.ops)


def composite(opinfo, variant) -> bool:
    """Whether the ATen op behind an OpInfo variant is CompositeImplicitAutograd.

    NOTE: such an op runs its composite above the device, and how often that bumps a version
    counter is PyTorch's choice per device (resize_output resizes a CPU out= without dispatching
    and dispatches resize_ elsewhere; kron(out=) writes through internal views on CPU): CPU's
    count is not the device's truth there, so versions are compared for other ops only.
    """
    name = (opinfo.aten_name or opinfo.name).replace(".", "_")
    packet = getattr(torch.ops.aten, name + ("_" if variant == "inplace" else ""), None)
    if packet is None:
        return False
    overloads = [getattr(packet, o) for o in packet.overloads()]
    if variant == "out":
        overloads = [o for o in overloads if o._schema.is_mutable]
    return any(_has_composite(o.name()) for o in overloads)


def _has_composite(name: str) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd")
    except RuntimeError:  # (TorchScript-only overloads, aten::add_.t: no dispatcher entry)
        return False


def run_device_variant(
    fn, sample_args, variant, dev, make_out=None, values=True, keep_host=False, versions=True
) -> Outcome:
    if any(not _is_plain(t) for t in _tensors(sample_args)):
        return Outcome("skipped", variant, "a non-strided input (edref has strided tensors only)")
    nat_args = copy_args(sample_args)
    got_args = _to_device(copy_args(sample_args), dev, keep_host)
    if "device" in got_args[2]:  # a factory: made on the device
        got_args[2]["device"] = dev
    if make_out is not None:
        nat_args[2]["out"] = make_out()
        got_args[2]["out"] = tree_map(lambda t: t.to(dev) if isinstance(t, torch.Tensor) else t, make_out())
    nat_in, got_in = _tensors(nat_args), _tensors(got_args)
    nat_v, got_v = _versions(nat_in), _versions(got_in)
    random = _draws(fn, sample_args, make_out)
    try:
        torch.manual_seed(SEED)
        native = _call(fn, nat_args)
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
        if "strided results only" in str(e):  # a sparse result: edref has strided tensors only
            return Outcome("skipped", variant, _first_line(e)[:300])
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
        try:
            compare_outputs(native, got_h, nat_in, got_in_h, values=values and not random)
            compare_inputs(nat_in, got_in_h, values=values and not random)
        except Mismatch as m:  # reduced-precision rounding: judged against float64, as the mode's run is
            if not m.values:
                raise
            ref_out, ref_in = _float64_run(fn, sample_args, make_out)
            compare_outputs(native, got_h, nat_in, got_in_h, values=values, ref=ref_out)
            compare_inputs(nat_in, got_in_h, ref_in, values=values)
        after_n, after_g = _versions(nat_in), _versions(got_in)
        dn = [None if a is None else a - b for a, b in zip(after_n, nat_v)]
        dg = [None if a is None else a - b for a, b in zip(after_g, got_v)]
        if versions and dn != dg:
            raise Mismatch(f"version counters advanced by eager {dn}, on the device {dg}")
    except Mismatch as m:
        return Outcome("wrong", variant, str(m), random=random)
    return Outcome("pass", variant, random=random, notes=(["cpu: " + ", ".join(on_cpu)] if on_cpu else []))


def run_device_sample(opinfo, sample, dev) -> list:
    """The fn, in-place and out= variants of one sample on ``dev`` (the switch enabled there)."""
    args = copy_args((sample.input, tuple(sample.args), dict(sample.kwargs)), requires_grad=False)
    values = opinfo.name not in UNINITIALIZED
    keep = opinfo.name in HOST_ARGS
    results = [run_device_variant(opinfo.op, args, "fn", dev, values=values, keep_host=keep)]
    if opinfo.inplace_variant is not None:
        versions = not composite(opinfo, "inplace")
        results.append(run_device_variant(opinfo.inplace_variant, args, "inplace", dev, None, values, keep, versions))
    make = out_maker(opinfo, args)
    if make is not None:
        versions = not composite(opinfo, "out")
        results.append(run_device_variant(opinfo.op, args, "out", dev, make, values, keep, versions))
    return results


def write_rows(test_id: str, rows: list) -> None:
    d = rows_dir()
    d.mkdir(parents=True, exist_ok=True)
    (d / (test_id.replace("/", "_") + ".json")).write_text(json.dumps(rows))


def summary() -> str:
    """reports/conformance-edref.md from the rows written so far; returns its text."""
    rows = [r for p in sorted(rows_dir().glob("*.json")) for r in json.loads(p.read_text())]
    counts = Counter("known" if r.get("known") else r["cls"] for r in rows)
    on_cpu = [r for r in rows if r["cls"] == "pass" and any(n.startswith("cpu: ") for n in r["notes"])]
    ops = Counter(op for r in on_cpu for n in r["notes"] if n.startswith("cpu: ") for op in n[5:].split(", "))
    from .test_device_tier import KNOWN

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
    lines += [f"| known (below) | {counts['known']} |"]
    known = Counter(r["test"].rsplit("-", 1)[0] for r in rows if r.get("known"))
    lines += [
        "",
        f"Known: {sum(known.values())} samples where PyTorch itself differs between the CPU and a device:",
        "",
    ]
    lines += [f"* `{name}` ({n}): {KNOWN[name][2]}" for name, n in sorted(known.items())]
    stale = sorted(set(KNOWN) - set(known))
    if stale:
        lines += ["", f"**Stale known entries** (no sample hit them): {', '.join(stale)}"]
    lines += ["", f"Samples that passed with some op on the CPU tier: {len(on_cpu)}.", ""]
    if ops:
        lines += ["| op run on the CPU tier | samples |", "| --- | ---: |"]
        lines += [f"| `{op}` | {n} |" for op, n in ops.most_common()]
    for cls in ("wrong", "unsupported", "error", "refused"):
        bad = [r for r in rows if r["cls"] == cls and not r.get("known")]
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
        text = summary()
        print(text, end="")
        sys.exit(1 if "Stale known entries" in text else 0)
    else:
        raise SystemExit("usage: python -m tests.conformance.device --summary")
