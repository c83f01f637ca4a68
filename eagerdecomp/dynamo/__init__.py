"""The ``torch.compile`` backend: captured graphs lowered to the opset with the mode's table
(:mod:`~eagerdecomp.dynamo.backend`; ``torch.compile(model, backend="eagerdecomp")``)."""

from eagerdecomp.dynamo.backend import (
    EagerDecompBackend,
    LoweredGraph,
    compile_backend,
    default_backend,
    dynamo_backend,
)

__all__ = ["compile_backend", "EagerDecompBackend", "LoweredGraph", "dynamo_backend", "default_backend"]
