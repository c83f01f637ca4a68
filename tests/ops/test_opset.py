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
