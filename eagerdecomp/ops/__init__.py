"""What eagerdecomp knows about ATen ops themselves, before any decomposition: opsets
(:mod:`~eagerdecomp.ops.opset`), schemas (:mod:`~eagerdecomp.ops.schema`), in-place and out=
variants (:mod:`~eagerdecomp.ops.variants`), eager's memory-overlap rules
(:mod:`~eagerdecomp.ops.overlap`) and argument checks (:mod:`~eagerdecomp.ops.checks`)."""
