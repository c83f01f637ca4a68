"""The one error hierarchy of eagerdecomp.

Every message names the op, what was expected, what was found, and what to do.

NOTE: :class:`EagerDecompError` derives from RuntimeError on purpose: PyTorch's own errors are
RuntimeErrors, and code that catches RuntimeError around eager calls keeps working under the mode
(:class:`UnsupportedOpError` is a NotImplementedError too, as eager's missing-kernel error). The
price: ``isinstance(e, RuntimeError)`` cannot tell eager's error from ours, so a check that eager's
error surfaces compares the exact type (``type(e) is type(eager_e)``; tests/compare.py).
"""

__all__ = [
    "EagerDecompError",
    "UnknownOpError",
    "UnsupportedOpError",
    "UnsupportedArgumentError",
    "DeviceMismatchError",
    "TraceError",
    "MismatchError",
    "BackendError",
]


class EagerDecompError(RuntimeError):
    """Base class of every error raised by eagerdecomp."""


class UnknownOpError(EagerDecompError, ValueError):
    """An op name in an opset or table does not name any registered operator."""


class UnsupportedOpError(EagerDecompError, NotImplementedError):
    """An op has no path to the target opset (``chain`` says where it got stuck).

    ``hint`` adds a remedy that only some callers can offer (the dispatch mode's
    ``on_unsupported='fallthrough'``; a device or a compiled graph has no native op to fall to).
    """

    def __init__(self, op, chain=(), reason="no decomposition", hint=None):
        self.op, self.chain, self.reason, self.hint = op, tuple(chain), reason, hint
        path = " -> ".join(str(o) for o in self.chain) or str(op)
        super().__init__(
            f"{op} has no path to the target opset: {path}: {reason}. "
            "Add the blocking op to the opset or register a decomposition for it with "
            "eagerdecomp.register_decomposition" + (f"; {hint}" if hint else "") + "."
        )

    def with_hint(self, hint: str) -> "UnsupportedOpError":
        return UnsupportedOpError(self.op, self.chain, self.reason, hint)


class UnsupportedArgumentError(EagerDecompError, TypeError):
    """An op was called with an argument eagerdecomp cannot key or replay."""


class DeviceMismatchError(EagerDecompError):
    """Tensor arguments of one call live on devices that eager would not mix."""


class TraceError(EagerDecompError):
    """Tracing a decomposition into a kernel failed for a reason other than a missing path."""


class MismatchError(EagerDecompError):
    """A decomposition or replay produced outputs whose metadata differ from the op's own."""


class BackendError(EagerDecompError):
    """Misuse of the device switch (unknown device, enable twice, opset op without a kernel)."""
