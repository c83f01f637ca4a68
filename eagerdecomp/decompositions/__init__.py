"""Decompositions: the tables (:mod:`~eagerdecomp.decompositions.table`), registration
(:mod:`~eagerdecomp.decompositions.registry`), and eagerdecomp's own decompositions, one
module per op family, for ops PyTorch leaves without one or decomposes otherwise than eager."""

from eagerdecomp.decompositions.registry import register_decomposition

__all__ = ["register_decomposition"]
