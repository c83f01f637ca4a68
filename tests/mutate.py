"""The mutation check: plant representative defects, one at a time, and show the suite catches each.

``python -m tests.mutate`` (``make mutate``; a few minutes on 2 cores) first runs the tests of
every defect with none planted (they must pass), then, for each defect of :data:`MUTANTS`, the
same tests in a fresh pytest process that plants it, and prints a table: the defect, the tests
it ran, the tests that caught it. It exits non-zero if the clean run fails or a defect is
caught by no test. ``python -m tests.mutate NAME ...`` runs only those defects.

The defects are planted from the test side, never through a hook in the library: this module is
also a pytest plugin (``-p tests.mutate``) that, when ``EAGERDECOMP_MUTANT`` names a defect,
monkeypatches it in at ``pytest_configure``, before any test runs. Decompositions are planted the
way the real ones are registered (``register_decomposition(..., _registry=PROJECT)``, which
also moves the table's version on, so no cached kernel of the sound one is reused).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

ENV = "EAGERDECOMP_MUTANT"


def _aten():
    import torch

    return torch.ops.aten


def _project_override(op, make) -> Callable:
    """Register ``make(the sound decomposition)`` for ``op`` in the project's table (the
    family modules registered first); returns the undo."""
    from eagerdecomp.decompositions.registry import PROJECT, register_decomposition
    from eagerdecomp.decompositions.table import default_table
    from eagerdecomp.ops.opset import OpSet

    sound = default_table(OpSet.preset("core_aten"))[op]
    had = PROJECT.get(op)
    register_decomposition(op, override=True, _registry=PROJECT)(make(sound))

    def undo():
        if had is None:
            PROJECT.pop(op, None)
            register_decomposition(op, _registry={})(sound)  # (moves the table's version on)
        else:
            register_decomposition(op, override=True, _registry=PROJECT)(had)

    return undo


def plant_normal_defect() -> Callable:
    """Issue 50's planted defect: every ``normal`` decomposition draws with the mean + 1 and the
    standard deviation x 2. Returns the undo."""
    aten = _aten()
    wrong = {
        aten.normal_.default: lambda f: lambda self, mean=0.0, std=1.0, **kw: f(self, mean + 1, std * 2, **kw),
        aten.normal.Tensor_float: lambda f: lambda mean, std=1.0, **kw: f(mean + 1, std * 2, **kw),
        aten.normal.float_Tensor: lambda f: lambda mean, std, **kw: f(mean + 1, std * 2, **kw),
        aten.normal.Tensor_Tensor: lambda f: lambda mean, std, **kw: f(mean + 1, std * 2, **kw),
        aten.normal.float_float: lambda f: lambda mean, std, size, **kw: f(mean + 1, std * 2, size, **kw),
    }
    undos = [_project_override(op, make) for op, make in wrong.items()]
    return lambda: [undo() for undo in reversed(undos)]


NORMAL_OPS = (
    "aten.normal_.default",
    "aten.normal.Tensor_float",
    "aten.normal.float_Tensor",
    "aten.normal.Tensor_Tensor",
    "aten.normal.float_float",
)


def _wrong_constant():
    # hardswish as x * relu6(x + 3) / 6.5: a constant off by 8%
    aten = _aten()
    return _project_override(
        aten.hardswish.default,
        lambda sound: (
            lambda x: aten.div.Tensor(aten.mul.Tensor(x, aten.clamp.default(aten.add.Tensor(x, 3), 0, 6)), 6.5)
        ),
    )


def _dropped_stride():
    # silu's decomposition returns a contiguous result, and the trace's restride fix-up (which
    # would give it eager's strides back) is skipped: a channels-last input gives a contiguous output
    import torch

    import eagerdecomp.runtime.exact as exact

    aten = _aten()
    undo = _project_override(
        aten.silu.default,
        lambda sound: lambda x: aten.clone.default(sound(x), memory_format=torch.contiguous_format),
    )
    same = exact.same_strides
    exact.same_strides = lambda r, o: True

    def undo_all():
        exact.same_strides = same
        undo()

    return undo_all


def _swapped_parameter():
    # log_normal(mean, std) draws with the two swapped
    aten = _aten()
    return _project_override(
        aten.log_normal.default,
        lambda sound: lambda self, mean=1.0, std=2.0, **kw: sound(self, std, mean, **kw),
    )


def _ignored_decompositions():
    # EagerDecompMode(decompositions=...) builds its runtime without them
    import eagerdecomp.mode as mode

    runtime_for = mode.runtime_for
    mode.runtime_for = lambda opset, decompositions=None, *args, **kwargs: runtime_for(opset, None, *args, **kwargs)

    def undo():
        mode.runtime_for = runtime_for

    return undo


@dataclass(frozen=True)
class Mutant:
    """A defect: what it plants (``plant() -> undo``) and the pytest arguments of the tests
    that should catch it (each a separate selection: a path, then its ``-k`` expression)."""

    what: str
    plant: Callable
    tests: tuple


MUTANTS = {
    "wrong constant": Mutant(
        "hardswish's decomposition divides by 6.5 instead of 6",
        _wrong_constant,
        (
            ("tests/runtime/test_semantics.py", "non-contiguous"),
            ("tests/conformance/test_opinfo.py", "hardswish"),
        ),
    ),
    "dropped stride": Mutant(
        "silu's decomposition returns a contiguous result and the trace's restride fix-up is skipped",
        _dropped_stride,
        (("tests/runtime/test_semantics.py", "channels-last or non-contiguous"),),
    ),
    "swapped random parameter": Mutant(
        "log_normal's decomposition draws with mean and std swapped",
        _swapped_parameter,
        (("tests/decompositions/test_rng.py", "log_normal and core_aten"),),
    ),
    "ignored decompositions=": Mutant(
        "EagerDecompMode ignores its decompositions= argument",
        _ignored_decompositions,
        (
            ("tests/test_mode.py", "decompositions"),
            ("tests/decompositions/test_table.py", "precedence"),
        ),
    ),
    "normal mean + 1, std x 2": Mutant(
        "issue 50's planted defect: every normal decomposition draws N(mean + 1, 2 std)",
        plant_normal_defect,
        (
            ("tests/decompositions/test_rng.py", "normal and core_aten and not planted"),
            ("tests/conformance/test_opinfo.py", "normal and not log_normal"),
        ),
    ),
}


# -- the pytest plugin (-p tests.mutate) --------------------------------------------------------


def pytest_configure(config):
    name = os.environ.get(ENV)
    if name:
        MUTANTS[name].plant()  # for the whole process: it ends with the run


# -- the runner ----------------------------------------------------------------------------------

_OUTCOME = re.compile(r"^(FAILED|ERROR) (.+?)(?: - .*)?$")


def _run(selection, mutant: str | None) -> tuple:
    """Run one selection of tests (with ``mutant`` planted): ``(failed node ids, passed count, log)``;
    ``None`` for the ids when the selection holds no test (pytest's exit status 5)."""
    path, keyword = selection
    env = dict(os.environ)
    env.pop(ENV, None)
    if mutant:
        env[ENV] = mutant
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.mutate", "-rfE", "-n", "0", "-m", "not heavy"]
    cmd += [path, "-k", keyword]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=_root())
    out = proc.stdout + proc.stderr
    failed = [m.group(2) for line in out.splitlines() if (m := _OUTCOME.match(line))]
    passed = re.search(r"(\d+) passed", out)
    if proc.returncode == 5:
        return None, 0, out
    if proc.returncode not in (0, 1):  # the run itself broke (a usage error, an internal error)
        failed.append(f"(pytest exited {proc.returncode}: {out.strip().splitlines()[-1] if out.strip() else ''})")
    return failed, int(passed.group(1)) if passed else 0, out


def _root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(names=None, out=sys.stdout) -> dict:
    """Every defect of ``names`` (all by default): ``{name: [tests that caught it]}``, after a
    clean run of their tests; raises SystemExit(1) if the clean run fails."""
    names = list(names or MUTANTS)
    selections = sorted({s for n in names for s in MUTANTS[n].tests})
    start, empty = time.time(), set()
    for selection in selections:
        failed, passed, log = _run(selection, None)
        if failed is None:  # (a test renamed or moved: the other selections still judge)
            print(f"note: {selection} selects no test", file=out)
            empty.add(selection)
        elif failed or not passed:
            print(log, file=out)
            print(f"the clean run of {selection} fails ({failed or 'nothing ran'}): no defect can be judged", file=out)
            raise SystemExit(1)
    print(f"clean run: {len(selections) - len(empty)} selections pass ({time.time() - start:.0f} s)", file=out)
    caught = {}
    for name in names:
        t = time.time()
        runs = [_run(s, name)[0] for s in MUTANTS[name].tests if s not in empty]
        caught[name] = [node for failed in runs for node in failed or ()]
        print(f"{name}: {len(caught[name])} failing test(s) ({time.time() - t:.0f} s)", file=out, flush=True)
    _table(names, caught, out)
    return caught


def _table(names, caught, out) -> None:
    print("\n| defect planted | tests run | caught by |", file=out)
    print("|---|---|---|", file=out)
    for name in names:
        m = MUTANTS[name]
        ran = "; ".join(f"{path} -k '{k}'" for path, k in m.tests)
        files: dict = {}
        for node in caught[name]:
            files.setdefault(node.split("::")[0], []).append(node.split("::", 1)[-1])
        by = "<br>".join(
            f"{path}: {len(nodes)} failed ({nodes[0]}{', ...' if len(nodes) > 1 else ''})"
            for path, nodes in files.items()
        )
        print(f"| {name}: {m.what} | {ran} | {by or '**NOTHING: not caught**'} |", file=out)


def main(argv=None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or None
    unknown = [n for n in names or () if n not in MUTANTS]
    if unknown:
        print(f"unknown defects {unknown}; defects: {sorted(MUTANTS)}", file=sys.stderr)
        return 2
    caught = run(names)
    missed = [n for n, tests in caught.items() if not tests]
    if missed:
        print(f"\nnot caught by any test: {missed}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
