"""The training-loop idioms of tests/test_idioms.py: what a training script does around the model.

Each idiom is a function of the device it runs on (``cpu`` natively and under the mode, the
reference device with the switch) that builds its model and data itself, under the seed the
runner sets, and returns what a user would look at: losses, parameters, gradients, optimizer
state, printed text, flags, the types of the exceptions eager raises. Tensors come back as they
are (the runner compares dtypes, shapes, strides and values); aliasing is returned as booleans
computed inside the idiom, where both runs can answer it.

``@idiom(...)`` registers one: ``tol`` loosens the values' tolerance where several optimizer steps
compound rounding (a decomposition rounds at each core op where eager's fused kernel rounds
once), ``process`` runs it in a fresh process (DataLoader workers fork).
"""

from __future__ import annotations

import copy
import io
import math
import pickle
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import eagerdecomp as ed

__all__ = ["IDIOMS", "Idiom"]


@dataclass(frozen=True)
class Idiom:
    name: str
    fn: object
    tol: tuple | None  # (rtol, atol) for float values; None: assert_close's defaults per dtype
    process: bool
    limit: dict  # where -> the exception type of a limit docs/limits.md names (eager runs; this raises)


IDIOMS: dict = {}

# several optimizer steps: rounding differences compound (tests/test_training.py allows the same)
TRAINING = (1e-4, 1e-5)
# a step under bfloat16 autocast: the results (and the float32 parameters after it) carry its
# rounding; on edref autocast casts by CUDA's op lists (csrc/refdev.cpp), not the CPU's
BFLOAT16 = (1.6e-2, 1e-3)


def idiom(tol=None, process=False, limit=None):
    def register(fn):
        IDIOMS[fn.__name__] = Idiom(fn.__name__, fn, tol, process, dict(limit or {}))
        return fn

    return register


# -- models and steps ------------------------------------------------------------------------


# NOTE: no bias before a batch norm (as real models): its gradient is zero in exact arithmetic and
# rounding noise in both runs, which Adam divides by its own square root into full +-lr steps
def mlp(dropout=0.0, norm=True):
    return nn.Sequential(
        nn.Linear(6, 16, bias=not norm),
        nn.BatchNorm1d(16) if norm else nn.Identity(),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(16, 3),
    )


class SmallConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(F.relu(self.bn(self.conv(x))).mean((2, 3)))


def data(dev, n=16):
    # NOTE: labels from a normal draw, not randint: integer draws are the rng branch's
    # (integer_draws below), and every other idiom should test its own concern
    return torch.randn(n, 6).to(dev), torch.randn(n, 3).argmax(-1).to(dev)


def step(model, opt, x, y, **loss_kw):
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y, **loss_kw)
    loss.backward()
    opt.step()
    return loss.detach()


def state(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def grads(module):
    return [None if p.grad is None else p.grad.clone() for p in module.parameters()]


def raised(fn) -> str:
    """The type of the exception ``fn`` raises (``"no error"`` if none)."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return type(e).__name__
    return "no error"


def printed(t) -> str:
    # the device suffix is the one difference of a tensor's text on another device (where it
    # may move the dtype to a line of its own: line breaks are not compared)
    return " ".join(repr(t).replace(f", device='{t.device}'", "").split())


# -- data loading --------------------------------------------------------------------------------


class NoisyDataset(torch.utils.data.Dataset):
    """Draws augmentation noise per item: in a worker, from the worker's seeded generator."""

    def __init__(self, n=24):
        self.x, self.y = torch.randn(n, 6), torch.randn(n, 3).argmax(-1)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i] + 0.1 * torch.randn(6), self.y[i], i


def _loaders(workers):
    # unshuffled; shuffled from the global seed (RandomSampler seeds a generator of its own with
    # a random_ draw); shuffled from an explicit generator (the reproducibility guides' advice)
    for shuffle, generator in ((False, None), (True, None), (True, torch.Generator().manual_seed(1))):
        yield torch.utils.data.DataLoader(
            NoisyDataset(), batch_size=8, shuffle=shuffle, num_workers=workers, generator=generator
        )


@idiom(tol=TRAINING)
def dataloader(dev):
    model = mlp().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    out = []
    for loader in _loaders(workers=0):
        for _epoch in range(2):
            out.extend((idx, x, step(model, opt, x.to(dev), y.to(dev))) for x, y, idx in loader)
    return out, state(model)


# (the parent rebuilds each batch from the worker's shared memory with set_: the storage branch)
@idiom(process=True)
def dataloader_workers(dev):
    # NOTE: no training here: what the workers add is their seeding and the fork itself (a
    # worker inherits the parent's mode); the batches' use is dataloader's above
    return [(idx, x, y, x.to(dev).square().sum(1)) for loader in _loaders(workers=2) for x, y, idx in loader]


# -- packed sequences ----------------------------------------------------------------------------


@idiom()
def packed_sequences(dev):
    lstm, head = nn.LSTM(5, 7, batch_first=True).to(dev), nn.Linear(7, 2).to(dev)
    x, lengths = torch.randn(3, 6, 5).to(dev), torch.tensor([6, 2, 4])
    packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out, (h, c) = lstm(packed)
    padded, out_lengths = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
    loss = head(h[-1]).square().mean() + padded.sum()
    loss.backward()
    return packed.data, packed.batch_sizes, padded, out_lengths, h, c, loss.detach(), grads(lstm)


# -- EMA and SWA copies --------------------------------------------------------------------------


def _ema_loop(dev, model, ema, update, steps=3):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = data(dev)
    losses = []
    for _ in range(steps):
        losses.append(step(model, opt, x, y))
        update(ema, model)
    ema.eval()
    with torch.no_grad():
        return losses, state(ema), ema(x)


def _lerp_update(ema, model, decay=0.9):
    # timm ModelEmaV3 (foreach off): floats lerp towards the model, integer buffers are copied
    with torch.no_grad():
        for e, m in zip(ema.state_dict().values(), model.state_dict().values()):
            if e.is_floating_point():
                e.lerp_(m, 1.0 - decay)
            else:
                e.copy_(m)


def _mul_add_update(ema, model, decay=0.9):
    # timm ModelEmaV2 and most scripts: ema = decay * ema + (1 - decay) * model
    with torch.no_grad():
        for e, m in zip(ema.state_dict().values(), model.state_dict().values()):
            if e.is_floating_point():
                e.mul_(decay).add_(m.detach(), alpha=1.0 - decay)
            else:
                e.copy_(m)


def _foreach_update(ema, model, decay=0.9):
    # timm ModelEmaV3 (foreach on): one _foreach_lerp_ over the float tensors
    with torch.no_grad():
        pairs = [
            (e, m) for e, m in zip(ema.state_dict().values(), model.state_dict().values()) if e.is_floating_point()
        ]
        torch._foreach_lerp_([e for e, _ in pairs], [m for _, m in pairs], 1.0 - decay)


@idiom(tol=TRAINING)
def ema_deepcopy(dev):
    model = SmallConv().to(dev)
    ema = copy.deepcopy(model)
    same = [a.data_ptr() == b.data_ptr() for a, b in zip(ema.state_dict().values(), model.state_dict().values())]
    x = torch.randn(4, 3, 6, 6).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step(model, opt, x, torch.tensor([0, 1, 2, 3]).to(dev))
    _lerp_update(ema, model)
    return any(same), state(ema), state(model)


@idiom(tol=TRAINING)
def ema_updates(dev):
    out = {}
    for name, update in {"lerp_": _lerp_update, "mul_add_": _mul_add_update, "foreach_lerp_": _foreach_update}.items():
        torch.manual_seed(0)
        model = mlp().to(dev)
        ema = mlp().to(dev)
        ema.load_state_dict(model.state_dict())  # a copy without deepcopy
        ema.requires_grad_(False)
        out[name] = _ema_loop(dev, model, ema, update)
    return out


@idiom(tol=TRAINING)
def swa_averaged_model(dev):
    model = mlp().to(dev)
    swa = torch.optim.swa_utils.AveragedModel(model)
    ema = torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.swa_utils.SWALR(opt, swa_lr=0.05, anneal_epochs=2)
    x, y = data(dev)
    for _ in range(3):
        step(model, opt, x, y)
        swa.update_parameters(model)
        ema.update_parameters(model)
        sched.step()
    torch.optim.swa_utils.update_bn([x[:8], x[8:]], swa)
    return state(swa), state(ema), swa.n_averaged, sched.get_last_lr()


# -- checkpoints and pickling --------------------------------------------------------------------


@idiom(tol=TRAINING)
def checkpoint_save_load(dev):
    model = SmallConv().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(4, 3, 6, 6).to(dev), torch.tensor([0, 1, 2, 3]).to(dev)
    step(model, opt, x, y)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": 1}, buf)
    out = {}
    for key, where in (("to_cpu", "cpu"), ("to_device", dev)):
        buf.seek(0)
        ckpt = torch.load(buf, map_location=where, weights_only=True)
        fresh = SmallConv().to(dev)
        fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
        fresh.load_state_dict(ckpt["model"])
        fresh_opt.load_state_dict(ckpt["opt"])
        devices = {str(v.device) for v in ckpt["model"].values()}
        out[key] = (devices == {str(torch.device(where))}, step(fresh, fresh_opt, x, y), state(fresh), ckpt["epoch"])
    return out


@idiom()
def shared_memory(dev):
    # Hogwild and tensors handed to worker processes: shared memory is the host's, so the CPU's
    model = mlp(norm=False)
    model.share_memory()
    t = torch.randn(4, 3)
    view = t[1:]
    t.share_memory_()
    view.add_(1)  # the view follows its base into shared memory
    flags = [p.is_shared() for p in model.parameters()] + [t.is_shared(), view.is_shared()]
    return flags, view.data_ptr() - t.data_ptr(), t, model.to(dev)(t.to(dev)[:, :1].expand(4, 6))


@idiom()
def pickled_tensors(dev):
    base = torch.randn(4, 5).to(dev)
    view = base[1:, ::2]
    restored = pickle.loads(pickle.dumps({"base": base, "view": view, "ints": torch.arange(6).to(dev)}))
    buf = io.BytesIO()
    torch.save([base, view], buf)  # a view saved with its base shares its storage after loading
    buf.seek(0)
    b2, v2 = torch.load(buf)
    return restored, b2, v2, b2.untyped_storage().data_ptr() == v2.untyped_storage().data_ptr(), v2.storage_offset()


# -- activation checkpointing, double backward, torch.func --------------------------------------


def _checkpointed(dev, dropout):
    out = {}
    for reentrant in (True, False):
        torch.manual_seed(0)
        block, head = mlp(dropout=dropout).to(dev), nn.Linear(3, 1).to(dev)
        x = torch.randn(8, 6).to(dev).requires_grad_()
        h = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=reentrant)
        loss = head(h).square().mean()
        loss.backward()
        out[reentrant] = (h.detach(), x.grad, grads(block))
    return out


@idiom()
def activation_checkpoint(dev):
    return _checkpointed(dev, dropout=0.0)


@idiom()
def activation_checkpoint_dropout(dev):
    return _checkpointed(dev, dropout=0.3)


@idiom(tol=TRAINING)
def gradient_penalty(dev):
    # WGAN-GP: the critic's gradient norm at interpolates, penalized, differentiated again
    critic = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1)).to(dev)
    opt = torch.optim.Adam(critic.parameters(), lr=1e-3, betas=(0.5, 0.9))
    real, fake = torch.randn(8, 6).to(dev), torch.randn(8, 6).to(dev)
    out = []
    for _ in range(2):
        eps = torch.rand(8, 1).to(dev)
        mixed = (eps * real + (1 - eps) * fake).requires_grad_(True)
        (g,) = torch.autograd.grad(critic(mixed).sum(), mixed, create_graph=True)
        penalty = ((g.norm(2, dim=1) - 1) ** 2).mean()
        loss = critic(fake).mean() - critic(real).mean() + 10 * penalty
        opt.zero_grad()
        loss.backward()
        out.append((penalty.detach(), g.detach(), grads(critic)))
        opt.step()
    return out, state(critic)


@idiom()
def torch_func(dev):
    from torch.func import functional_call, grad, vmap

    model = mlp(norm=False).to(dev)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = data(dev, 5)

    def loss(p, xi, yi):
        return F.cross_entropy(functional_call(model, p, (xi[None],)), yi[None])

    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)  # per-sample gradients
    whole = grad(lambda p: F.cross_entropy(functional_call(model, p, (x,)), y))(params)
    return functional_call(model, params, (x,)), per_sample, whole, vmap(torch.dot)(x, x)


# -- autocast and gradient scaling ---------------------------------------------------------------


@idiom(tol=BFLOAT16)
def autocast_bfloat16(dev):
    model = SmallConv().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 3, 6, 6).to(dev), torch.tensor([0, 1, 2, 3]).to(dev)
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        inner = model.conv(x)
    loss.backward()
    opt.step()
    return logits, loss, inner, grads(model), state(model)


@idiom(tol=BFLOAT16)
def grad_scaler(dev):
    # torch.amp.GradScaler on the training device (timm's NativeScaler, Lightning's precision
    # plugin), with an overflow that skips a step and halves the scale
    model = mlp().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler(dev.type, init_scale=2.0**10, growth_interval=1)
    x, y = data(dev)
    out = []
    for i in range(3):
        opt.zero_grad()
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss * (math.inf if i == 1 else 1.0)).backward()
        scaler.unscale_(opt)
        norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        out.append((loss.detach(), norm, scaler.get_scale()))
    return out, state(model)


# -- hooks and gradient clipping -----------------------------------------------------------------


@idiom()
def hooks_and_clipping(dev):
    model = mlp().to(dev)
    seen = {}
    model[0].register_forward_pre_hook(lambda m, args: (args[0] * 2,))
    model[2].register_forward_hook(lambda m, args, out: seen.setdefault("act", out.detach().clone()))
    model[4].register_full_backward_hook(lambda m, gin, gout: seen.setdefault("gout", gout[0].clone()))
    model[4].weight.register_post_accumulate_grad_hook(lambda p: seen.setdefault("acc", p.grad.clone()))
    x, y = data(dev)
    h = model[:3](x)
    h.register_hook(lambda g: g * 0.5)
    F.cross_entropy(model[3:](h), y).backward()
    out = {"seen": seen, "grads": grads(model)}
    for i, (foreach, norm_type) in enumerate([(None, 2.0), (True, 2.0), (False, math.inf), (True, 1.0)]):
        for p, g in zip(model.parameters(), out["grads"]):
            p.grad = g.clone()
        norm = nn.utils.clip_grad_norm_(model.parameters(), 0.5, norm_type=norm_type, foreach=foreach)
        out[i] = norm, grads(model)
    _adaptive_clip(model.parameters())
    out["agc"] = grads(model)
    nn.utils.clip_grad_value_(model.parameters(), 0.01)
    out["value"] = grads(model)
    return out


def _adaptive_clip(parameters, clip_factor=0.01, eps=1e-3):
    # timm's adaptive gradient clipping (dispatch_clip_grad(mode="agc")): unit-wise norms
    def unitwise_norm(x):
        return x.norm() if x.ndim <= 1 else x.norm(2, dim=tuple(range(1, x.ndim)), keepdim=True)

    for p in parameters:
        max_norm = unitwise_norm(p.detach()).clamp_(min=eps).mul_(clip_factor)
        grad_norm = unitwise_norm(p.grad.detach())
        clipped = p.grad.detach() * (max_norm / grad_norm.clamp(min=1e-6))
        p.grad.detach().copy_(torch.where(grad_norm < max_norm, p.grad.detach(), clipped))


# -- parametrizations and init -------------------------------------------------------------------


@idiom(tol=TRAINING)  # registering one rebinds the parameter: original.set_(new)
def parametrizations(dev):
    P = nn.utils.parametrizations
    layers = {
        "weight_norm": P.weight_norm(nn.Linear(6, 5)),
        "spectral_norm": P.spectral_norm(nn.Linear(6, 5)),
        "orthogonal_square": P.orthogonal(nn.Linear(5, 5)),
        "orthogonal_tall": P.orthogonal(nn.Linear(3, 5)),
        "orthogonal_cayley": P.orthogonal(nn.Linear(4, 4), orthogonal_map="cayley"),
    }
    out = {}
    for name, layer in layers.items():
        layer.to(dev)
        opt = torch.optim.SGD(layer.parameters(), lr=0.1)
        x = torch.randn(4, layer.in_features).to(dev)
        for _ in range(2):
            opt.zero_grad()
            layer(x).square().mean().backward()
            opt.step()
        layer.eval()
        out[name] = layer.weight.detach(), state(layer)
    return out


@idiom()
def nn_init(dev):
    w = {k: torch.empty(6, 8).to(dev) for k in ("xu", "xn", "ku", "kn", "tn", "orth", "sparse", "u", "n", "c", "eye")}
    conv = torch.empty(4, 4, 3, 3).to(dev)
    nn.init.xavier_uniform_(w["xu"], gain=nn.init.calculate_gain("relu"))
    nn.init.xavier_normal_(w["xn"])
    nn.init.kaiming_uniform_(w["ku"], a=math.sqrt(5))
    nn.init.kaiming_normal_(w["kn"], mode="fan_out", nonlinearity="relu")
    nn.init.trunc_normal_(w["tn"], std=0.02)
    nn.init.orthogonal_(w["orth"])
    nn.init.sparse_(w["sparse"], sparsity=0.5)
    nn.init.uniform_(w["u"], -0.1, 0.1)
    nn.init.normal_(w["n"], 0.0, 0.02)
    nn.init.constant_(w["c"], 0.5)
    nn.init.eye_(w["eye"])
    nn.init.dirac_(conv)
    torch.manual_seed(5)
    linear = nn.Linear(6, 4).to(dev)  # reset_parameters under a seed: the same module as eager's
    return w, conv, state(linear)


# -- distributions -------------------------------------------------------------------------------


@idiom()
def distributions(dev):
    D = torch.distributions
    mu = torch.randn(4, 3).to(dev).requires_grad_()
    sigma = torch.rand(4, 3).to(dev).add(0.5).requires_grad_()
    normal = D.Normal(mu, sigma)
    z = normal.rsample((5,))
    lp = normal.log_prob(z).sum() + normal.entropy().sum()
    lp.backward()
    logits = torch.randn(4, 6).to(dev)
    cat = D.Categorical(logits=logits)
    labels = torch.tensor([0, 5, 2, 3]).to(dev)
    scale = torch.tensor([[1.0, 0.0], [0.5, 2.0]]).to(dev)
    mvn = D.MultivariateNormal(torch.zeros(2).to(dev), scale_tril=scale)
    w = mvn.rsample((3,))
    bern = D.Bernoulli(probs=torch.rand(6).to(dev))
    return z, lp.detach(), mu.grad, sigma.grad, cat.log_prob(labels), cat.entropy(), w, mvn.log_prob(w), bern.sample()


@idiom()
def integer_draws(dev):
    # synthetic labels and token ids, random crops' offsets, seeds drawn in Python.
    # NOTE: eager takes each element modulo the range from raw generator bits no core op shows, so
    # its numbers are reproducible where the range divides 2**24 (docs/limits.md, "Random ops"):
    # those are compared as values; other ranges by what a script relies on (dtype, shape, bounds)
    # and by the generator's position after them (the next draws are eager's again)
    t = torch.empty(3, 4, dtype=torch.int32).to(dev)
    exact = [
        torch.randint(0, 4, (16,)).to(dev),
        torch.randint(8, (2, 3), dtype=torch.int32).to(dev),
        torch.randint_like(t, 0, 64),
        t.random_(0, 2),
        torch.empty(5, dtype=torch.uint8).to(dev).random_(),
        torch.empty(4, dtype=torch.bool).to(dev).random_(),
        torch.empty((), dtype=torch.int64).random_().item() % 2**32,  # what seeds a sampler's generator
    ]
    labels, ids = torch.randint(0, 3, (16,)).to(dev), torch.randint_like(t, 0, 100)
    bounded = [(x.dtype, x.shape, bool(x.min() >= 0), bool(x.max() < high)) for x, high in ((labels, 3), (ids, 100))]
    return exact, bounded, torch.rand(3).to(dev)


@idiom()
def generator_draws(dev):
    # an explicit generator: RandomSampler's shuffle (randperm), per-dataset augmentation
    g = torch.Generator().manual_seed(7)
    train, val = torch.utils.data.random_split(range(10), [0.7, 0.3], generator=torch.Generator().manual_seed(3))
    draws = torch.randperm(10, generator=g), torch.randn(3, generator=g), torch.rand(2, 2, generator=g)
    return draws, list(train), list(val)


@idiom()
def categorical_sample(dev):
    cat = torch.distributions.Categorical(logits=torch.randn(4, 6).to(dev))
    return cat.sample((10,)), torch.multinomial(torch.rand(3, 5).to(dev), 8, replacement=True)


# -- numpy, printing, dtype and memory-format moves ----------------------------------------------


@idiom()
def numpy_interop(dev):
    t = torch.randn(3, 4)  # numpy shares a CPU tensor's memory: writes through it show in the tensor
    a = t.numpy()
    back = torch.from_numpy(a * 2).to(dev)
    shared = torch.from_numpy(a)
    a[0, 0] = 100.0
    ints = torch.from_numpy(torch.arange(6).numpy().reshape(2, 3)).to(dev)
    on_dev = t.to(dev)
    return a, back, shared, ints, t.tolist(), on_dev.tolist(), on_dev[0, 1].item(), (on_dev + back).sum().item()


@idiom()
def printing(dev):
    x = torch.randn(3, 4).to(dev)
    with torch.no_grad():
        big = torch.arange(2000.0).reshape(40, 50).to(dev) / 7
    w = x.clone().requires_grad_()
    texts = [
        printed(x),
        printed(big),
        printed(x.half()),
        printed(x.to(torch.bfloat16)),
        printed(torch.tensor([True, False]).to(dev)),
        printed(torch.arange(5).to(dev)),
        printed(torch.tensor(3.5).to(dev)),
        printed(w * 2),
        printed(torch.tensor([float("nan"), float("inf"), -0.0, 1e-8]).to(dev)),
        printed(torch.empty(0, 3).to(dev)),
        f"{x.sum().item():.4f}",
        f"{x[0, 0]:.3f}",
        str(nn.Linear(2, 3)),
    ]
    with torch.no_grad():
        torch.set_printoptions(precision=2, sci_mode=False)
        try:
            texts.append(printed(x * 1000))
        finally:
            torch.set_printoptions(profile="default")
    return texts


@idiom()
def dtype_and_memory_format(dev):
    x = torch.randn(2, 3, 5, 5).to(dev)
    conv = nn.Conv2d(3, 4, 3).to(dev)
    cl = x.contiguous(memory_format=torch.channels_last)
    conv_cl = copy.deepcopy(conv).to(memory_format=torch.channels_last)
    y = conv_cl(cl.requires_grad_())
    y.sum().backward()
    moves = [x.to(torch.float64), x.half(), x.bfloat16(), x.to(torch.int32), x.double().float(), x.half().float()]
    moves += [(x * 100).to(torch.uint8), x.to(dev, torch.float64), x.transpose(1, 2).to(torch.float16)]
    flags = [cl.is_contiguous(), cl.is_contiguous(memory_format=torch.channels_last), y.is_contiguous()]
    flags += [y.is_contiguous(memory_format=torch.channels_last), x.to(torch.float32) is x, x.float() is x]
    return moves, cl, y, cl.grad, conv_cl.weight.grad, conv_cl.weight, flags, mlp().double().to(dev)[0].weight.dtype


@idiom()
def inference_and_no_grad(dev):
    model = mlp().to(dev)
    x, _ = data(dev)
    with torch.inference_mode():
        model.eval()
        inf = model(x)
    model.train()
    with torch.no_grad():
        ng = model(x)
        versions = []
        for p in model.parameters():
            before = p._version
            p.mul_(0.9).add_(torch.ones_like(p), alpha=0.01)
            p.clamp_(-1, 1)
            versions.append(p._version - before)
        before = model[0].weight._version
        model[0].weight[0].fill_(0.5)  # in place through a view: the base's version counter moves
        versions.append(model[0].weight._version - before)
    flags = [inf.is_inference(), inf.requires_grad, ng.requires_grad, all(p.requires_grad for p in model.parameters())]
    return inf, ng, versions, flags, state(model)


# -- the loop itself: accumulation, schedules, zero_grad, optimizer state ------------------------


@idiom(tol=TRAINING)
def gradient_accumulation(dev):
    model = mlp().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = data(dev, 32)
    out = []
    for _s in range(2):
        for micro in range(4):
            sl = slice(8 * micro, 8 * micro + 8)
            (F.cross_entropy(model(x[sl]), y[sl]) / 4).backward()
        out.append(grads(model))
        opt.step()
        opt.zero_grad()
    return out, state(model)


@idiom(tol=TRAINING)
def lr_schedulers(dev):
    S = torch.optim.lr_scheduler
    makers = {
        "step": lambda o: S.StepLR(o, step_size=2, gamma=0.5),
        "cosine": lambda o: S.CosineAnnealingLR(o, T_max=4, eta_min=1e-4),
        "warm_restarts": lambda o: S.CosineAnnealingWarmRestarts(o, T_0=2),
        "onecycle": lambda o: S.OneCycleLR(o, max_lr=0.5, total_steps=6),
        # transformers' get_linear_schedule_with_warmup
        "linear_warmup": lambda o: S.LambdaLR(o, lambda s: min((s + 1) / 2, max(0.0, (6 - s) / 4))),
        "sequential": lambda o: S.SequentialLR(
            o, [S.LinearLR(o, start_factor=0.1, total_iters=2), S.ExponentialLR(o, 0.9)], milestones=[2]
        ),
    }
    x, y = data(dev)
    out = {}
    for name, make in makers.items():
        torch.manual_seed(0)
        model = mlp().to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sched = make(opt)
        lrs = []
        for _ in range(5):
            step(model, opt, x, y)
            sched.step()
            lrs.append(sched.get_last_lr())
        out[name] = lrs, state(model)
    torch.manual_seed(0)
    model = mlp().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    plateau = S.ReduceLROnPlateau(opt, patience=0, factor=0.5)
    for _ in range(4):
        plateau.step(step(model, opt, x, y).item() * 0 + 1.0)  # a flat validation loss
    out["plateau"] = [g["lr"] for g in opt.param_groups], state(model)
    return out


@idiom()
def zero_grad_set_to_none(dev):
    model = mlp().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = data(dev)
    F.cross_entropy(model(x), y).backward()
    ptrs = [p.grad.data_ptr() for p in model.parameters()]
    opt.zero_grad(set_to_none=False)
    kept = [p.grad.data_ptr() == q for p, q in zip(model.parameters(), ptrs)]
    zeros = grads(model)
    F.cross_entropy(model(x), y).backward()  # accumulates into the zeroed tensors
    again = grads(model)
    model.zero_grad(set_to_none=True)
    return kept, zeros, again, [p.grad is None for p in model.parameters()]


@idiom(tol=TRAINING)
def optimizer_state_dict(dev):
    model = mlp().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, amsgrad=True)
    x, y = data(dev)
    step(model, opt, x, y)
    saved = opt.state_dict()
    twin = mlp().to(dev)
    twin.load_state_dict(model.state_dict())
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-2, amsgrad=True)
    twin_opt.load_state_dict(saved)
    losses = [(step(model, opt, x, y), step(twin, twin_opt, x, y)) for _ in range(2)]
    return losses, state(model), state(twin), twin_opt.state_dict()["state"], saved["param_groups"]


@idiom(tol=TRAINING)
def mixed_optimizers(dev):
    # a backbone under AdamW with no weight decay on biases and norms, a head under SGD+nesterov
    model = SmallConv().to(dev)
    decay = [p for n, p in model.named_parameters() if not n.startswith("head") and p.ndim > 1]
    no_decay = [p for n, p in model.named_parameters() if not n.startswith("head") and p.ndim <= 1]
    adamw = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}])
    sgd = torch.optim.SGD(model.head.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
    others = [torch.optim.Adam(model.head.parameters(), lr=0.0, foreach=False), torch.optim.RMSprop(decay, lr=0.0)]
    x, y = torch.randn(4, 3, 6, 6).to(dev), torch.tensor([0, 1, 2, 3]).to(dev)
    losses = []
    for _ in range(3):
        for o in (adamw, sgd, *others):
            o.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        for o in (adamw, sgd, *others):
            o.step()
        losses.append(loss.detach())
    return losses, state(model), [s["momentum_buffer"] for s in sgd.state.values()]


# on edref without the CPU tier a fused step is a clear error (docs/limits.md: fused optimizers)
@idiom(tol=TRAINING, limit={"edref": ed.UnsupportedOpError})
def fused_optimizers(dev):
    model = mlp().to(dev)
    opts = [torch.optim.AdamW(model[0].parameters(), lr=1e-2, fused=True)]
    opts.append(torch.optim.SGD(model[4].parameters(), lr=0.1, momentum=0.9, fused=True))
    x, y = data(dev)
    out = []
    for _ in range(2):
        for o in opts:
            o.zero_grad()
        F.cross_entropy(model(x), y).backward()
        for o in opts:
            o.step()
        out.append([p._version for p in model.parameters()])
    return out, state(model)


def _seeded_step(dev, dropout):
    torch.manual_seed(3)
    model = mlp(dropout=dropout).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = data(dev, 12)
    perm = torch.randperm(12).to(dev)
    noise = torch.rand_like(x) * 0.1 + torch.randn_like(x) * 0.1
    return step(model, opt, x[perm] + noise, y[perm]), state(model)


@idiom()
def seeded_step(dev):
    first, second = _seeded_step(dev, 0.0), _seeded_step(dev, 0.0)
    return first, all(torch.equal(a, b) for a, b in zip(first[1].values(), second[1].values()))


@idiom()
def seeded_step_dropout(dev):
    first, second = _seeded_step(dev, 0.5), _seeded_step(dev, 0.5)
    return first, all(torch.equal(a, b) for a, b in zip(first[1].values(), second[1].values()))


# -- what timm's, transformers' and Lightning's loops do -----------------------------------------


def _accuracy(output, target, topk=(1, 3)):
    # timm.utils.accuracy
    maxk = min(max(topk), output.size(1))
    _, pred = output.topk(maxk, 1, True, True)
    correct = pred.t().eq(target.reshape(1, -1).expand_as(pred.t()))
    return [correct[: min(k, maxk)].reshape(-1).float().sum(0) * 100.0 / target.size(0) for k in topk]


@idiom(tol=TRAINING)
def timm_loop(dev):
    model = SmallConv().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    x, y = torch.randn(6, 3, 6, 6).to(dev), torch.tensor([0, 1, 2, 3, 0, 1]).to(dev)
    mixed_y = F.one_hot(y, 4).float() * 0.7 + 0.3 * F.one_hot(y.flip(0), 4).float()  # mixup's soft targets
    logged = []
    for _epoch in range(2):
        model.train()
        opt.zero_grad(set_to_none=True)
        out = model(x.flip(0) * 0.3 + x * 0.7)
        loss = torch.sum(-mixed_y * F.log_softmax(out, dim=-1), dim=-1).mean()  # SoftTargetCrossEntropy
        loss = loss + F.cross_entropy(out, y, label_smoothing=0.1)
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0, foreach=True)
        opt.step()
        logged.append((loss.item(), norm.item()))
        model.eval()
        with torch.no_grad():
            logits = model(x)
            top1, top3 = _accuracy(logits, y)
            logged.append((top1.item(), top3.item(), (logits.argmax(-1) == y).float().mean().item()))
    return logged, state(model), model.training


@idiom(tol=TRAINING)
def transformers_trainer_loop(dev):
    model = nn.Sequential(nn.Embedding(20, 8), nn.Linear(8, 5)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / 2, max(0.0, (6 - s) / 4)))
    ids = torch.randn(4, 6, 20).argmax(-1).to(dev)
    labels = torch.randn(4, 6, 5).argmax(-1)
    labels[:, -2:] = -100  # padding ignored by the loss
    labels = labels.to(dev)
    tr_loss = torch.tensor(0.0).to(dev)
    for s in range(4):
        loss = F.cross_entropy(model(ids).reshape(-1, 5), labels.reshape(-1), ignore_index=-100)
        (loss / 2).backward()
        if not (torch.isnan(loss) or torch.isinf(loss)):
            tr_loss += loss.detach()
        if s % 2 == 1:
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            model.zero_grad()
    preds = []
    with torch.no_grad():
        for batch in (ids[:2], ids[2:, :4]):
            logits = model(batch)
            padded = logits.new_full((batch.shape[0], 6, 5), -100.0)  # nested_concat pads with -100
            padded[:, : logits.shape[1]] = logits
            preds.append(padded)
    preds = torch.cat(preds).argmax(-1)
    mask = labels != -100
    return tr_loss, (preds == labels)[mask].float().mean(), preds, sched.get_last_lr(), state(model)


@idiom(tol=TRAINING)
def lightning_manual_optimization(dev):
    # a GAN with two optimizers: Lightning's toggle_optimizer freezes the other one's parameters
    gen, disc = nn.Linear(4, 6).to(dev), nn.Sequential(nn.Linear(6, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1)).to(dev)
    opt_g, opt_d = torch.optim.Adam(gen.parameters(), lr=1e-3), torch.optim.Adam(disc.parameters(), lr=1e-3)
    real, z = torch.randn(5, 6).to(dev), torch.randn(5, 4).to(dev)
    logged = []
    for _ in range(2):
        disc.requires_grad_(False)  # toggle_optimizer(opt_g)
        g_loss = F.binary_cross_entropy_with_logits(disc(gen(z)), torch.ones(5, 1).to(dev))
        opt_g.zero_grad(set_to_none=True)
        g_loss.backward()
        opt_g.step()
        disc.requires_grad_(True)
        gen.requires_grad_(False)  # toggle_optimizer(opt_d)
        logits = disc(torch.cat([real, gen(z).detach()]))
        target = torch.cat([torch.ones(5, 1), torch.zeros(5, 1)]).to(dev)
        d_loss = F.binary_cross_entropy_with_logits(logits, target)
        opt_d.zero_grad(set_to_none=True)
        d_loss.backward()
        nn.utils.clip_grad_value_(disc.parameters(), 0.05)
        opt_d.step()
        gen.requires_grad_(True)
        logged.append(torch.stack([g_loss.detach(), d_loss.detach()]).cpu())
    with torch.set_grad_enabled(False):  # the validation loop
        val = torch.stack([disc(gen(z[i : i + 2])).mean() for i in range(0, 5, 2)]).mean()
    return logged, val, state(gen), state(disc), [p.grad is None for p in gen.parameters()]


@idiom()
def collate_and_padding(dev):
    # a text collate function: variable-length sequences padded, masks, default_collate of dicts
    seqs = [torch.randn(n, 4) for n in (5, 2, 3)]
    padded = nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=-1.0).to(dev)
    left = nn.utils.rnn.pad_sequence([s.flip(0) for s in seqs], batch_first=True, padding_side="left").to(dev)
    lengths = torch.tensor([len(s) for s in seqs]).to(dev)
    mask = torch.arange(padded.shape[1]).to(dev)[None, :] < lengths[:, None]
    batch = torch.utils.data.default_collate([{"x": s[0], "n": len(s), "tag": "a"} for s in seqs])
    scores = (padded @ padded.transpose(1, 2)).masked_fill(~mask[:, None, :], float("-inf")).softmax(-1)
    pooled = (padded * mask[..., None]).sum(1) / lengths[:, None]
    return padded, left, mask, batch, scores, pooled


@idiom()
def losses(dev):
    # distillation (timm, transformers), contrastive (CLIP-style), weighted BCE, each with its backward
    student, teacher = torch.randn(6, 5).to(dev).requires_grad_(), torch.randn(6, 5).to(dev)
    T = 2.0
    kd = F.kl_div(F.log_softmax(student / T, -1), F.softmax(teacher / T, -1), reduction="batchmean") * T * T
    img, txt = F.normalize(torch.randn(4, 8).to(dev), dim=-1), F.normalize(torch.randn(4, 8).to(dev), dim=-1)
    logit_scale = torch.tensor(2.6593).to(dev).requires_grad_()
    logits = logit_scale.exp() * img @ txt.t()
    labels = torch.arange(4).to(dev)
    clip = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
    targets = (torch.randn(6, 5) > 0).float().to(dev)
    bce = F.binary_cross_entropy_with_logits(student, targets, pos_weight=torch.full((5,), 3.0).to(dev))
    p = torch.sigmoid(student)
    focal = (-(targets * (1 - p) ** 2 * torch.log(p) + (1 - targets) * p**2 * torch.log(1 - p))).mean()
    smooth = F.smooth_l1_loss(student, teacher, beta=0.5) + F.huber_loss(student, teacher, delta=2.0)
    total = kd + clip + bce + focal + smooth + F.cosine_embedding_loss(student, teacher, torch.ones(6).to(dev))
    total.backward()
    return [kd, clip, bce, focal, smooth, total], student.grad, logit_scale.grad


@idiom(tol=TRAINING)
def transformer_encoder(dev):
    # a padded batch through nn.TransformerEncoder: trained, then evaluated on the inference fast
    # path (NOTE: enable_nested_tensor=False, as docs/limits.md says: the nested path has none)
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).to(dev)
    # (SGD: the key bias's gradient is zero in exact arithmetic, which Adam's first step turns into +-lr)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 5, 8).to(dev)
    pad = (torch.arange(5)[None, :] >= torch.tensor([5, 3, 4])[:, None]).to(dev)
    loss = model(x, src_key_padding_mask=pad).masked_fill(pad[..., None], 0).square().mean()
    loss.backward()
    opt.step()
    model.eval()
    with torch.inference_mode():
        out = model(x, src_key_padding_mask=pad)
    return loss.detach(), out.masked_fill(pad[..., None], 0), state(model)


# -- what eager refuses ---------------------------------------------------------------------------


@idiom()
def eager_errors(dev):
    # each: the exception eager raises, compared by type
    model = mlp().to(dev)
    x, y = data(dev)

    def backward_twice():
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        loss.backward()

    def modified_saved_tensor():
        h = model[0](x).sigmoid()  # sigmoid saves its result for backward
        h.mul_(2)
        h.sum().backward()

    def leaf_in_place():
        model[0].weight.add_(1)

    def inference_tensor_in_autograd():
        with torch.inference_mode():
            t = torch.ones(3).to(dev)
        (model[0].weight[:, :3] * t).sum().backward()
        t.add_(1)  # outside inference mode an inference tensor cannot be updated in place

    def non_finite_norm():
        for p in model.parameters():
            p.grad = torch.full_like(p, math.inf)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)

    return [
        raised(backward_twice),
        raised(modified_saved_tensor),
        raised(leaf_in_place),
        raised(inference_tensor_in_autograd),
        raised(non_finite_norm),
        raised(lambda: model(x).cpu().numpy()),  # (a device tensor's .numpy() is a TypeError first)
        raised(lambda: model(x).sum(0).item()),
        raised(lambda: model(x[:, :4])),  # a shape mismatch in the first Linear
        raised(lambda: F.cross_entropy(model(x), torch.full_like(y, 7))),  # a class out of range
        raised(lambda: torch.randn(3).to(dev).view(-1, 2)),
    ]


# -- sparse gradients and complex filters ---------------------------------------------------------


# NOTE: a documented limit ("Sparse gradients and complex conjugates stay errors"): no preset has
# sparse kernels, and on edref PyTorch itself refuses a sparse tensor (no Sparseedref kernel)
@idiom(limit={"mode": ed.UnsupportedOpError, "edref": NotImplementedError})
def sparse_embedding(dev):
    emb = nn.Embedding(10, 4, sparse=True).to(dev)
    opt = torch.optim.SparseAdam(emb.parameters(), lr=0.1)
    ids = torch.tensor([[1, 2, 2], [7, 1, 0]]).to(dev)
    emb(ids).square().sum().backward()
    g = emb.weight.grad.coalesce()
    opt.step()
    return g.indices(), g.values(), emb.weight.detach()


@idiom()
def dense_embedding(dev):
    # the way through the limit above: sparse=False (and with SGD, sparse=True's weights)
    emb = nn.Embedding(10, 4, padding_idx=0).to(dev)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)
    ids = torch.tensor([[1, 2, 2], [7, 1, 0]]).to(dev)
    emb(ids).square().sum().backward()
    grad = emb.weight.grad.clone()
    opt.step()
    return grad, emb.weight.detach()


# NOTE: a documented limit (as above): the gradient conjugates (_conj, a conjugate view core ATen
# cannot express); edref has the complex views, and the filter runs there
@idiom(limit={"mode": ed.UnsupportedOpError})
def fft_filter(dev):
    x = torch.randn(2, 16).to(dev).requires_grad_()
    spec = torch.fft.rfft(x)
    filt = torch.exp(-torch.arange(9.0) / 4).to(dev) * torch.exp(1j * torch.linspace(0, 1, 9)).to(dev)
    y = torch.fft.irfft(spec * filt, n=16)
    y.square().sum().backward()
    return y.detach(), x.grad, spec.abs().detach()
