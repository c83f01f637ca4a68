import pytest
import torch

import eagerdecomp as ed
from eagerdecomp.ops.opset import RUNTIME_EXTRAS

aten = torch.ops.aten


def test_core_aten_preset_is_core_tags_plus_runtime_extras():
    core = ed.OpSet.preset("core_aten")
    assert aten.mm.default in core and aten.silu.default not in core
    assert all(op in core for op in RUNTIME_EXTRAS)
    tagged = {op for op in core.ops if torch.Tag.core in op.tags}
    assert core.ops - tagged == set(RUNTIME_EXTRAS)


def test_prims_preset():
    prims = ed.OpSet.preset("prims")
    assert torch.ops.prims.add.default in prims
    assert aten.copy_.default in prims and aten.add.Tensor not in prims


@pytest.mark.parametrize("name", ["aten::mul.Tensor", "aten.mul.Tensor", "mul.Tensor"])
def test_name_forms(name):
    assert ed.OpSet([name]).ops == {aten.mul.Tensor}


def test_default_overload_and_packet_expansion():
    assert ed.OpSet(["aten::relu"]).ops >= {aten.relu.default}
    assert ed.OpSet([aten.add]).ops == {getattr(aten.add, o) for o in aten.add.overloads()}
    assert ed.OpSet(["aten::add.Tensor", aten.add.Tensor]).ops == {aten.add.Tensor}


def test_set_algebra():
    a, b = ed.OpSet(["aten::mul.Tensor", "aten::add.Tensor"]), ed.OpSet(["aten::add.Tensor"])
    assert (a | b) == a and (a - b).ops == {aten.mul.Tensor} and (a & b) == b
    assert (a | ["aten::sub.Tensor"]).ops == {aten.mul.Tensor, aten.add.Tensor, aten.sub.Tensor}
    assert hash(a) == hash(ed.OpSet([aten.add.Tensor, aten.mul.Tensor]))


def test_unknown_name_names_it_and_closest_matches():
    with pytest.raises(ed.UnknownOpError, match=r"'aten::ad.Tensor'.*did you mean aten::add.Tensor"):
        ed.OpSet(["aten::ad.Tensor"])


def test_unknown_preset():
    with pytest.raises(ed.UnknownOpError, match="presets are"):
        ed.OpSet.preset("core")


def test_from_file(tmp_path):
    p = tmp_path / "ops.txt"
    p.write_text("# my backend\naten::mm.default\n\naten::add.Tensor  # binary\n")
    assert ed.OpSet.from_file(str(p)).ops == {aten.mm.default, aten.add.Tensor}


def test_coerce():
    s = ed.OpSet(["aten::mm"])
    assert ed.OpSet.coerce(s) is s
    assert ed.OpSet.coerce("core_aten") == ed.OpSet.preset("core_aten")
    assert ed.OpSet.coerce(["aten::mm"]) == s


# -- resolve_reaching: a user's name for an op reaches every overload that can arrive for it --


def test_reaching_adds_the_in_place_and_out_variants():
    from eagerdecomp.ops.opset import resolve_op, resolve_reaching

    # what the fused optimizers call is the in-place form, not the packet the name denotes
    assert aten._fused_adamw_.default not in resolve_op("_fused_adamw")
    got = resolve_reaching("_fused_adamw")
    assert {aten._fused_adamw_.default, aten._fused_adamw_.tensor_lr, aten._fused_adamw.out} <= got
    assert resolve_reaching("aten::_fused_adamw_") == got  # either spelling: the same ops
    assert resolve_reaching("aten.add.Tensor") == {aten.add.Tensor, aten.add_.Tensor, aten.add.out}
    assert aten.add.Scalar not in resolve_reaching("aten.add.Tensor")  # one overload: its own variants


def test_reaching_a_composite_implicit_op_gives_the_ops_it_is_implemented_by():
    pytest.importorskip("expecttest")  # the composite is run on PyTorch's OpInfo samples
    from eagerdecomp.ops.opset import resolve_reaching

    # linalg_eigh never reaches a backend: its composite calls _linalg_eigh, which a device's
    # fallback meets as its out= form
    got = resolve_reaching("linalg_eigh")
    assert {aten._linalg_eigh.default, aten._linalg_eigh.eigenvalues} <= got
    assert aten._linalg_eigh.eigenvalues in resolve_reaching("linalg_eigvalsh")
    assert aten._linalg_svd.U in resolve_reaching("svd")


def test_reaching_a_composite_with_no_samples_names_what_would_work(monkeypatch):
    from eagerdecomp.ops import implicit
    from eagerdecomp.ops.opset import resolve_reaching

    # without torch.testing (expecttest not installed) nothing says what the composite calls
    implicit.implemented_by.cache_clear()
    monkeypatch.setattr(implicit, "_opinfos", lambda base: [])
    try:
        with pytest.raises(ed.UnknownOpError, match=r"'linalg_eigh':.*CompositeImplicitAutograd.*aten::_linalg_eigh"):
            resolve_reaching("linalg_eigh")
    finally:
        implicit.implemented_by.cache_clear()
