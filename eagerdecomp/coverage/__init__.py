"""The coverage tool: which aten ops, and which models, reach a given opset.

Imported by nothing in the runtime. Its modules:

* :mod:`~eagerdecomp.coverage.graph`: the one-level decomposition graph, built on sample
  inputs (:mod:`~eagerdecomp.coverage.inputs`) in crash-guarded workers
  (:mod:`~eagerdecomp.coverage.workers`) and cached under ``cache_dir("coverage")``;
* :mod:`~eagerdecomp.coverage.analysis`: per op, in the opset / reaches / no path /
  undetermined, and what to implement next;
* :mod:`~eagerdecomp.coverage.page`: the same answers as one static HTML page.

Example::

    >>> import eagerdecomp.coverage as cov
    >>> report = cov.analyse(cov.load_graph(), "core_aten")   # doctest: +SKIP
    >>> print(report.summary())                              # doctest: +SKIP
"""

from eagerdecomp.coverage.analysis import STATUSES, Coverage, Row, analyse, check
from eagerdecomp.coverage.graph import Graph, build_graph, cache_path, load_graph, save_graph, verify

__all__ = [
    "Row",
    "Coverage",
    "analyse",
    "check",
    "STATUSES",
    "Graph",
    "build_graph",
    "load_graph",
    "save_graph",
    "cache_path",
    "verify",
]
