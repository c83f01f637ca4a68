"""README and docs/ stay true as the code changes: short README, links and paths that exist,
every environment variable documented, measured tables rendered from the benchmarks' JSON."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_and_paths_in_the_docs_exist(page):
    text = page.read_text()
    missing = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):  # relative Markdown links
        if not target.startswith(("http://", "https://")) and not (page.parent / target).exists():
            missing.append(target)
    for path in re.findall(r"`((?:eagerdecomp|tests|bench|csrc)/[\w/.-]+\.(?:py|cpp|h|txt|json))`", text):
        if not (ROOT / path).exists():
            missing.append(path)
    assert not missing, f"{page.name} names what does not exist: {missing}"


def test_every_environment_variable_the_package_reads_is_documented():
    read = set()
    for src in (ROOT / "eagerdecomp").rglob("*.py"):
        read |= set(re.findall(r"\"(EAGERDECOMP_[A-Z_]+)\"", src.read_text()))
    documented = (ROOT / "docs" / "operations.md").read_text()
    assert read and not {v for v in read if v not in documented}, sorted(v for v in read if v not in documented)


def test_measured_tables_are_rendered_from_the_benchmarks_json():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "render.py"), "--check"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- the docstrings' examples run ----------------------------------------------------------------


def _modules_with_examples() -> list:
    names = []
    for path in sorted((ROOT / "eagerdecomp").rglob("*.py")):
        if ">>>" in path.read_text():
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.mark.parametrize("module", _modules_with_examples())
def test_docstring_examples_run(module):
    import doctest
    import importlib

    import torch

    from eagerdecomp.errors import BackendError

    if module == "eagerdecomp.device.refdev":
        from eagerdecomp.testing import reference_device

        try:
            reference_device()
        except BackendError as e:  # no C++ library here (EAGERDECOMP_NO_EXT=1): no device to show
            pytest.skip(str(e))
    found = doctest.DocTestFinder().find(importlib.import_module(module), module)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list = []
    try:
        for test in found:
            # NOTE: each example's globals are kept until dynamo has let go of what it compiled
            # in them: cleared first, they made dynamo's weakref callbacks fail at exit
            runner.run(test, out=report.append, clear_globs=False)
    finally:
        torch._dynamo.reset()
    results = runner.summarize(verbose=False)
    assert results.attempted, f"{module} has '>>>' but no example doctest finds"
    assert not results.failed, "".join(report)
