"""EagerDecompMode: run any PyTorch program so that only opset ops reach the kernels below.

Example::

    >>> import torch, eagerdecomp as ed
    >>> x = torch.randn(4, 4)
    >>> with ed.EagerDecompMode("core_aten") as mode:
    ...     y = torch.nn.functional.silu(x)          # silu is not core: decomposed
    >>> torch.allclose(y, torch.nn.functional.silu(x))  # exact to rounding, not bitwise
    True
    >>> mode.report().row(torch.ops.aten.silu.default).route
    'decomposed'
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping

from torch.utils._python_dispatch import TorchDispatchMode

try:  # dynamo's frame hook (see EagerDecompMode._should_skip_dynamo)
    from torch._C._dynamo import eval_frame as _frames

    _hook, _set_hook = _frames.get_eval_frame_callback, _frames.set_eval_frame
    _set_strategy = _frames.set_code_exec_strategy
    _SKIP = _frames._FrameExecStrategy(_frames._FrameAction.SKIP, _frames._FrameAction.DEFAULT)
    _OWN_WRAPPER = False
except (ImportError, AttributeError):  # a torch without them: its own wrapper does the same
    _hook, _OWN_WRAPPER = (lambda: None), True

from eagerdecomp.ops.opset import OpSet
from eagerdecomp.runtime import keymode
from eagerdecomp.runtime.core import runtime_for
from eagerdecomp.runtime.routes import defers_to_subclass

__all__ = ["EagerDecompMode"]

# NOTE: dynamo takes every mode off the stack while it compiles (ignore_compile_internals), so
# the compile backend finds the mode it was called under here: entered, per thread.
_entered = threading.local()


class EagerDecompMode(TorchDispatchMode):
    """A dispatch mode that decomposes every op outside ``opset``.

    Args:
        opset: ``"core_aten"``, ``"prims"``, an :class:`OpSet`, or an iterable of
            ops or op names. Ops in it pass straight through, untouched.
        decompositions: extra ``{OpOverload: fn}`` entries for this mode; they
            take precedence over every other table.
        on_unsupported: what to do with an op that has no path to the opset:
            ``"error"`` (raise :class:`UnsupportedOpError`), ``"warn"`` or
            ``"fallthrough"`` (run it natively; counted in the report), or ``"cpu"``: on an
            accelerator, run the CPU's kernel on host copies (:mod:`eagerdecomp.runtime.host`);
            on CPU tensors that is ``"fallthrough"``.
        compile: None (replay kernels as traced), ``"inductor"`` or a graph compiler
            ``fn(graph_module, example_inputs) -> callable``: a kernel replayed often is
            compiled once per key and the compiled callable answers from then on
            (:mod:`eagerdecomp.compiled` says which kernels qualify).

    Kernels are traced once per key and cached process-wide per (opset,
    table), so a second mode over the same opset starts warm.

    Entering it puts a C++ dispatch key on in this thread (:mod:`eagerdecomp.runtime.keymode`):
    opset ops and cache hits then run with no Python at all. Where that path cannot serve
    (no C++ library, ``compile=``, a Python dispatch mode already active, a profiler
    recording, this mode nested in another) it is the Python ``TorchDispatchMode`` below,
    with the same results; :attr:`path` and ``report().paths`` say which ran.
    """

    def __init__(
        self,
        opset: str | OpSet | Iterable = "core_aten",
        *,
        decompositions: Mapping | None = None,
        on_unsupported: str = "error",
        compile=None,
    ):
        super().__init__()
        self.runtime = runtime_for(opset, decompositions, on_unsupported, compile)
        self.runtime.hint = "or pass on_unsupported='fallthrough' to EagerDecompMode to run it natively"
        self.opset = self.runtime.opset
        self._ops = self.opset.ops
        self._dispatch: Callable = self.runtime
        self._passed = self.runtime.stats.pass_counters(self._ops)  # opset op -> its call counter
        self._entered = threading.local()  # per thread: a stack of key tokens (None: the Python path)
        self.path = None  # the path of the latest entry: "C++ key" or "Python: <why>"

    def __enter__(self):
        reason = keymode.python_reason(self.runtime)
        stack = self._entered.__dict__.setdefault("tokens", [])
        if reason is None:
            stack.append(keymode.enter(self.runtime))
            self.path = "C++ key"
        else:
            keymode.entered_python(reason)
            super().__enter__()
            stack.append(None)
            self.path = f"Python: {reason}"
        self.runtime.stats.paths[self.path] += 1
        _entered.__dict__.setdefault("modes", []).append(self)
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        modes = _entered.modes
        for i in range(len(modes) - 1, -1, -1):  # the innermost entry of this mode
            if modes[i] is self:
                del modes[i]
                break
        token = self._entered.tokens.pop()
        if token is None:
            return super().__exit__(exc_type, exc_val, exc_tb)
        keymode.leave(token)
        return None

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # NOTE: TorchDispatchMode wraps a subclass's __torch_dispatch__ so that dynamo's frame
        # hook (set while compiled code runs) never traces into it; the wrapper costs about 1 us
        # a call, a fifth of a do-nothing mode. Eager code has no hook set, so we check for one
        # (one C call) and do what the wrapper does only then: our frame is one dynamo skips
        # (below the class), and everything it calls runs with the hook off.
        return _OWN_WRAPPER

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # NOTE: only routes. Opset ops are the hot path: one dict lookup, then the op.
        if _hook() is not None:  # inside compiled code or a graph break
            prior = _set_hook(None)
            try:
                return self.__torch_dispatch__(func, types, args, kwargs)
            finally:
                _set_hook(prior)
        if types and defers_to_subclass(types):
            # NOTE: a tensor subclass with its own dispatch (DTensor) runs first, with this mode
            # still active: its sharding propagation sees the op the user called, and the local
            # ops it runs come back here as plain tensors.
            return NotImplemented
        count = self._passed.get(func)
        if count is not None:  # an opset op (every one has a counter)
            next(count)
            return func(*args, **(kwargs or {}))
        return self._dispatch(func, args, kwargs or {})

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # NOTE: a mode returning False here (TorchDispatchMode's default) makes dynamo skip
        # every frame while it is active, so torch.compile would silently run eagerly. True
        # lets dynamo compile with the mode switched off; the compiled artifact then runs
        # with it on again, so ops a compiled graph still holds outside the opset (any
        # backend other than eagerdecomp's) are decomposed here, as are graph breaks.
        return True

    @staticmethod
    def active() -> EagerDecompMode | None:
        """The innermost mode entered in this thread and not yet exited, or None; still answers
        while dynamo compiles, when no mode is on the dispatch stack."""
        modes = _entered.__dict__.get("modes")
        return modes[-1] if modes else None

    def report(self):
        """Per-op :class:`~eagerdecomp.stats.Report` of everything this mode saw."""
        return self.runtime.stats.report()

    def __repr__(self) -> str:
        return f"EagerDecompMode({self.opset!r}, on_unsupported={self.runtime.on_unsupported!r})"


if not _OWN_WRAPPER:  # dynamo's hook passes this frame by (it turns the hook off for the rest)
    _set_strategy(EagerDecompMode.__torch_dispatch__.__code__, _SKIP)
