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
