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


def _silu_by_division(v):
    # silu as v / (1 + exp(-v)): core ops the default decomposition (mul, sigmoid) never reaches
    return v / (torch.exp(-v) + 1)


def _runs_division_silu(**mode_kwargs):
    x = torch.randn(64, generator=torch.Generator().manual_seed(0))
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten", **mode_kwargs) as m:
        y = torch.nn.functional.silu(x)
    rec.assert_only("core_aten")
    torch.testing.assert_close(y, torch.nn.functional.silu(x))
    into = set(m.report().row(aten.silu.default).into)
    return into, set(rec.ops)


def test_mode_decompositions_take_precedence():
    default_into, default_ops = _runs_division_silu()
    assert "aten.sigmoid.default" in default_into and aten.div.Tensor not in default_ops
    into, ops = _runs_division_silu(decompositions={aten.silu.default: _silu_by_division})
    # the mode's entry, not the default table's: what it traced and what reached the kernels
    assert {"aten.div.Tensor", "aten.exp.default"} <= into and "aten.sigmoid.default" not in into
    assert {aten.div.Tensor, aten.exp.default} <= ops and aten.sigmoid.default not in ops


def test_mode_decompositions_take_precedence_over_registered_ones():
    calls = []

    def registered(v):
        calls.append(1)
        return v * torch.sigmoid(v)

    try:
        ed.register_decomposition(aten.silu.default, override=True)(registered)
        into, ops = _runs_division_silu()
        assert calls and "aten.sigmoid.default" in into  # the registered one, without the mode's
        calls.clear()
        into, ops = _runs_division_silu(decompositions={aten.silu.default: _silu_by_division})
        assert not calls, "the process-wide registration was used over the mode's own decomposition"
        assert {"aten.div.Tensor", "aten.exp.default"} <= into and aten.sigmoid.default not in ops
    finally:
        with registry._lock:  # gone, and no runtime built with it is reused
            registry.USER.pop(aten.silu.default, None)
            registry._version = next(registry._versions)
