"""Models nobody here wrote: each corpus model's training step and inference pass under the mode
match native's (``tests/zoo.py`` says how). ``make test`` runs a slice; ``make zoo``
(``EAGERDECOMP_ZOO=all``) every model, writing a row per model and ``reports/zoo.md``.
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
# the slice: a decoder LM (GPT-2), an encoder-decoder (BART, with the labels it rejects), a CNN with batch norm
SLICE = ["transformers/GPT2LMHeadModel", "transformers/BartForConditionalGeneration", "cnn/ResNet"]
BATCH = 8  # models per child process: one import of torch and transformers serves them all
TIMEOUT = 900  # per child


def _models():
    return zoo.names() if ALL else SLICE


_ROWS: dict = {}


def _run(names: list) -> None:
    """Check ``names`` in one child; a model the child did not finish (it crashed or ran out
    of time on it) gets that verdict, and the ones after it are left for the next child."""
    env = dict(os.environ, EAGERDECOMP_DISK_CACHE="0", PYTHONWARNINGS="ignore")
    try:
        r = subprocess.run([sys.executable, "-m", "tests.zoo", *names], cwd=zoo.ROOT, env=env, capture_output=True,
                           text=True, timeout=TIMEOUT)
        out, why = r.stdout, f"exit {r.returncode}: {r.stderr.strip()[-600:]}"
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        why = f"over {TIMEOUT} s"
    for line in out.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            _ROWS[row["name"]] = row
    first = next((n for n in names if n not in _ROWS), None)
    if first is not None:
        _ROWS[first] = {"name": first, "verdict": "timeout" if why.startswith("over") else "crash", "detail": why}


def _row(name: str) -> dict:
    path = zoo.row_path(name)
    if ALL and name not in _ROWS and path.exists():  # written by an earlier run of make zoo: resumed
        _ROWS[name] = json.loads(path.read_text())
    if name not in _ROWS:
        todo = _models()
        i = todo.index(name)
        _run([n for n in todo[i:] if n not in _ROWS and not (ALL and zoo.row_path(n).exists())][:BATCH])
    return _ROWS[name]


@pytest.mark.parametrize("name", _models())
def test_model_matches_native_under_the_mode(name):
    row = _row(name)
    if ALL:
        zoo.ROWS.mkdir(parents=True, exist_ok=True)
        zoo.row_path(name).write_text(json.dumps(row, indent=1))
    if row["verdict"] == "native failed":
        pytest.skip(f"does not run natively: {row['detail']}")
    assert row["verdict"] == "match", row
