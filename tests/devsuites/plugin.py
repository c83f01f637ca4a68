"""pytest plugin for PyTorch's device suites: ``-p tests.devsuites.plugin``.

Set by the runner (:mod:`tests.devsuites.run`) through the environment:

- ``EAGERDECOMP_DEVSUITE_DEVICE``: ``cpu`` (the control), or a reference device with the
  switch: ``edref`` (core ATen, ``ed.enable("edref")``) or ``edprims`` (the prims_fusion preset);
- ``EAGERDECOMP_DEVSUITE_OUT``: a directory; each process appends one JSON line per test;
- ``EAGERDECOMP_DEVSUITE_SELECT``: optional file of generic test ids to run (one a line);
- ``EAGERDECOMP_DEVSUITE_TIMEOUT``: seconds a test may run (default 300).

pytest imports ``-p`` plugins before it imports any test module, which is what
PyTorch's test bases need: they read the PrivateUse1 backend's name at import
(``NATIVE_DEVICES``, ``device_type_test_bases``), so the device is registered here.
"""

from __future__ import annotations

import gc
import json
import os
import re
import signal
import sys
import threading
import time

import pytest

from tests.devsuites.ids import generic_id

DEVICE = os.environ.get("EAGERDECOMP_DEVSUITE_DEVICE", "cpu")
OUT = os.environ.get("EAGERDECOMP_DEVSUITE_OUT")
SELECT = os.environ.get("EAGERDECOMP_DEVSUITE_SELECT")
TIMEOUT = float(os.environ.get("EAGERDECOMP_DEVSUITE_TIMEOUT", "300"))

if DEVICE != "cpu":
    import eagerdecomp as ed
    from eagerdecomp.device.refdev import reference_device

    reference_device(DEVICE)  # edref or edprims: one reference device per process
    ed.enable(DEVICE)

import torch  # noqa: E402
import torch.autograd.forward_ad as fwAD  # noqa: E402
import torch.testing._internal.common_cuda as common_cuda  # noqa: E402
import torch.testing._internal.common_mkldnn as common_mkldnn  # noqa: E402
import torch.testing._internal.common_nn as common_nn  # noqa: E402
import torch.testing._internal.common_utils as common_utils  # noqa: E402
from torch.testing._internal.common_device_type import DeviceTypeTestBase  # noqa: E402
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack  # noqa: E402

# Helper names the 2.4.0 files import that moved or were renamed since (same meaning).
_ALIASES = {
    common_utils: {"skipIfMps": lambda: common_utils.skipIfMPS},
    common_nn: {"new_module_tests": common_nn.get_new_module_tests},
    # 2.4's CUDA check (Ampere's TF32); no CUDA here, so never
    common_cuda: {"tf32_is_not_fp32": lambda: lambda: False},
    common_mkldnn: {
        "bf32_on_and_off": lambda: lambda bf32_precision=1e-2: common_mkldnn.reduced_f32_on_and_off(bf32_precision)
    },
}
for _module, _names in _ALIASES.items():
    for _name, _make in _names.items():
        if not hasattr(_module, _name):
            setattr(_module, _name, _make())


def pytest_collection_modifyitems(config, items):
    # only the device-type tests (instantiate_device_type_tests): the rest are CPU-only
    wanted = None
    if SELECT:
        with open(SELECT) as f:
            wanted = {line.strip() for line in f if line.strip() and not line.startswith("#")}
    keep, drop = [], []
    for item in items:
        ok = item.cls is not None and issubclass(item.cls, DeviceTypeTestBase)
        if ok:
            item.generic_id = generic_id(item.path.name, item.cls.__name__, item.name, DEVICE)
            ok = wanted is None or item.generic_id in wanted
        (keep if ok else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    if OUT:  # what this device instantiated: a test with no result line then crashed its worker
        os.makedirs(OUT, exist_ok=True)
        with open(os.path.join(OUT, f"collected-{os.getpid()}.json"), "w") as f:
            json.dump([item.generic_id for item in keep], f)


# -- the dispatch state every test must leave as it found it ---------------------------
_KEYS = [k for k in torch._C.DispatchKey.__members__.values()]


def _keys(test) -> frozenset:
    return frozenset(k.name for k in _KEYS if test(k))


def dispatch_state() -> dict:
    """What a caught exception must never change: autograd, the TLS key sets, modes."""
    return {
        "grad mode": torch.is_grad_enabled(),
        "forward grad": torch._C._is_fwd_grad_enabled(),
        "inference mode": torch.is_inference_mode_enabled(),
        "included keys": _keys(torch._C._dispatch_tls_is_dispatch_key_included),
        "excluded keys": _keys(torch._C._dispatch_tls_is_dispatch_key_excluded),
        "dispatch modes": len(_get_current_dispatch_mode_stack()),
        "function modes": torch._C._len_torch_function_stack(),
        "forward AD level": fwAD._current_level,
    }


def _diff(before: dict, after: dict) -> str:
    out = []
    for name, was in before.items():
        now = after[name]
        if now != was:
            if isinstance(was, frozenset):
                now = f"+{sorted(now - was)} -{sorted(was - now)}"
            out.append(f"{name}: {was} -> {now}" if not isinstance(was, frozenset) else f"{name}: {now}")
    return "; ".join(out)


def _restore(state: dict) -> None:
    """Put the state back so that one test's leak is charged to it alone."""
    torch.set_grad_enabled(state["grad mode"])
    torch._C._set_fwd_grad_enabled(state["forward grad"])
    for key in _KEYS:
        torch._C._dispatch_tls_set_dispatch_key_included(key, key.name in state["included keys"])
        torch._C._dispatch_tls_set_dispatch_key_excluded(key, key.name in state["excluded keys"])
    while len(_get_current_dispatch_mode_stack()) > state["dispatch modes"]:
        torch._C._pop_torch_dispatch_stack()
    while torch._C._len_torch_function_stack() > state["function modes"]:
        torch._C._pop_torch_function_stack()
    fwAD._current_level = state["forward AD level"]


# -- one JSON line per test --------------------------------------------------------------
_NOT_IMPLEMENTED = re.compile(r"Could not run '([\w:.]+)' with arguments from the '(\w+)' backend")


def _op_of(exc) -> str | None:
    op = getattr(exc, "op", None)  # eagerdecomp's UnsupportedOpError
    if op is not None:
        return str(op)
    m = _NOT_IMPLEMENTED.search(str(exc))
    return m.group(1).replace("::", ".") if m else None


def _first_line(text: str, limit: int = 400) -> str:
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""


class _Timeout(BaseException):
    """Raised into a test that runs past EAGERDECOMP_DEVSUITE_TIMEOUT (a BaseException, so
    that a test's own ``except Exception`` cannot swallow it)."""


def _on_alarm(signum, frame):
    raise _Timeout(f"test ran past {TIMEOUT:.0f} s")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    timed = threading.current_thread() is threading.main_thread()
    if timed:
        previous = signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, TIMEOUT)
    try:
        return (yield)
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    record = item.__dict__.setdefault("_devsuite", {})
    if report.outcome != "passed" and "outcome" not in record:
        record["outcome"] = "skipped" if report.skipped else "failed"
        record["phase"] = call.when
        if call.excinfo is not None:
            exc = call.excinfo.value
            record["error"] = "Timeout" if isinstance(exc, _Timeout) else type(exc).__name__
            message = str(exc) if not report.skipped else str(getattr(exc, "msg", exc))
            record["message"] = _first_line(message)
            record["op"] = _op_of(exc)
    return report


_written = None


def _sink():
    global _written
    if _written is None:
        os.makedirs(OUT, exist_ok=True)
        _written = open(os.path.join(OUT, f"{DEVICE}-{os.getpid()}.jsonl"), "a", buffering=1)
    return _written


_baseline: dict = {}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _baseline:
        _baseline.update(dispatch_state())
    t0 = time.perf_counter()
    result = yield
    # NOTE: a leak shows when the failed test's traceback is freed (its frames may hold
    # guards); pytest keeps the last one in sys.last_* for post-mortem debugging
    sys.last_type = sys.last_value = sys.last_traceback = None
    if hasattr(sys, "last_exc"):
        sys.last_exc = None
    gc.collect()
    after = dispatch_state()
    record = item.__dict__.get("_devsuite", {})
    record.setdefault("outcome", "passed")
    if after != _baseline:
        record["state"] = _diff(_baseline, after)
        _restore(_baseline)
    record.update(id=getattr(item, "generic_id", item.nodeid), seconds=round(time.perf_counter() - t0, 3))
    if OUT:
        _sink().write(json.dumps(record) + "\n")
    return result
