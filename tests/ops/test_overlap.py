"""Memory-overlap rules: in-place and out= calls eager refuses raise eager's error, decomposed too."""

import pytest
import torch

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode, reference_device

# (name, call): each writes into a view of x that overlaps what it reads
REFUSED = [
    ("out= partial", lambda x: torch.add(x[:-1], 10, out=x[1:])),
    ("out= partial by 2", lambda x: torch.mul(x[:-2], 3, out=x[2:])),
    ("in-place partial", lambda x: x[1:].add_(x[:-1])),
    ("in-place internal", lambda x: x[:1].expand(5).add_(1)),
    ("out= internal", lambda x: torch.neg(x[:5], out=x[:1].expand(5))),
    ("index_select full alias", lambda x: torch.index_select(x, 0, torch.tensor([0, 1, 2, 3, 4, 5]), out=x)),
    ("cat partial", lambda x: torch.cat([x[:2], x[:2]], out=x[1:5])),
]
ALLOWED = [
    ("out= full alias", lambda x: torch.add(x, 10, out=x)),
    ("in-place full alias", lambda x: x.mul_(x)),
    ("out= disjoint views", lambda x: torch.add(x[:3], 1, out=x[3:])),
]


def _eager(call):
    x = torch.arange(6.0)
    try:
        call(x)
    except RuntimeError as e:
        return ("error", str(e)), x
    return ("ok", None), x


def _decomposed(call, device=None):
    x = torch.arange(6.0, device=device)
    with RecordingMode() as rec:
        try:
            if device is None:
                with ed.EagerDecompMode("core_aten"):
                    call(x)
            else:
                call(x)
        except RuntimeError as e:
            return ("error", str(e)), x.cpu(), rec
    return ("ok", None), x.cpu(), rec


@pytest.mark.parametrize("name,call", REFUSED + ALLOWED, ids=[n for n, _ in REFUSED + ALLOWED])
def test_mode_follows_eager(name, call):
    want, x_want = _eager(call)
    assert (want[0] == "error") == (name in dict(REFUSED))
    for _ in range(2):  # the second call replays the cached kernel
        got, x_got, rec = _decomposed(call)
        assert got == want
        assert torch.equal(x_got, x_want)  # a refused call writes nothing
        rec.assert_only("core_aten")


@pytest.fixture
def edref():
    dev = reference_device()
    ed.enable(dev.type)
    yield dev
    ed.disable(dev.type)


@pytest.mark.parametrize("name,call", REFUSED + ALLOWED, ids=[n for n, _ in REFUSED + ALLOWED])
def test_device_follows_eager(edref, name, call):
    want, x_want = _eager(call)
    if name.startswith("index_select"):
        call = lambda x: torch.index_select(x, 0, torch.arange(6, device=x.device), out=x)  # noqa: E731
    got, x_got, _ = _decomposed(call, device=edref)
    assert got == want
    assert torch.equal(x_got, x_want)


def test_cached_kernel_checks_every_call():
    # the first call's tensors share no memory; the second's have the same metadata and do:
    # the key is the same, so the replayed kernel itself must refuse
    with ed.EagerDecompMode("core_aten") as mode:
        a, b = torch.arange(6.0), torch.zeros(6)
        torch.add(a[:-1], 10, out=b[1:])
        assert b.tolist() == [0, 10, 11, 12, 13, 14]
        x = torch.arange(6.0)
        with pytest.raises(RuntimeError, match="some elements of the input tensor and the written-to tensor"):
            torch.add(x[:-1], 10, out=x[1:])
        assert x.tolist() == list(range(6))
    assert sum(r.hits for r in mode.report().rows if "add" in r.op) >= 1
