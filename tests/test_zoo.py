"""Models nobody here wrote: each corpus model's training step and inference pass under the mode
match native's (``tests/zoo.py`` says how). ``make test`` runs a slice; ``make zoo``
(``EAGERDECOMP_ZOO=all``) every model, writing a row per model and ``reports/zoo.md``
(``OPSET=prims_fusion``: under that preset, ``reports/zoo-prims_fusion.md``; ``DEVICE=edprims``:
on the prims reference device, ``reports/zoo-edprims.md``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

from tests import zoo  # noqa: E402

ALL = os.environ.get("EAGERDECOMP_ZOO", "").lower() == "all"
# where `make zoo` runs them: under the mode, or on a device with the switch (DEVICE=edref)
DEVICE = os.environ.get("EAGERDECOMP_ZOO_DEVICE") or None
# the mode's opset where they run under the mode (make zoo OPSET=prims_fusion)
OPSET = os.environ.get("EAGERDECOMP_ZOO_OPSET") or zoo.CORE
# the slice: a decoder LM (GPT-2), an encoder-decoder (BART), a CNN with batch norm (ResNet)
SLICE = ["transformers/GPT2LMHeadModel", "transformers/BartForConditionalGeneration", "cnn/ResNet"]
BATCH = 8  # models per child process: one import of torch and transformers serves them all
TIMEOUT = 900  # per child

_ROWS: dict = {}  # (device, opset, name) -> row


def _run(names: list, device, opset: str = zoo.CORE) -> None:
    """Check ``names`` in one child; a model the child did not finish (it crashed or ran out
    of time on it) gets that verdict, and the ones after it are left for the next child."""
    env = dict(os.environ, EAGERDECOMP_DISK_CACHE="0", PYTHONWARNINGS="ignore")
    cmd = [sys.executable, "-m", "tests.zoo", *(["--device", device] if device else []), "--opset", opset, *names]
    try:
        r = subprocess.run(cmd, cwd=zoo.ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)
        out, why = r.stdout, f"exit {r.returncode}: {r.stderr.strip()[-600:]}"
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        why = f"over {TIMEOUT} s"
    for line in out.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            _ROWS[device, opset, row["name"]] = row
    first = next((n for n in names if (device, opset, n) not in _ROWS), None)
    if first is not None:
        _ROWS[device, opset, first] = {
            "name": first,
            "verdict": "timeout" if why.startswith("over") else "crash",
            "detail": why,
        }


def _row(name: str, device, todo: list, opset: str = zoo.CORE) -> dict:
    path = zoo.row_path(name, device, opset)
    if ALL and (device, opset, name) not in _ROWS and path.exists():  # written by an earlier run of make zoo: resumed
        _ROWS[device, opset, name] = json.loads(path.read_text())
    if (device, opset, name) not in _ROWS:
        rest = todo[todo.index(name) :]
        _run(
            [
                n
                for n in rest
                if (device, opset, n) not in _ROWS and not (ALL and zoo.row_path(n, device, opset).exists())
            ][:BATCH],
            device,
            opset,
        )
    row = _ROWS[device, opset, name]
    if ALL:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(row, indent=1))
    return row


# NOTE: models that stop with UnsupportedOpError, each with the op that blocks it: a clear error, as
# promised, for an op with no path to the preset yet (per preset: under the mode, or the preset of
# the reference device they ran on). Any other model that stops so fails, and so does one of these
# stopping on another op. A model leaves this table when it runs.
_BLOCKED = {
    # a complex tensor viewed as real (FNet's Fourier mixing, Llama 4's rotary embedding): no core
    # ATen or prims op reinterprets a dtype in place
    "transformers/FNetForMaskedLM": "aten.view_as_real.default",
    "transformers/Llama4TextModel": "aten.view_as_real.default",
}
UNSUPPORTED = {"core_aten": _BLOCKED, "prims_fusion": _BLOCKED, "edprims": _BLOCKED}
# reference device -> its preset (eagerdecomp.device.refdev.REFERENCE_DEVICES)
_DEVICE_PRESET = {"edref": "core_aten", "edprims": "prims_fusion"}


def _preset(device, opset: str) -> str:
    """The UNSUPPORTED table of a run: the device's own where it has one, else its preset's."""
    if not device:
        return opset
    name = device.partition(":")[0]
    return name if name in UNSUPPORTED else _DEVICE_PRESET[name]


def _assert_matches(row: dict, preset: str = zoo.CORE) -> None:
    if row["verdict"] == "native failed":
        pytest.skip(f"does not run natively: {row['detail']}")
    if row["verdict"] == "error" and row["detail"].startswith("UnsupportedOpError"):
        blocker, expected = row.get("blocker"), UNSUPPORTED[preset].get(row["name"])
        assert blocker == expected, (
            f"{row['name']} stops on {blocker}" + (f", expected {expected}" if expected else " (a new blocker)"),
            row["detail"],
        )
        pytest.xfail(f"blocked by {blocker} (UNSUPPORTED[{preset!r}]): {row['detail']}")
    # (a model that draws its own noise was compared on one seeded stream: tests/zoo.py SeededNoise)
    if row["verdict"] == "mismatch" and row["name"] in zoo.KNOWN:
        pytest.xfail(f"{zoo.KNOWN[row['name']]}: {row['detail']}")
    assert row["verdict"] == "match", row


# EAGERDECOMP_ZOO_EVERY=N (make zoo EVERY=N): every Nth model of the corpus, a quicker sample
EVERY = int(os.environ.get("EAGERDECOMP_ZOO_EVERY") or 1)
MODELS = zoo.names()[::EVERY] if ALL else SLICE


@pytest.mark.parametrize("name", MODELS)
def test_model_matches_native(name):
    device, opset = (DEVICE, OPSET) if ALL else (None, zoo.CORE)
    _assert_matches(_row(name, device, MODELS, opset), _preset(device, opset))


@pytest.mark.skipif(ALL, reason="make zoo DEVICE=edref runs every model there")
def test_a_model_matches_native_on_the_reference_device():
    _assert_matches(_row("transformers/GPT2LMHeadModel", "edref", ["transformers/GPT2LMHeadModel"]))


@pytest.mark.skipif(ALL, reason="make zoo OPSET=prims_fusion runs every model under the preset")
def test_a_model_matches_native_under_prims_fusion():
    # a causal LM: its loss pads the labels (F.pad with a float value on int64), and it generates
    name = "transformers/GPT2LMHeadModel"
    _assert_matches(_row(name, None, [name], "prims_fusion"), "prims_fusion")


# -- the judge itself: a check that cannot fail is no check -----------------------------------------


def _parts(**change):
    import torch

    g = torch.Generator().manual_seed(0)
    parts = {
        "loss": {"loss": torch.tensor(2.5)},
        "grads": {"w": torch.randn(64, generator=g)},
        "buffers": {},
        "outputs": {0: torch.randn(4, 8, generator=g)},
    }
    for part, fn in change.items():
        parts[part] = {k: fn(v) for k, v in parts[part].items()}
    return parts


def test_the_judge_passes_rounding_and_fails_a_wrong_answer():
    native = _parts()
    assert zoo.judge(_parts(grads=lambda t: t * (1 + 1e-6)), native, lambda: None)[0] == []
    failures = zoo.judge(_parts(grads=lambda t: t * 1.01), native, lambda: None)[0]
    assert len(failures) == 1 and failures[0].startswith("grads: w:")
    assert zoo.judge(_parts(outputs=lambda t: t[:2]), native, lambda: None)[0]  # a shape is never rounding


def test_past_float32_tolerance_the_judge_is_float64():
    exact = _parts()
    # native 1e-3 off float64; the mode 2e-3 off: within RATIO x native's error
    native = _parts(grads=lambda t: t + 1e-3)
    failures, _, judged = zoo.judge(_parts(grads=lambda t: t - 2e-3), native, lambda: exact)
    assert failures == [] and judged["grads"][0] > judged["grads"][1] > 0
    # the mode 10x further off float64 than native: wrong
    failures, _, _ = zoo.judge(_parts(grads=lambda t: t + 1e-2), native, lambda: exact)
    assert len(failures) == 1 and "error against float64" in failures[0]


def test_generations_part_only_on_a_near_tie():
    import torch

    seq = torch.tensor([[5, 1, 2, 3]])
    scores = [
        torch.tensor([[0.0, 3.0, 1.0, 0.0]]),
        torch.tensor([[0.0, 1.0, 2.0, 0.0]]),
        torch.tensor([[0.0, 0.0, 1.0, 3.0]]),
    ]
    assert zoo._same_generation((seq, scores), (seq, scores)) is None
    off = [s.clone() for s in scores]
    off[1][0, 0] += 0.01
    assert "step 1: scores differ" in zoo._same_generation((seq, off), (seq, scores))
    other = torch.tensor([[5, 1, 1, 3]])  # step 1 picks token 1, native's second best by 1.0
    assert "not a tie" in zoo._same_generation((other, scores), (seq, scores))
    tied = [s.clone() for s in scores]
    tied[1][0, 1] = 2.0  # native's two best at step 1 are equal: either token is eager's
    assert zoo._same_generation((other, tied), (seq, tied)) is None
