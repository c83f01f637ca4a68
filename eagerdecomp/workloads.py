"""Representative workloads, and kernel bundles built by running them.

A *workload* is a short piece of real work under :class:`~eagerdecomp.EagerDecompMode`: the
demo's training steps (and its device half on ``edref``), a tiny ``transformers`` BERT trained
at several sequence lengths, a tiny Llama's greedy ``generate()``, or a model of the corpus
(``python -m eagerdecomp cache build --corpus``). :func:`build` runs workloads with the
persistent kernel cache pointed at a new folder and writes a bundle's manifest there
(:mod:`eagerdecomp.runtime.bundle`): every kernel they traced, every shape family and every
C++ program they installed is then on disk, for ``EAGERDECOMP_BUNDLE`` to serve read-only.

Why running and not enumerating: a kernel is keyed by everything that can change it (op,
ranks, layouts, dtypes, non-tensor arguments, grad mode...), which only a real call knows;
a model corpus lists ops, not calls. Shape families make a bundle general in sizes: the BERT
workload trains at lengths the benchmarks never use (``BUNDLE_LENGTHS``), and the kernels it
leaves answer every other length without a trace. ``bench/shapes.py`` measures a cold process
with and without a bundle; ``tests/runtime/test_bundle.py`` checks it traces nothing and
answers identically.

The BERT and Llama builders here are the ones ``bench/shapes.py`` measures (one definition).
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "Workload",
    "WORKLOADS",
    "VOCAB",
    "BATCH",
    "BUNDLE_LENGTHS",
    "bert",
    "llama",
    "bert_batches",
    "bert_step",
    "generate",
    "build",
]

VOCAB = 1000
BATCH = 4
# lengths the bundle's BERT trains at: none of bench/shapes.py's, so its runs meet only families
BUNDLE_LENGTHS = (8, 12, 19, 32)


@dataclass(frozen=True)
class Workload:
    """``run(opset, dtype)`` does the work under ``EagerDecompMode(opset)`` (and may do more,
    as the demo's device half); ``dtype`` is the floating dtype of its model and inputs."""

    name: str
    run: Callable
    doc: str = ""


# -- the models ----------------------------------------------------------------------------------


def bert():
    """A 2-layer BERT (hidden 64) for sequence classification, random weights (seed 0), dropout off."""
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=128,
        num_labels=3,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # dropout off: compared with native
    torch.manual_seed(0)
    return BertForSequenceClassification(cfg)


def llama():
    """A 2-layer Llama (hidden 64, 4 heads over 2 key/value heads), random weights (seed 0), eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=1024,  # (rotary: no parameter; room for bench/shapes.py's long prompts)
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def bert_batches(lengths, device="cpu", batch: int = BATCH, seed: int = 1) -> list:
    """``(ids, mask, labels)`` per length; the first row half padded, as a collate function makes it."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        ids = torch.randint(0, VOCAB, (batch, n), generator=g)
        mask = torch.ones(batch, n, dtype=torch.long)
        mask[0, n // 2 :] = 0
        labels = torch.randint(0, 3, (batch,), generator=g)
        out.append(tuple(t.to(device) for t in (ids, mask, labels)))
    return out


def bert_step(model, opt, batch):
    """One training step (forward with labels, backward, optimizer step); returns the loss."""
    ids, mask, labels = batch
    opt.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    opt.step()
    return loss


def generate(model, ids, new_tokens: int):
    """Greedy decoding of exactly ``new_tokens`` tokens with the KV cache."""
    return model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)


# -- the workloads -------------------------------------------------------------------------------


def _demo(opset, dtype) -> None:
    import eagerdecomp as ed
    from eagerdecomp.demo import SmallCNN, TransformerBlock, device_main, train_step

    # the calls `make demo` makes under the mode: one step with dropout off, then six with it
    for dropout, steps in ((0.0, 1), (0.1, 6)):
        torch.manual_seed(0)
        model = TransformerBlock(dropout=dropout).to(dtype)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x, y = TransformerBlock.batch()
        with ed.EagerDecompMode(opset):
            for _ in range(steps):
                train_step(model, opt, x.to(dtype), y)
    torch.manual_seed(0)
    cnn = SmallCNN().to(dtype)
    opt = torch.optim.AdamW(cnn.parameters(), lr=1e-3)
    x, y = SmallCNN.batch()
    with ed.EagerDecompMode(opset):
        for _ in range(3):
            train_step(cnn, opt, x.to(dtype), y)
    if dtype == torch.float32:
        with contextlib.redirect_stdout(io.StringIO()):  # the demo's device half: edref's own opset
            device_main()


def _bert(opset, dtype) -> None:
    import eagerdecomp as ed

    model = bert().to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = bert_batches(BUNDLE_LENGTHS)
    with ed.EagerDecompMode(opset):
        for b in batches:
            bert_step(model, opt, b)
        model.eval()
        with torch.no_grad():
            for ids, mask, _ in batches[:2]:
                model(input_ids=ids, attention_mask=mask)


def _llama(opset, dtype) -> None:
    import eagerdecomp as ed

    model = llama().to(dtype)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, VOCAB, (1, n), generator=g) for n in (5, 11)]  # (an explicit generator has no path)
    with ed.EagerDecompMode(opset):
        for ids in prompts:
            generate(model, ids, 12)


WORKLOADS = {
    w.name: w
    for w in (
        Workload("demo", _demo, "make demo: TransformerBlock and SmallCNN training, and its edref half"),
        Workload("bert", _bert, f"a tiny BERT trained at lengths {BUNDLE_LENGTHS}, and its inference"),
        Workload("llama", _llama, "a tiny Llama's greedy generate() from two prompt lengths"),
    )
}


# -- building a bundle ---------------------------------------------------------------------------


def _traces(fn) -> int:
    """Kernels traced while ``fn`` runs (every runtime of the process)."""
    from eagerdecomp.runtime.cache import cache_info

    before = cache_info().traced
    fn()
    return cache_info().traced - before


def build(output, opset="core_aten", workloads=("demo", "bert", "llama"), dtypes=(torch.float32,), progress=print):
    """Run ``workloads`` (names of :data:`WORKLOADS`, or :class:`Workload` objects) at each of
    ``dtypes`` and write what they traced into the bundle folder ``output``; returns its manifest.

    Call it in a process of its own, before any backward pass (the demo's device half needs
    the reference device registered first): it points the process's disk cache at ``output``.
    ``output`` must be empty, new, or an earlier bundle (extended; replaced when stale).
    """
    import shutil

    import eagerdecomp as ed
    from eagerdecomp.errors import EagerDecompError
    from eagerdecomp.ops.opset import OpSet
    from eagerdecomp.runtime import bundle, disk

    output = Path(output).resolve()
    if output.exists() and any(output.iterdir()):
        try:
            old = bundle.read_manifest(output)
        except (OSError, ValueError):
            raise EagerDecompError(f"{output} is neither empty nor a kernel bundle: not written to") from None
        if old.get("sources") != disk.code_fingerprint():
            shutil.rmtree(output / "kernels", ignore_errors=True)  # stale: nothing in it would be read
    output.mkdir(parents=True, exist_ok=True)
    opset = OpSet.coerce(opset)
    # NOTE: every key traced at its first call (no direct tier): a bundle holds each kernel its
    # workloads meet, not only the keys that proved hot in this one run
    os.environ.update(
        EAGERDECOMP_CACHE_DIR=str(output),
        EAGERDECOMP_DISK_CACHE="1",
        EAGERDECOMP_DISK_EVERY_KEY="1",
        EAGERDECOMP_TRACE_AFTER="0",
    )
    # a kernel another bundle (or the shipped one) answered would not be written here
    os.environ.pop("EAGERDECOMP_BUNDLE", None)
    os.environ["EAGERDECOMP_SHIPPED_BUNDLE"] = "0"
    try:
        from eagerdecomp.device.refdev import reference_device

        reference_device()  # before the first backward pass, as the demo does
    except EagerDecompError:
        pass
    ed.cache_clear()  # what this process traced before is not on disk here
    runs = []
    for w in workloads:
        w = WORKLOADS[w] if isinstance(w, str) else w
        for dtype in dtypes:
            t0 = time.perf_counter()
            error = None
            try:
                traced = _traces(lambda w=w, dtype=dtype: w.run(opset, dtype))
            except Exception as e:  # noqa: BLE001 - the bundle keeps what the others traced; the manifest says
                traced, error = None, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            runs.append(
                {"workload": w.name, "dtype": str(dtype).removeprefix("torch."), "traced": traced, "error": error}
            )
            progress(
                f"{w.name} ({runs[-1]['dtype']}): "
                + (f"{traced} kernels traced" if error is None else f"failed: {error}")
                + f", {time.perf_counter() - t0:.1f} s"
            )
    disk.flush()  # the programs each store wrote, packed into one file per folder
    ours = disk.folder_name(opset)
    kernels = output / "kernels"
    folders = sorted(p.name for p in kernels.iterdir() if p.is_dir()) if kernels.is_dir() else []
    # NOTE: the demo's device half runs over the device's opset: a folder of its own
    opsets = {f: (opset.name or "custom") if f == ours else "another opset (a device's)" for f in folders}
    return bundle.write_manifest(
        output,
        disk.code_fingerprint(),
        opsets=opsets,
        dtypes=sorted({r["dtype"] for r in runs}),
        runs=runs,
        entries=sum(1 for f in folders for _ in (kernels / f).rglob("*.pkl")),
        built=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
