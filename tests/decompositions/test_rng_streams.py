"""Random draws under the mode against native eager, bit for bit, from the same seed: dropout's
masks, ``multinomial``, ``random_``/``randint``, explicit generators, and the DataLoader's seed
draws. Where eagerdecomp cannot draw eager's numbers (decompositions/randint.py says why), the
generator must still end where eager's does, the values must keep eager's range, and the report
must say that the stream differs."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode


def _run(fn, seed, generator_seed):
    torch.manual_seed(seed)
    g = None if generator_seed is None else torch.Generator().manual_seed(generator_seed)
    out = fn(g)
    after = torch.rand(5)  # the default generator's position after the call
    g_after = None if g is None else torch.rand(5, generator=g)
    return out, after, g_after


def _both(fn, seed=0, generator_seed=None):
    """``fn(generator)`` natively and under the mode (only core ATen ops recorded): outputs, and the
    draws each generator makes next."""
    want = _run(fn, seed, generator_seed)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
        got = _run(fn, seed, generator_seed)
    rec.assert_only("core_aten")
    return want, got, mode


def _same(w, g):
    if isinstance(w, (tuple, list)):
        assert len(w) == len(g)
        for a, b in zip(w, g):
            _same(a, b)
        return
    assert (g.shape, g.stride(), g.dtype) == (w.shape, w.stride(), w.dtype)
    assert torch.equal(g, w), f"{g} != {w}"


def _eager_exact(fn, seed=0, generator_seed=None):
    want, got, mode = _both(fn, seed, generator_seed)
    _same(want[0], got[0])
    assert torch.equal(want[1], got[1])  # the default generator ends where eager's does
    if generator_seed is not None:
        assert torch.equal(want[2], got[2])  # and so does the explicit one
    return got[0], mode


# -- dropout ------------------------------------------------------------------------------------

DROPOUTS = {
    "nn.Dropout": lambda x: nn.Dropout(0.3).train()(x),
    "F.dropout": lambda x: F.dropout(x, 0.6, training=True),
    "F.dropout inplace": lambda x: F.dropout(x.clone(), 0.25, training=True, inplace=True),
    "dropout2d": lambda x: F.dropout2d(x.view(4, 6, 5, 1), 0.4, training=True),
    "dropout1d": lambda x: F.dropout1d(x.view(4, 6, 5), 0.5, training=True),
    "alpha_dropout": lambda x: F.alpha_dropout(x, 0.2, training=True),
    "feature_alpha_dropout": lambda x: F.feature_alpha_dropout(x.view(4, 6, 5, 1), 0.3, training=True),
    "transposed": lambda x: F.dropout(x.view(12, 10).t(), 0.5, training=True),
    "bernoulli_(p)": lambda x: x.clone().bernoulli_(0.3),
    "bernoulli(x, p)": lambda x: torch.bernoulli(x, 0.7),
    "bernoulli_(tensor p)": lambda x: torch.empty_like(x).bernoulli_(x.sigmoid()),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(DROPOUTS))
def test_dropout_masks_are_eagers(name, dtype):
    x = torch.linspace(-2, 2, 120, dtype=dtype)
    for seed in (0, 7):
        _eager_exact(lambda g: DROPOUTS[name](x), seed)


def test_bernoulli_from_an_explicit_generator_is_eagers():
    x = torch.zeros(3, 40)
    _eager_exact(lambda g: x.clone().bernoulli_(0.4, generator=g), generator_seed=5)
    _eager_exact(lambda g: torch.bernoulli(x + 0.4, generator=g), generator_seed=6)


def test_an_mlp_with_dropout_trains_as_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 32), nn.Dropout(0.5))
    x = torch.randn(16, 8)

    def step(g):
        out = model(x)
        (grad,) = torch.autograd.grad(out.square().mean(), model[0].weight)
        return out.detach(), grad

    _eager_exact(step)


def test_the_report_says_dropouts_draws_are_eagers():
    _, mode = _eager_exact(lambda g: F.dropout(torch.ones(50), 0.5))
    row = mode.report().row("aten.bernoulli_.float")
    assert row.random and row.eager_stream and row.stream_differs is None
    assert "draws eager's random numbers" in str(mode.report())


# -- multinomial ------------------------------------------------------------------------------


def _probs(rows, n, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(rows, n, generator=g, dtype=torch.float64) * 3, -1).to(dtype)
    p[:, 1] = 0  # a category that is never drawn
    return p


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("samples,replacement", [(1, True), (6, True), (1, False), (4, False)])
@pytest.mark.parametrize("layout", ["2-d", "1-d", "transposed", "expanded"])
def test_multinomial_draws_eagers_numbers(dtype, samples, replacement, layout):
    p = _probs(5, 9, dtype)
    p = {
        "2-d": p,
        "1-d": p[0],
        "transposed": p.t().contiguous().t(),
        "expanded": p[2].expand(4, 9),
    }[layout]
    for seed in (0, 3):
        got, _ = _eager_exact(lambda g: torch.multinomial(p, samples, replacement), seed)
        assert not (got == 1).any()


@pytest.mark.parametrize("categories", [3, 1024])
def test_multinomial_with_replacement_sums_as_the_kernel(categories):
    # float32 cumulative sums added one category at a time, as the kernel adds them
    p = torch.rand(3, categories, generator=torch.Generator().manual_seed(2)) ** 4
    _eager_exact(lambda g: torch.multinomial(p, 300, True))


def test_multinomial_past_the_sequential_limit_keeps_eagers_generator():
    p = torch.rand(2, 1500, generator=torch.Generator().manual_seed(2))
    want, got, mode = _both(lambda g: torch.multinomial(p, 50, True))
    assert torch.equal(want[1], got[1])
    assert (got[0] >= 0).all() and (got[0] < 1500).all()
    assert (want[0] == got[0]).float().mean() > 0.9  # only draws near a rounded boundary may differ
    assert "over 1024" in mode.report().row("aten.multinomial.default").stream_differs
    # float64 probabilities: the CPU cumsum is the kernel's own sum, at any width
    _eager_exact(lambda g: torch.multinomial(p.double(), 50, True))


def test_categorical_sample_is_eagers():
    logits = torch.randn(6, 10, generator=torch.Generator().manual_seed(0))
    dist = torch.distributions.Categorical(logits=logits)
    _eager_exact(lambda g: dist.sample())
    _eager_exact(lambda g: dist.sample((4,)))


@pytest.mark.parametrize("samples,replacement", [(1, True), (5, True), (3, False)])
def test_multinomial_from_an_explicit_generator_is_eagers(samples, replacement):
    p = _probs(4, 7, torch.float32)
    _eager_exact(lambda g: torch.multinomial(p, samples, replacement, generator=g), generator_seed=9)


# -- random_ and randint --------------------------------------------------------------------------

INTEGER_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]

# calls whose every value is eager's: the range divides 2**24 (a 32-bit draw) or 2**53 (a 64-bit draw)
EXACT = {
    "random_() bool": lambda x: x.to(torch.bool).random_(),
    "random_() uint8": lambda x: x.to(torch.uint8).random_(),
    "random_() int8": lambda x: x.to(torch.int8).random_(),
    "random_() int16": lambda x: x.to(torch.int16).random_(),
    "random_(-8, 8) int8": lambda x: x.to(torch.int8).random_(-8, 8),
    "random_(0, None) uint8": lambda x: x.to(torch.uint8).random_(0, None),
    "random_(-128, None) int8": lambda x: x.to(torch.int8).random_(-128, None),
    "random_(2**20) int32": lambda x: x.to(torch.int32).random_(2**20),
    "random_(-2**23, 2**23) float32": lambda x: x.float().random_(-(2**23), 2**23),
    "random_(0, 256) float16": lambda x: x.half().random_(0, 256),
    "random_(0, 2**40) int64": lambda x: x.long().random_(0, 2**40),
    "random_(-2**52, 2**52) int64": lambda x: x.long().random_(-(2**52), 2**52),
    "random_(0, 2**44) float64": lambda x: x.double().random_(0, 2**44),
    "randint(0, 2)": lambda x: torch.randint(0, 2, (7, 3)),
    "randint(-4, 4) int32": lambda x: torch.randint(-4, 4, (11,), dtype=torch.int32),
    "randint(2**33) int64": lambda x: torch.randint(2**33, (3, 5)),
    "randint_like(x, 64)": lambda x: torch.randint_like(x, 64),
    "randint_like(x, -16, 16, int16)": lambda x: torch.randint_like(x, -16, 16, dtype=torch.int16),
    "non-contiguous random_(0, 16)": lambda x: x.long().view(6, 5).t().random_(0, 16),
    "0-dim random_(0, 2)": lambda x: x[0].clone().random_(0, 2),
}


@pytest.mark.parametrize("name", sorted(EXACT))
def test_integer_draws_are_eagers_where_the_range_allows(name):
    x = torch.zeros(30)
    for seed in (0, 5):
        _eager_exact(lambda g: EXACT[name](x.clone()), seed)


# calls whose values are not eager's (see decompositions/randint.py), with the bits that are
NOT_EXACT = {  # name: (draw, low bits that are eager's (0: none), generator ends where eager's does)
    "random_() int64": (lambda x: x.long().random_(), 53, True),
    "DataLoader's seed": (lambda x: torch.empty((), dtype=torch.int64).random_(), 53, True),
    "random_(min, None) int64": (lambda x: x.long().random_(-(2**63), None), 53, True),
    "random_() float64": (lambda x: x.double().random_(), 0, True),
    "random_() float16": (lambda x: x.half().random_(), 0, True),
    "randint(0, 10)": (lambda x: torch.randint(0, 10, (30,)), 0, True),
    "random_(-3, None) int8": (lambda x: x.to(torch.int8).random_(-3, None), 0, True),
    "random_(0, 10**12) int64": (lambda x: x.long().random_(0, 10**12), 0, True),
    "random_() int32": (lambda x: x.int().random_(), 0, False),
    "random_() float32": (lambda x: x.float().random_(), 0, False),
    "randint(0, 10**6)": (lambda x: torch.randint(0, 10**6, (30,)), 0, False),
}
_HIGH = {  # the largest value eager's call can give (inclusive)
    "random_() int64": 2**63 - 1,
    "DataLoader's seed": 2**63 - 1,
    "random_(min, None) int64": 2**63 - 1,
    "random_() float64": 2**53,
    "random_() float16": 2**11,
    "randint(0, 10)": 9,
    "random_(-3, None) int8": 127,
    "random_(0, 10**12) int64": 10**12 - 1,
    "random_() int32": 2**31 - 1,
    "random_() float32": 2**24,
    "randint(0, 10**6)": 10**6 - 1,
}
_LOW = {"random_(min, None) int64": -(2**63), "random_(-3, None) int8": -3}


@pytest.mark.parametrize("name", sorted(NOT_EXACT))
def test_integer_draws_keep_eagers_range_bits_and_generator(name):
    draw, bits, in_step = NOT_EXACT[name]
    x = torch.zeros(30)
    want, got, mode = _both(lambda g: draw(x.clone()))
    w, g = want[0], got[0]
    assert (g.shape, g.stride(), g.dtype) == (w.shape, w.stride(), w.dtype)
    values = g.double() if g.dtype != torch.int64 else g
    assert (values >= _LOW.get(name, 0)).all() and (values <= _HIGH[name]).all()
    if bits:
        mask = 2**bits - 1
        assert torch.equal(w & mask, g & mask)  # eager's low bits: a seed made from it seeds as eager's
    assert torch.equal(want[1], got[1]) == in_step
    op = next(r for r in mode.report().rows if r.op.startswith(("aten.random", "aten.randint")))
    assert op.random and "2**24" in op.stream_differs


def test_integer_draws_from_an_explicit_generator():
    _eager_exact(lambda g: torch.randint(0, 8, (4, 4), generator=g), generator_seed=3)
    _eager_exact(lambda g: torch.empty(20, dtype=torch.int16).random_(generator=g), generator_seed=4)
    _eager_exact(lambda g: torch.empty(20).random_(0, 64, generator=g), generator_seed=5)
    want, got, _ = _both(lambda g: torch.empty((), dtype=torch.int64).random_(generator=g), generator_seed=6)
    assert torch.equal(want[0] & (2**53 - 1), got[0] & (2**53 - 1))
    assert torch.equal(want[1], got[1]) and torch.equal(want[2], got[2])


BAD_BOUNDS = {
    "to - 1 past uint8": lambda: torch.empty(3, dtype=torch.uint8).random_(0, 1000),
    "from past int8": lambda: torch.empty(3, dtype=torch.int8).random_(-200, None),
    "from >= to": lambda: torch.empty(3).random_(5, 2),
    "from past float16": lambda: torch.empty(3, dtype=torch.float16).random_(-100000, 0),
    "randint past uint8": lambda: torch.randint(0, 300, (2,), dtype=torch.uint8),
    "randint_like past bool": lambda: torch.randint_like(torch.empty(2, dtype=torch.bool), 3),
}


@pytest.mark.parametrize("name", sorted(BAD_BOUNDS))
def test_bounds_eager_refuses_are_refused_with_its_error(name):
    with pytest.raises(Exception) as native:
        BAD_BOUNDS[name]()
    with pytest.raises(Exception) as ours, ed.EagerDecompMode("core_aten"):
        BAD_BOUNDS[name]()
    assert type(ours.value) is type(native.value) and str(ours.value) == str(native.value)


# -- explicit generators ----------------------------------------------------------------------------

GENERATED = {
    "rand": lambda g: torch.rand(3, 7, generator=g),
    "rand float64": lambda g: torch.rand(20, dtype=torch.float64, generator=g),
    "randn": lambda g: torch.randn(40, generator=g),
    "randn small": lambda g: torch.randn(5, generator=g),
    "randperm": lambda g: torch.randperm(12, generator=g),
    "randperm out": lambda g: torch.randperm(9, generator=g, out=torch.empty(0, dtype=torch.int32)),
    "rand_like": lambda g: torch.rand_like(torch.empty(4, 5).t(), generator=g),
    "uniform_": lambda g: torch.empty(30, dtype=torch.float64).uniform_(generator=g),
    "normal_": lambda g: torch.empty(30).normal_(generator=g),
    "exponential_": lambda g: torch.empty(30).exponential_(generator=g),
}


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_explicit_generators_draw_their_own_stream(name):
    # the generator's state is lent to the default generator for the draw: both end as in eager
    for seed in (0, 1):
        _eager_exact(GENERATED[name], seed, generator_seed=seed + 10)


# -- the DataLoader ---------------------------------------------------------------------------------


class _Noisy(Dataset):
    """Items that draw from torch's generator: the worker's seed decides them."""

    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.tensor(float(i)) + torch.rand(())


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_dataloader_batches_and_later_draws_are_eagers(workers, shuffle):
    def epochs():
        torch.manual_seed(0)
        loader = DataLoader(_Noisy(), batch_size=3, shuffle=shuffle, num_workers=workers)
        seen = [batch.clone() for _ in range(2) for batch in loader]
        return seen, torch.rand(4)

    want = epochs()
    with ed.EagerDecompMode("core_aten"):
        got = epochs()
    assert len(got[0]) == len(want[0]) == 8
    for w, g in zip(want[0], got[0]):
        assert torch.equal(w, g)
    assert torch.equal(want[1], got[1])


# -- the normal kernel's one pair at a time order -------------------------------------------------

PAIRWISE = {
    # a non-contiguous result of 16 or more elements: the CPU kernel draws Box-Muller pairs in
    # memory order (VITS's noise is randn_like of a transposed tensor; it drew other numbers and
    # the model produced another output length)
    "randn_like transposed": lambda g: torch.randn_like(torch.zeros(2, 49, 19).transpose(1, 2)),
    "randn_like channels_last": lambda g: torch.randn_like(
        torch.zeros(2, 3, 4, 5).to(memory_format=torch.channels_last)
    ),
    "randn_like bfloat16": lambda g: torch.randn_like(torch.zeros(20, 30).t(), dtype=torch.bfloat16),
    "randn_like float64": lambda g: torch.randn_like(torch.zeros(20, 30, dtype=torch.float64).t()),
    "normal_ transposed": lambda g: torch.zeros(30, 40).t().normal_(2.5, 0.3),
    "normal_ sliced": lambda g: torch.zeros(30, 40)[:, ::2].normal_(0.5, 2.0),
    "normal_ float16": lambda g: torch.zeros(30, 40, dtype=torch.float16).t().normal_(),
    "normal_ generator": lambda g: torch.zeros(30, 40).t().normal_(generator=g),
    # an odd count leaves the pair's second value in the generator for the next such draw
    "odd then contiguous then odd": lambda g: [
        torch.randn_like(torch.zeros(3, 7).t()),
        torch.randn(40),
        torch.zeros(5, 5).t().normal_(),
        torch.randn(3),
    ],
    "contiguous": lambda g: torch.zeros(30, 40).normal_(1.0, 2.0),
    # the vectorized fill's fused multiply-add (float mean and std), a 16-bit float's blocks of 16,
    # and the one pair at a time kernel's float64 multiply-add, each to the last bit
    "normal_ fused float32": lambda g: torch.zeros(1001).normal_(0.3, 1.7),
    "normal_ fused float64": lambda g: torch.zeros(1001, dtype=torch.float64).normal_(0.3, 1.7),
    "normal_ bfloat16 blocks": lambda g: torch.zeros(30, dtype=torch.bfloat16).normal_(0.3, 1.7),
    "normal_ small float64": lambda g: torch.zeros(3, 4, dtype=torch.float64).normal_(-2.0, 0.7),
    "normal Tensor_float transposed": lambda g: torch.normal(torch.zeros(20, 30).t() + 0.1, 2.3),
    "normal float_Tensor transposed": lambda g: torch.normal(1.0, torch.ones(20, 30).t() * 3),
    "normal Tensor_float small float64": lambda g: torch.normal(torch.zeros(3, 4, dtype=torch.float64) + 0.1, 2.3),
}


def test_the_report_says_where_randn_like_draws_another_stream():
    _, mode = _eager_exact(lambda g: torch.randn_like(torch.zeros(3, 20).t()))
    rows = [r for r in mode.report().rows if str(r.op) == "aten.randn_like.default"]
    assert len(rows) == 1, str(mode.report())
    (row,) = rows
    assert row.random and not row.eager_stream and "65,536" in row.stream_differs


UNIFORMS = {
    # nn.init's bounds (+-1/sqrt(fan_in)): unfused, from Python's double bounds, 42% of float32
    # draws differed in the last bit
    "kaiming bounds float32": lambda g: torch.empty(1000).uniform_(-1 / 3**0.5, 1 / 3**0.5),
    "float64": lambda g: torch.empty(1000, dtype=torch.float64).uniform_(-1 / 3, 1 / 3),
    "bfloat16 rounds up to to": lambda g: torch.empty(1000, dtype=torch.bfloat16).uniform_(2.0, 5.5),
    "float16 transposed": lambda g: torch.empty(3, 100, dtype=torch.float16).t().uniform_(-0.3, 1.7),
    "empty range": lambda g: torch.empty(20).uniform_(0.5, 0.5),
    "nn.Linear init": lambda g: [p.detach() for p in torch.nn.Linear(37, 53).parameters()],
    "generator": lambda g: torch.empty(100).uniform_(-0.3, 1.7, generator=g),
}


FILLS = {**{f"normal: {k}": f for k, f in PAIRWISE.items()}, **{f"uniform: {k}": f for k, f in UNIFORMS.items()}}


@pytest.mark.parametrize("tier", ["direct", "traced"])
@pytest.mark.parametrize("name", sorted(FILLS))
def test_normal_and_uniform_fills_are_eagers_to_the_last_bit(name, tier, monkeypatch):
    monkeypatch.setenv("EAGERDECOMP_TRACE_AFTER", "2" if tier == "direct" else "0")
    _eager_exact(FILLS[name], generator_seed=3 if "generator" in name else None)


def _initialized():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Embedding(50, 24),
        nn.TransformerEncoderLayer(24, 4, 48, dropout=0.0, batch_first=True),
        nn.Conv1d(24, 12, 3),
        nn.LayerNorm(10),
    )
    extra = torch.empty(7, 9)
    nn.init.trunc_normal_(extra, std=0.02)
    nn.init.xavier_normal_(extra.t())  # a non-contiguous fill
    return [p.detach().clone() for p in model.parameters()] + [extra]


@pytest.mark.parametrize("opset", ["core_aten", "prims_fusion"])
def test_a_model_built_under_the_mode_has_eagers_initial_weights(opset):
    # nn.init's uniform and normal fills, bit for bit (uniform_'s fused multiply-add and normal_'s
    # pair path made most weights differ in the last bit)
    want = _initialized()
    with RecordingMode() as rec, ed.EagerDecompMode(opset):
        got = _initialized()
    rec.assert_only(opset)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
