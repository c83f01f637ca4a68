"""What README.md promises, each checked: the C++ library's absence (one warning, the pure-Python
path) and its just-in-time build for the reference device; ``EAGERDECOMP_DEVICES`` with a preset
and as a list; ``on_unsupported="warn"``'s results and counts; subclasses and sparse tensors
never cached; device hits served from C++ without taking the GIL. (A mode's decompositions over
``@register_decomposition`` ones: tests/decompositions/test_table.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn.functional as F

import eagerdecomp as ed
from eagerdecomp.runtime import hits, library
from eagerdecomp.testing import RecordingMode
from tests.compare import assert_like_eager

aten = torch.ops.aten

# NOTE: a fresh process without the prebuilt library: None in sys.modules makes its import fail
# as a missing file would, before eagerdecomp is imported
NO_PREBUILT = "import sys; sys.modules['eagerdecomp._C'] = None\n"


def _python(code: str, timeout=600, **env) -> dict:
    """Run ``code`` in a fresh interpreter; its last stdout line is JSON."""
    full = {**os.environ, "EAGERDECOMP_NO_EXT": "", "PYTHONWARNINGS": "", **env}
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True, text=True, timeout=timeout
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


# -- the C++ library: optional, warned about once, built just in time for the reference device ----

WITHOUT_LIBRARY = NO_PREBUILT + textwrap.dedent(
    """
    import json, warnings
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as seen:
        import torch, torch.nn.functional as F
        import eagerdecomp as ed
        from eagerdecomp.runtime import hits, library
        x = torch.randn(5, 4)
        with ed.EagerDecompMode("core_aten") as mode:
            outs = [F.silu(x), F.silu(x), torch.logsumexp(x, 1), F.mish(x.t())]
    ext = [str(w.message) for w in seen if issubclass(w.category, library.ExtensionWarning)]
    wants = [F.silu(x), F.silu(x), torch.logsumexp(x, 1), F.mish(x.t())]
    print(json.dumps({
        "warnings": ext, "loaded": library.status()["loaded"], "cpp hits": hits.enabled(),
        "calls": mode.report().row(torch.ops.aten.silu.default).calls,
        "close": all(torch.allclose(a, b) and a.stride() == b.stride() for a, b in zip(outs, wants)),
    }))
    """
)


def test_without_the_library_one_warning_and_the_python_path():
    out = _python(WITHOUT_LIBRARY)
    assert len(out["warnings"]) == 1 and "C++ library not available" in out["warnings"][0], out
    assert out["loaded"] == "missing" and out["cpp hits"] is False, out
    assert out["calls"] == 2 and out["close"], out


JIT = NO_PREBUILT + textwrap.dedent(
    """
    import json, warnings
    import torch, torch.nn.functional as F
    import eagerdecomp as ed
    from eagerdecomp.runtime import library
    from eagerdecomp.testing import reference_device
    dev = reference_device()  # no prebuilt library: compiles csrc/ into the cache folder
    ed.enable(dev)
    x = torch.randn(6, 5)
    y = F.silu(x.to(dev)).cpu()
    print(json.dumps({"loaded": library.status()["loaded"], "path": library.status()["path"],
                      "device": str(dev), "close": torch.allclose(y, F.silu(x))}))
    """
)


@pytest.mark.heavy  # compiles the C++ library (minutes): make heavy
def test_the_reference_device_builds_just_in_time(tmp_path):
    if not library.sources():
        pytest.skip("not a source checkout: no csrc/ to build")
    out = _python(JIT, timeout=1800, EAGERDECOMP_CACHE_DIR=str(tmp_path))
    assert out["loaded"] == "jit" and out["path"].startswith(str(tmp_path)), out
    assert out["device"].startswith("edref") and out["close"], out


# -- EAGERDECOMP_DEVICES: a preset per device, a comma-separated list, read at import -----------

ENV_SWITCH = textwrap.dedent(
    """
    import json
    import torch, torch.nn.functional as F
    import eagerdecomp as ed
    switch = ed.device.enabled("edref")
    x = torch.randn(8, 3)
    y = F.silu(x.to("edref").t()).cpu()
    print(json.dumps({"enabled": ed.device.enabled(), "opset": switch.settings[0],
                      "is preset": switch.runtime.opset == ed.OpSet.preset("core_aten"),
                      "close": torch.allclose(y, F.silu(x.t())) and y.stride() == F.silu(x.t()).stride()}))
    """
)


def test_environment_devices_with_a_preset():
    out = _python(ENV_SWITCH, EAGERDECOMP_DEVICES="edref=core_aten")
    assert out == {"enabled": ["edref"], "opset": "core_aten", "is preset": True, "close": True}, out


def test_environment_devices_is_a_comma_separated_list():
    # one PrivateUse1 device per process: a list whose items are all read, spaces and a repeat
    # with the same settings included
    out = _python(ENV_SWITCH, EAGERDECOMP_DEVICES=" edref=core_aten , edref=core_aten,")
    assert out["enabled"] == ["edref"] and out["opset"] == "core_aten" and out["close"], out
    # each item is read: the second one's unknown device stops the import, naming it
    r = subprocess.run(
        [sys.executable, "-c", "import eagerdecomp"],
        env={**os.environ, "EAGERDECOMP_DEVICES": "edref=core_aten,nosuchdevice"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode != 0 and "BackendError" in r.stderr and "nosuchdevice" in r.stderr, r.stderr[-2000:]


# -- on_unsupported="warn": eager's results, a warning per call, counted ------------------------


def test_on_unsupported_warn_gives_eagers_results_and_counts():
    no_mm = ed.OpSet.preset("core_aten") - ["aten::mm.default"]
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with ed.EagerDecompMode(no_mm, on_unsupported="warn") as mode:
            got = [torch.mm(a, b) for _ in range(3)] + [torch.mm(a, b.t().contiguous().t())]
    want = [torch.mm(a, b) for _ in range(3)] + [torch.mm(a, b.t().contiguous().t())]
    assert_like_eager(want, got)  # the native kernel ran: bit for bit
    texts = [str(w.message) for w in seen if "no path to the target opset" in str(w.message)]
    assert len(texts) == 4 and all(t.startswith("aten.mm.default") for t in texts), texts
    row = mode.report().row(aten.mm.default)
    assert (row.route, row.calls, row.fallthrough, row.unsupported) == ("unsupported", 4, 4, 4), row


# -- subclasses and sparse tensors: decomposed on every call, never cached -----------------------


class _Tagged(torch.Tensor):
    pass


@pytest.mark.parametrize(
    "name,make,fn,op",
    [
        ("subclass", lambda: torch.randn(4, 3).as_subclass(_Tagged), F.silu, aten.silu.default),
        ("sparse coo", lambda: torch.randn(4, 3).relu().to_sparse(), lambda t: t.t(), aten.t.default),
        (
            "sparse transpose",
            lambda: torch.randn(4, 3).relu().to_sparse(),
            lambda t: t.transpose(0, 1),
            aten.transpose.int,
        ),
    ],
)
def test_subclasses_and_sparse_tensors_are_never_cached(name, make, fn, op):
    x = make()
    size = ed.cache_info().size
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
        got = [fn(x) for _ in range(3)]
    rec.assert_only("core_aten")
    want = fn(x)
    for g in got:
        assert type(g) is type(want) and g.layout == want.layout and g.shape == want.shape
        if want.layout == torch.strided:
            assert_like_eager(want.as_subclass(torch.Tensor), g.as_subclass(torch.Tensor), exact=False)
        else:
            assert torch.equal(g.to_dense(), want.to_dense())
    row = mode.report().row(op)
    assert (row.route, row.calls, row.hits, row.traces) == ("bypassed", 3, 0, 0), row
    assert sum(row.bypassed.values()) == 3, row
    assert ed.cache_info().size == size  # nothing was cached


# -- device hits are served from C++ without taking the GIL --------------------------------------

# NOTE: the observable: this process's main thread holds the GIL throughout a poll (a Python loop
# that calls nothing that releases it, with the switch interval at 1000 s, so it is never asked
# to) while another thread's backward pass runs on edref in the autograd engine. Each silu_backward
# is a call the device has no kernel for: served by the switch. Warm (a C++ hit) it needs no GIL
# and all of them finish during the poll; cold (a miss, which calls Python) they cannot. The graph
# is kept (retain_graph): releasing tensors created in Python takes the GIL in PyTorch's engine.
NO_GIL = textwrap.dedent(
    """
    import json, sys, threading, time
    import torch, torch.nn.functional as F
    import eagerdecomp as ed
    from eagerdecomp.testing import reference_device
    dev = reference_device()
    switch = ed.enable(dev)
    x = torch.randn(64).to(dev).requires_grad_()
    N = 50
    y = x
    for _ in range(N):
        y = F.silu(y)
    loss = y.sum()
    grad = torch.ones_like(loss)
    run_backward = torch.autograd.Variable._execution_engine.run_backward

    def calls():
        row = switch.report().row(torch.ops.aten.silu_backward.default)
        return (row.calls, row.cpp_hits) if row else (0, 0)

    def during_hold(polls):
        before = calls()
        ready = threading.Event()

        def work():
            ready.set()
            run_backward((loss,), (grad,), True, False, (), allow_unreachable=True, accumulate_grad=True)

        sys.setswitchinterval(1000.0)
        try:
            t = threading.Thread(target=work)
            t.start()
            ready.wait()
            t0, now, n = time.monotonic(), before, 0
            while now[0] < before[0] + N and n < polls and time.monotonic() - t0 < 120:  # (a safety stop)
                now, n = calls(), n + 1
        finally:
            sys.setswitchinterval(0.005)
        t.join()
        after = calls()
        return [now[0] - before[0], now[1] - before[1], after[0] - before[0]]

    ed.cache_clear()
    cold = during_hold(polls=3000)  # misses: Python answers them, which needs the GIL
    from eagerdecomp.runtime.tiers import trace_after
    for _ in range(trace_after() + 2):  # warm every key, without a hold: its direct calls, its trace
        run_backward((loss,), (grad,), True, False, (), allow_unreachable=True, accumulate_grad=True)
    # (and its first replay, after which its program is installed)
    warm = during_hold(polls=10**9)
    print(json.dumps({"N": N, "cold": cold, "warm": warm}))
    """
)


@pytest.mark.skipif(not hits.enabled(), reason="the C++ hit path is not built")
def test_device_hits_are_served_without_the_gil():
    out = _python(NO_GIL)
    n, (cold_calls, _, cold_after), (warm_calls, warm_hits, warm_after) = out["N"], out["cold"], out["warm"]
    assert cold_after == n and warm_after == n, out  # every backward finished once released
    # the control: the hold starves a path that needs the GIL. NOTE: not to zero: each poll
    # (a report() call) can let the GIL go for a moment, and under a loaded machine a second miss
    # got through once; a tenth of the N hits below is still no path that runs without the GIL
    assert cold_calls < n // 10, out
    assert warm_calls == warm_hits == n, out  # and not C++ hits
