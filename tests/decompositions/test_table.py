import pytest
import torch

import eagerdecomp as ed
from eagerdecomp.decompositions import registry
from eagerdecomp.decompositions import table as tbl
from eagerdecomp.testing import RecordingMode

aten = torch.ops.aten


def test_default_table_drops_every_opset_op():
    core = ed.OpSet.preset("core_aten")
    table = tbl.default_table(core)
    assert not (set(table) & core.ops)
    assert aten.silu.default in table and aten.var.correction not in table


def test_register_packet_expands_and_duplicates_raise():
    registry = {}

    @ed.register_decomposition("aten::hardsigmoid", _registry=registry)
    def hs(x):
        return x

    assert aten.hardsigmoid.default in registry and aten.hardsigmoid.out in registry
    with pytest.raises(ed.EagerDecompError, match="already registered"):
        ed.register_decomposition(aten.hardsigmoid.default, _registry=registry)(hs)
    ed.register_decomposition(aten.hardsigmoid.default, override=True, _registry=registry)(lambda x: x)


def test_user_registration_is_used_and_new_runtimes_see_it():
    calls = []

    def mish(x):
        calls.append(1)
        return x * torch.tanh(torch.log1p(torch.exp(x)))

    try:
        ed.register_decomposition(aten.mish.default, override=True)(mish)
        x = torch.randn(6)
        with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
            y = torch.nn.functional.mish(x)
        rec.assert_only("core_aten")
        assert calls, "the user decomposition was not used"
        torch.testing.assert_close(y, torch.nn.functional.mish(x))
    finally:
        registry.USER.pop(aten.mish.default, None)


def test_mode_decompositions_take_precedence():
    x = torch.randn(4)
    twice = {aten.silu.default: lambda v: v * torch.sigmoid(v) * 1.0}
    with ed.EagerDecompMode("core_aten", decompositions=twice) as m:
        torch.nn.functional.silu(x)
    assert "aten.mul.Tensor" in m.report().row(aten.silu.default).into
