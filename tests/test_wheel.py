"""The package as users get it: a wheel built from a clean copy, installed away from the checkout.

The editable install that ``make`` uses and every test run from the checkout hide packaging
mistakes (a subpackage or data file left out of the wheel), so this builds a wheel from a copy of
the tracked files only, installs it into a fresh folder, and runs it with ``python -S`` and an
explicit path: the checkout and the editable install are out of reach.

``make test`` builds a pure-Python wheel (seconds) and places the checkout's compiled library into
the install, standing for the C++ build; ``make wheel`` (``EAGERDECOMP_WHEEL=full``) builds an sdist,
then the wheel from the sdist with its C++ library compiled (minutes), and checks the same things.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

# NOTE: one xdist worker builds the wheel once for the module (make test runs --dist loadgroup)
pytestmark = pytest.mark.xdist_group("wheel")

ROOT = Path(__file__).resolve().parent.parent
FULL = os.environ.get("EAGERDECOMP_WHEEL") == "full"
SUBPACKAGES = [
    "eagerdecomp",
    "eagerdecomp.coverage",
    "eagerdecomp.decompositions",
    "eagerdecomp.device",
    "eagerdecomp.dynamo",
    "eagerdecomp.ops",
    "eagerdecomp.runtime",
]

# what the installed package must do, run in a fresh interpreter outside the checkout
CHECK = r"""
import importlib, os, pkgutil, sys, warnings
import torch
import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode

site = sys.argv[1]
assert ed.__file__.startswith(site), ("imported from", ed.__file__)
skip = (".__main__", ".demo", ".backend")  # the CLI and demo run on import; the alias warns (below)
names = [m.name for m in pkgutil.walk_packages(ed.__path__, "eagerdecomp.") if not m.name.endswith(skip)]
for name in names:
    importlib.import_module(name)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    importlib.import_module("eagerdecomp.backend")
assert any(issubclass(x.category, DeprecationWarning) for x in w), "eagerdecomp.backend must warn"

x = torch.randn(4, 8)
with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
    y = torch.nn.functional.silu(x)
rec.assert_only("core_aten")
torch.testing.assert_close(y, torch.nn.functional.silu(x))  # to rounding: a chain of core ops
assert mode.report().row("aten.silu.default").route == "decomposed"

from eagerdecomp.runtime import library
print("library", library.status()["loaded"])
if library.load() is not None:
    dev = ed.testing.reference_device()
    ed.enable(dev)
    try:
        z = torch.nn.functional.silu(x.to(dev))
        torch.testing.assert_close(z.cpu(), y)
    finally:
        ed.disable(dev)
    print("reference device ok")
print("imported", len(names), "modules; ok")
"""


def _run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


def _clean_copy(dest: Path) -> Path:
    """The tracked files of the working tree (as edited, not as committed): no build/, no .so."""
    files = _run(["git", "ls-files", "-z"], cwd=ROOT).split("\0")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to make a clean copy from")
    tmp = tmp_path_factory.mktemp("wheel")
    src, dist, site = _clean_copy(tmp / "src"), tmp / "dist", tmp / "site"
    pip = [sys.executable, "-m", "pip", "-q"]
    env = dict(os.environ)
    if FULL:  # the sdist, then the wheel from the sdist: the C++ library built from its sources
        _run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp / "sdist")], cwd=src)
        (sdist,) = glob.glob(str(tmp / "sdist" / "*.tar.gz"))
        _run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), sdist], env=env)
    else:
        env["EAGERDECOMP_NO_EXT"] = "1"  # pure Python: seconds, not minutes
        _run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)], env=env)
    (wheel,) = glob.glob(str(dist / "eagerdecomp-*.whl"))
    _run([*pip, "install", "--no-deps", "--no-index", "--target", str(site), wheel])
    if not FULL:
        # NOTE: the checkout's compiled library stands for the C++ build that make wheel does
        for lib in glob.glob(str(ROOT / "eagerdecomp" / "_C*.so")):
            shutil.copy2(lib, site / "eagerdecomp")
    return Path(wheel), site


def _env(site: Path) -> dict:
    # torch and the other dependencies from their own folder; the editable install's .pth
    # finder lives there too, but python -S never reads .pth files
    deps = str(Path(torch.__file__).resolve().parent.parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return env | {"PYTHONPATH": os.pathsep.join([str(site), deps]), "EAGERDECOMP_DISK_CACHE": "0"}


def test_the_wheel_holds_every_subpackage_its_data_and_entry_points(installed):
    wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    for pkg in SUBPACKAGES:
        assert pkg.replace(".", "/") + "/__init__.py" in names, f"{pkg} missing from {wheel.name}"
    assert "eagerdecomp/coverage/data/models.json" in names
    assert "eagerdecomp/coverage/data/graph.json.gz" in names  # the coverage tool's graph, prebuilt
    assert not any(n.startswith(("tests/", "bench/")) for n in names)
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "eagerdecomp.__main__:main" in text and "eagerdecomp.dynamo.backend:dynamo_backend" in text
    assert any(n.startswith("eagerdecomp/_C") for n in names) == FULL


def test_the_installed_package_runs_outside_the_checkout(installed, tmp_path):
    _, site = installed
    out = _run([sys.executable, "-S", "-c", CHECK, str(site)], cwd=tmp_path, env=_env(site))
    assert out.strip().endswith("ok")
    if glob.glob(str(site / "eagerdecomp" / "_C*.so")):
        assert "library prebuilt" in out and "reference device ok" in out, out


def test_the_installed_commands_run_outside_the_checkout(installed, tmp_path):
    _, site = installed
    env = _env(site)
    info = _run([sys.executable, "-S", "-m", "eagerdecomp.info"], cwd=tmp_path, env=env)
    assert str(site) in info
    assert "coverage" in _run([sys.executable, "-S", "-m", "eagerdecomp", "--help"], cwd=tmp_path, env=env)
    # the console script pip wrote, run by this interpreter with -S (its shebang would read .pth files)
    script = site / "bin" / "eagerdecomp"
    out = _run([sys.executable, "-S", str(script), "coverage", "--models", "--summary"], cwd=tmp_path, env=env)
    assert "Ops to add to run a share of the models" in out


def test_the_installed_coverage_tool_answers_from_the_shipped_graph(installed, tmp_path):
    from eagerdecomp.coverage.graph import read_shipped

    if read_shipped()[0] is None:
        pytest.skip("the shipped graph is stale (tests/coverage/test_shipped.py says so): it would build for minutes")
    _, site = installed
    cache = tmp_path / "cache"  # empty: a fresh install's first command
    env = _env(site) | {"EAGERDECOMP_CACHE_DIR": str(cache)}
    cmd = [sys.executable, "-S", "-m", "eagerdecomp", "coverage", "--summary", "--top", "3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("core_aten (") and "Implement next" in proc.stdout, proc.stdout
    assert "building the coverage graph" not in proc.stderr, proc.stderr[-3000:]
    assert not list(cache.rglob("coverage-*.json"))  # read from the package, nothing built


# the demo's first training step in a fresh process: its kernels traced (every key at its first call)
FIRST_STEP = r"""
import sys, torch
import eagerdecomp as ed
from eagerdecomp.demo import TransformerBlock, train_step
assert ed.__file__.startswith(sys.argv[1]), ("imported from", ed.__file__)
torch.manual_seed(0)
model = TransformerBlock()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = TransformerBlock.batch()
with ed.EagerDecompMode("core_aten"):
    loss = float(train_step(model, opt, x, y)[1])
print(ed.cache_info().traced, repr(loss), float(sum(p.sum() for p in model.parameters())))
"""


def test_the_wheel_ships_a_bundle_that_leaves_the_demos_first_step_nothing_to_trace(installed, tmp_path):
    wheel, site = installed
    assert "eagerdecomp/data/bundle/bundle.json" in zipfile.ZipFile(wheel).namelist()
    runs = {}
    for shipped in ("1", "0"):
        env = _env(site) | {
            "EAGERDECOMP_CACHE_DIR": str(tmp_path / shipped),  # empty: a fresh install's first process
            "EAGERDECOMP_DISK_CACHE": "1",
            "EAGERDECOMP_TRACE_AFTER": "0",  # (every key not in the bundle would be traced)
            "EAGERDECOMP_SHIPPED_BUNDLE": shipped,
        }
        if not FULL:  # a pure-Python wheel: its bundle keys calls as the pure-Python path does
            env["EAGERDECOMP_NO_EXT"] = "1"
        out = _run([sys.executable, "-S", "-c", FIRST_STEP, str(site)], cwd=tmp_path, env=env)
        traced, *results = out.split()
        runs[shipped] = int(traced), results
    assert runs["1"][0] == 0 and runs["0"][0] > 0, runs
    assert runs["1"][1] == runs["0"][1]  # the shipped kernels are the ones a trace makes: bit for bit
