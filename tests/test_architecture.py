"""The architecture's promises: routes recorded once, cache entries that pin nothing, a
module graph without cycles, the logger and profiler ranges, the C++ library's version check."""

from __future__ import annotations

import ast
import gc
import logging
import os
import pathlib
import subprocess
import sys
import traceback
import types
import warnings
import weakref

import pytest
import torch

import eagerdecomp as ed
from eagerdecomp.errors import UnsupportedOpError
from eagerdecomp.profile import profile
from eagerdecomp.runtime import library as _ext

PACKAGE = pathlib.Path(ed.__file__).parent


# -- a call's route is recorded once, and the profiler reads it -------------------------------


@pytest.mark.usefixtures("trace_first")  # what a trace does (its log line, its profiler range, a remembered bypass)
def test_remembered_bypass_is_profiled_under_eager_never_replay():
    ed.cache_clear()

    def twice(x):
        torch.histc(x, 4)  # its trace needs a data value: a remembered bypass (a negative entry)
        return torch.histc(x, 4)

    p = profile(twice, torch.randn(32))
    routes = p.by_op["aten.histc.default"]
    assert set(routes) == {"eager"} and routes["eager"][0] == 2
    assert ed.cache_info().negative >= 1 and p.calls["replay"] == 0


# -- cache entries are data: no exception, no frame, no tensor ---------------------------------


def _refused_call():
    a = torch.eye(3) + 1  # only this frame holds it
    try:
        with ed.EagerDecompMode("core_aten"):
            torch.linalg.eigh(a)  # no path to core ATen
    except UnsupportedOpError as e:
        return weakref.ref(a), e
    raise AssertionError("eigh found a path: pick another op with none")


def test_tensors_of_a_refused_call_are_freed_while_the_entry_stays():
    ed.cache_clear()
    ref, error = _refused_call()
    del error
    gc.collect()
    assert ref() is None
    assert ed.cache_info().negative == 1


def test_raising_the_same_refusal_does_not_grow_its_traceback():
    ed.cache_clear()
    depths = []
    a = torch.eye(3) + 1
    for _ in range(100):
        try:
            with ed.EagerDecompMode("core_aten"):
                torch.linalg.eigh(a)
        except UnsupportedOpError as e:
            depths.append(len(traceback.extract_tb(e.__traceback__)))
    assert len(depths) == 100 and depths[-1] == depths[1]


# -- the module graph ---------------------------------------------------------------------------


def _imports() -> list:
    """``(importer, imported module, names)`` for every import statement of the package,
    function-level ones included (a lazy import closes a cycle as well as any)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    out = []
    for name, (path, is_pkg) in modules.items():
        package = name if is_pkg else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if not target.startswith("eagerdecomp"):
                    continue
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    out.append((name, sub, ()) if sub in modules else (name, target, (a.name,)))
            elif isinstance(node, ast.Import):
                out += [(name, a.name, ()) for a in node.names if a.name.startswith("eagerdecomp.")]
    return [(i, t, n) for i, t, n in out if t in modules], set(modules)


def _module_graph() -> dict:
    """``{module: modules importing it runs}``: a submodule's import runs its packages'
    ``__init__`` too (all but the top package's, which every import starts from)."""
    imports, modules = _imports()
    graph = {m: set() for m in modules}
    for importer, target, _ in imports:
        parts = target.split(".")
        for k in range(2, len(parts) + 1):
            dep = ".".join(parts[:k])
            if dep != importer and dep in modules and not importer.startswith(dep + "."):
                graph[importer].add(dep)
    return graph


def test_no_import_cycle_between_modules():
    graph = _module_graph()
    assert "eagerdecomp.runtime.core" in graph and "eagerdecomp.coverage.graph" in graph
    state: dict = {}

    def visit(m, path):
        state[m] = "open"
        for d in sorted(graph[m]):
            if state.get(d) == "open":
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(d) :] + [d]))
            if d not in state:
                visit(d, path + [d])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def _subpackage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else ""  # top-level modules are the front door's


def test_no_private_name_is_imported_across_subpackages():
    imports, modules = _imports()
    crossing = sorted(
        f"{importer} imports {target}.{name}"
        for importer, target, names in imports
        for name in names
        if name.startswith("_")
        and not name.startswith("__")
        and name != "_C"  # _C: the C++ library (runtime.library)
        and _subpackage(importer) != _subpackage(target + ".x" if target in modules and modules else target)
    )
    assert not crossing, crossing


def test_the_layers_import_only_downwards():
    # ops: facts about ATen ops; decompositions: tables of functions over them; runtime: the
    # machinery; then the device, dynamo and coverage sides and the front door over all of it
    layers = {"ops": 0, "decompositions": 1, "runtime": 2, "device": 3, "dynamo": 3, "coverage": 4}
    graph = _module_graph()
    upward = sorted(
        f"{m} -> {d}"
        for m, deps in graph.items()
        for d in deps
        if _subpackage(m) in layers and _subpackage(d) in layers and layers[_subpackage(d)] > layers[_subpackage(m)]
    )
    assert not upward, upward


def test_runtime_imports_nothing_of_the_coverage_tool():
    graph = _module_graph()
    runtime_side = [m for m in graph if not m.startswith("eagerdecomp.coverage") and m not in ("eagerdecomp.__main__",)]
    assert not [m for m in runtime_side if any(d.startswith("eagerdecomp.coverage") for d in graph[m])]


# -- seen where PyTorch users look --------------------------------------------------------------


@pytest.mark.usefixtures("trace_first")  # what a trace does (its log line, its profiler range, a remembered bypass)
def test_traces_and_refusals_go_to_the_eagerdecomp_logger(caplog):
    ed.cache_clear()
    with caplog.at_level(logging.INFO, logger="eagerdecomp"):
        with ed.EagerDecompMode("core_aten"):
            torch.nn.functional.silu(torch.randn(8))
            torch.nn.functional.silu(torch.randn(8))  # a replay logs nothing
            torch.histc(torch.randn(8), 3)
    messages = [r.getMessage() for r in caplog.records if r.name == "eagerdecomp"]
    assert sum("aten.silu.default: traced" in m for m in messages) == 1
    assert any("aten.histc.default" in m and "needs a data value" in m for m in messages)


@pytest.mark.usefixtures("trace_first")  # what a trace does (its log line, its profiler range, a remembered bypass)
@pytest.mark.parametrize("level", [None, "info"])
def test_the_logger_is_quiet_unless_asked(level):
    script = (
        "import torch, eagerdecomp as ed\n"
        "with ed.EagerDecompMode('core_aten'):\n    torch.nn.functional.silu(torch.randn(4))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "EAGERDECOMP_LOG"} | (
        {"EAGERDECOMP_LOG": level} if level else {}
    )
    err = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300).stderr
    assert ("[eagerdecomp INFO] aten.silu.default: traced" in err) == (level is not None)


@pytest.mark.usefixtures("trace_first")  # what a trace does (its log line, its profiler range, a remembered bypass)
def test_decomposed_calls_show_as_profiler_ranges():
    ed.cache_clear()
    x = torch.randn(8)
    with torch.profiler.profile() as prof, ed.EagerDecompMode("core_aten"):
        torch.nn.functional.silu(x)
        torch.nn.functional.silu(x)
        torch.histc(x, 3)
    names = [e.name for e in prof.events()]
    assert names.count("eagerdecomp.trace aten.silu.default") == 1
    assert names.count("eagerdecomp.replay aten.silu.default") == 2  # the traced call runs its kernel too
    assert "eagerdecomp.eager aten.histc.default" in names


# -- the C++ library says when it was built for another torch ------------------------------------


@pytest.fixture
def fresh_ext(monkeypatch):
    monkeypatch.setattr(_ext, "_state", {k: None for k in _ext._state} | {"loaded": "not loaded"})
    monkeypatch.delenv("EAGERDECOMP_NO_EXT", raising=False)
    return _ext


@pytest.mark.parametrize("built", ["1.13.0", None])
def test_a_library_built_for_another_torch_is_not_used(fresh_ext, monkeypatch, built):
    stale = types.ModuleType("eagerdecomp._C")
    if built is not None:
        stale.BUILT_WITH_TORCH = built
    monkeypatch.setitem(sys.modules, "eagerdecomp._C", stale)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert fresh_ext.load() is None
        assert fresh_ext.load() is None  # warned once, not per call
    texts = [str(w.message) for w in caught if issubclass(w.category, _ext.ExtensionWarning)]
    assert len(texts) == 1 and f"built against torch {built}" in texts[0] and torch.__version__ in texts[0]
    assert fresh_ext.status()["built_with"] == built


def test_a_library_built_for_this_torch_is_used(fresh_ext, monkeypatch):
    lib = types.ModuleType("eagerdecomp._C")
    lib.BUILT_WITH_TORCH = torch.__version__.split("+")[0]
    monkeypatch.setitem(sys.modules, "eagerdecomp._C", lib)
    assert fresh_ext.load() is lib and fresh_ext.status()["loaded"] == "prebuilt"
