"""Recording the model corpus: the aten overloads real models call, per phase, with counts.

Each model is built offline from its config with random weights, made tiny (hidden size
64, two layers, four heads: see :data:`SHRINK`) so a step takes a second, and run under
:class:`~eagerdecomp.testing.RecordingMode`, which counts every op that reaches the
Python dispatch level: what :class:`~eagerdecomp.EagerDecompMode` would meet. Phases:

* ``train``: a forward with labels where the head takes them (else the mean of its
  floating outputs), backward, one ``AdamW`` step (CPU defaults, so no ``foreach``);
* ``infer``: ``eval()`` and ``no_grad``;
* ``generate``: ``generate(max_new_tokens=4)`` for language-model heads.

A phase other than ``train`` is kept only where it calls an op the training step does not.
Models come from every architecture of ``transformers``' auto-model mappings (one head per
``model_type``, by :data:`HEADS`) and from :mod:`eagerdecomp.coverage.cnns`. Each is recorded
in a forked child with a timeout, so a model that hangs or crashes costs only itself;
results go to a checkpoint file line by line, so an interrupted run resumes.

Example::

    python -m eagerdecomp coverage record --limit 20 -o /tmp/models.json
"""

from __future__ import annotations

import datetime
import hashlib
import inspect
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch

from eagerdecomp.runtime.paths import cache_dir

__all__ = ["HEADS", "SHRINK", "specs", "build", "train_step", "record_model", "record_corpus", "DATA"]

DATA = Path(__file__).parent / "data" / "models.json"

# (auto-mapping, family, labels the head takes): one head per model_type, the first that has it.
# NOTE: encoder-decoder and encoder heads come before causal LM: BERT and Whisper also have a
# decoder-only causal head, which is not what they are used for
HEADS = [
    ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "encoder-decoder LM", "ids"),
    ("MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", "speech", "ids"),
    ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "encoder LM", "ids"),
    ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "decoder LM", "ids"),
    ("MODEL_FOR_CTC_MAPPING_NAMES", "speech", "ctc"),
    ("MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES", "speech", "class"),
    ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "vision", "class"),
    ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "encoder LM", "class"),
    ("MODEL_MAPPING_NAMES", None, None),  # base models: family from the inputs they take
]

# Config fields made small (never larger than the default): (names, value).
SHRINK = [
    (
        ("hidden_size", "d_model", "n_embd", "dim", "embed_dim", "hidden_dim", "word_embed_proj_dim", "projection_dim"),
        64,
    ),
    (("embedding_size",), 32),
    (
        (
            "intermediate_size",
            "ffn_dim",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "d_ff",
            "n_inner",
            "shared_expert_intermediate_size",
        ),
        128,
    ),
    (("moe_intermediate_size", "expert_intermediate_size"), 64),
    (
        (
            "num_hidden_layers",
            "num_layers",
            "n_layer",
            "n_layers",
            "encoder_layers",
            "decoder_layers",
            "num_decoder_layers",
            "num_encoder_layers",
            "depth",
        ),
        2,
    ),
    (("num_attention_heads", "n_head", "n_heads", "encoder_attention_heads", "decoder_attention_heads"), 4),
    (("num_key_value_heads", "num_kv_heads", "multi_query_group_num"), 2),  # 4 heads over 2: grouped-query
    (("head_dim", "d_kv", "attention_head_dim", "kv_channels"), 16),
    (("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    (("num_experts_per_tok", "moe_topk", "num_experts_per_token"), 2),
    (("max_source_positions",), 64),  # speech encoders that insist on a fixed input length
]
_LISTS = {"depths": lambda v: [1] * len(v)}
_PER_LAYER = ("layer_types", "mlp_layer_types", "full_attn_idxs", "attn_layer_indices")
MAX_PARAMS = 40_000_000  # a model still bigger than this after shrinking is too slow to step here

# marks of a family refinement on the config: (family suffix, any of these fields > 1)
_TRAITS = [
    (" (MoE)", ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")),
    (" (state-space)", ("state_size", "ssm_state_size", "mamba_d_state", "d_state")),
]


def specs(limit=None, only=None) -> list:
    """``[{"name", "source", "family", "model_type", "class", "labels"}]``: what to record."""
    from transformers.models.auto import modeling_auto

    from eagerdecomp.coverage.cnns import CNNS

    out, seen = [], set()
    for mapping, family, labels in HEADS:
        for model_type, cls in getattr(modeling_auto, mapping).items():
            # several model_types can share a class (aliases): one model per class
            if model_type in seen or not isinstance(cls, str) or f"transformers/{cls}" in seen:
                continue
            seen |= {model_type, f"transformers/{cls}"}
            out.append(
                {
                    "name": f"transformers/{cls}",
                    "source": "transformers",
                    "family": family,
                    "model_type": model_type,
                    "class": cls,
                    "labels": labels,
                }
            )
    out += [
        {
            "name": f"cnn/{n}",
            "source": "eagerdecomp.coverage.cnns",
            "family": "classic CNN",
            "class": n,
            "labels": "class",
        }
        for n in CNNS
    ]
    if only:
        out = [s for s in out if any(o in s["name"] for o in only)]
    return out[:limit] if limit else out


# -- one model ------------------------------------------------------------------------------------


def _shrunk(config_cls, default):
    """Constructor arguments that make ``default`` (a config) tiny, recursing into sub-configs."""
    params = set(inspect.signature(config_cls.__init__).parameters)
    kwargs = {}
    for names, value in SHRINK:
        for n in names:
            v = getattr(default, n, None) if n in params or n in vars(default) else None
            if isinstance(v, int) and not isinstance(v, bool) and v > value:
                kwargs[n] = value
    for n, rule in _LISTS.items():
        v = getattr(default, n, None)
        if isinstance(v, (list, tuple)) and v and all(isinstance(x, int) for x in v):
            kwargs[n] = rule(v)
    from transformers import PretrainedConfig

    for n, sub in list(vars(default).items()):
        if isinstance(sub, PretrainedConfig):  # text_config, vision_config, audio_config...
            inner = _shrunk(type(sub), sub)
            # NOTE: fields derived from the layer count (one entry per layer) are derived again
            kwargs[n] = {k: v for k, v in dict(sub.to_dict(), **inner).items() if k not in _PER_LAYER}
    return kwargs


def _build(spec):
    import transformers
    from transformers import CONFIG_MAPPING

    config_cls = CONFIG_MAPPING[spec["model_type"]]
    default = config_cls()
    kwargs = _shrunk(config_cls, default)
    model_cls = getattr(transformers, spec["class"])
    errors = []
    # NOTE: some shrink combinations break an architecture's constraints (heads dividing the
    # width, a list per stage); then fewer fields are shrunk, layers last of all
    for attempt in (
        kwargs,
        {k: v for k, v in kwargs.items() if k not in _LISTS},
        {k: v for k, v in kwargs.items() if k in SHRINK[4][0] or isinstance(v, dict)},
    ):
        try:
            config = config_cls(**attempt)
            with torch.device("meta"):  # sized first: initialising a big model takes a minute
                n = sum(p.numel() for p in model_cls(config).parameters())
            if n > MAX_PARAMS:
                errors.append(f"{n / 1e6:.0f}M parameters after shrinking")
                continue
            return model_cls(config), config, attempt
        except Exception as e:  # noqa: BLE001 - the next, milder attempt
            errors.append(f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
    raise RuntimeError("; ".join(dict.fromkeys(errors)))


def _image_size(config):
    size = (
        getattr(config, "image_size", None)
        or getattr(getattr(config, "vision_config", None), "image_size", None)
        or 224
    )
    size = size if isinstance(size, (list, tuple)) else (size, size)
    return [int(s) for s in size[-2:]]


def _inputs(model, config, spec, batch=2, seq=16) -> tuple:
    """``(inputs, family)``: the arguments ``model.forward`` takes, made up from its config."""
    params = set(inspect.signature(model.forward).parameters)
    text_config = getattr(config, "text_config", None) or config
    vocab = getattr(text_config, "vocab_size", None) or getattr(config, "vocab_size", None) or 100
    g = torch.Generator().manual_seed(0)
    x, kinds = {}, []
    if "input_ids" in params:
        x["input_ids"] = torch.randint(3, max(4, min(int(vocab), 1000)), (batch, seq), generator=g)
        if "attention_mask" in params:
            x["attention_mask"] = torch.ones(batch, seq, dtype=torch.long)
        kinds.append("text")
    if "pixel_values" in params:
        c = getattr(config, "num_channels", None) or getattr(getattr(config, "vision_config", None), "num_channels", 3)
        x["pixel_values"] = torch.randn(batch, int(c), *_image_size(config), generator=g)
        kinds.append("image")
    if "input_values" in params and not x:
        x["input_values"] = torch.randn(batch, 4000, generator=g)
        kinds.append("audio")
    if "input_features" in params and not x:
        bins = getattr(config, "num_mel_bins", None) or getattr(config, "feature_size", None) or 80
        frames = 2 * getattr(config, "max_source_positions", 64)
        x["input_features"] = torch.randn(batch, int(bins), int(frames), generator=g)
        kinds.append("audio")
    if not x:
        raise RuntimeError(f"no input it takes is known here (forward takes {sorted(params)[:8]})")
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        x["decoder_input_ids"] = torch.randint(3, max(4, min(int(vocab), 1000)), (batch, 8), generator=g)
    family = spec["family"] or {("text",): "text (base model)", ("image",): "vision", ("audio",): "speech"}.get(
        tuple(kinds), "multimodal"
    )
    for suffix, fields in _TRAITS:
        if any(
            isinstance(getattr(c, f, None), int) and getattr(c, f) > 1 for c in (config, text_config) for f in fields
        ):
            family += suffix
    return x, family


def _labels(spec, x, config):
    kind = spec["labels"]
    if kind == "ids" and "input_ids" in x:
        return x["input_ids"] if not getattr(config, "is_encoder_decoder", False) else x["input_ids"][:, :8]
    if kind == "class":
        return torch.zeros(2, dtype=torch.long)
    if kind == "ctc":
        return torch.randint(1, max(2, min(getattr(config, "vocab_size", 10) or 10, 30)), (2, 4))
    return None


def _loss(out):
    loss = getattr(out, "loss", None)
    if loss is not None:
        return loss
    values = out.to_tuple() if hasattr(out, "to_tuple") else out if isinstance(out, (tuple, list)) else (out,)
    flat = [t for t in torch.utils._pytree.tree_leaves(values) if isinstance(t, torch.Tensor)]
    floats = [t for t in flat if t.is_floating_point() and t.requires_grad]
    if not floats:
        raise RuntimeError("no floating output that requires grad")
    return sum(t.float().mean() for t in floats)


def _counts(rec) -> dict:
    return {str(op): n for op, n in sorted(rec.ops.items(), key=lambda kv: str(kv[0]))}


def build(spec) -> tuple:
    """``(model, inputs, labels, family, config overrides)`` for one spec, seeded."""
    torch.manual_seed(0)
    if spec["source"] == "transformers":
        model, config, shrunk = _build(spec)
        x, family = _inputs(model, config, spec)
        return model, x, _labels(spec, x, config), family, shrunk
    from eagerdecomp.coverage.cnns import CNNS

    return CNNS[spec["class"]](), {"x": torch.randn(2, 3, 32, 32)}, torch.zeros(2, dtype=torch.long), spec["family"], {}


def _no_cache(model, x) -> dict:
    # NOTE: a forward outside generate() keeps no key/value cache (as training does); hybrid
    # state-space models refuse to build one from a plain forward
    return dict(x, use_cache=False) if "use_cache" in inspect.signature(model.forward).parameters else x


def train_step(model, x, labels, opt, on_retry=None) -> None:
    """Forward (with labels where the head takes them), backward, one optimizer step."""
    model.train()
    x = _no_cache(model, x)
    try:
        out = model(**x, labels=labels) if labels is not None else model(**x)
    except Exception:  # noqa: BLE001 - a head whose labels this guess got wrong: no labels
        if labels is None:
            raise
        if on_retry:
            on_retry()
        out = model(**x)
    _loss(out).backward()
    opt.step()
    opt.zero_grad()


def record_model(spec) -> dict:
    """Build one model and record its phases: ``{"family", "params", "config", "notes", "phases"}``."""
    from eagerdecomp.testing import RecordingMode

    model, x, labels, family, shrunk = build(spec)
    phases = {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with RecordingMode() as rec:
        train_step(model, x, labels, opt, on_retry=rec.ops.clear)
    phases["train"] = _counts(rec)
    model.eval()
    with RecordingMode() as rec, torch.no_grad():
        model(**_no_cache(model, x))
    phases["infer"] = _counts(rec)
    notes = []
    if spec["labels"] == "ids" and "input_ids" in x and getattr(model, "can_generate", lambda: False)():
        try:
            with RecordingMode() as rec:
                model.generate(
                    **{k: v for k, v in x.items() if k in ("input_ids", "attention_mask")},
                    max_new_tokens=4,
                    do_sample=False,
                    pad_token_id=0,
                    bos_token_id=1,
                    decoder_start_token_id=0,
                )
            phases["generate"] = _counts(rec)
        except Exception as e:  # noqa: BLE001 - the other phases stand; the data says why this one is missing
            notes.append(f"generate: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
    train = set(phases["train"])
    phases = {k: v for k, v in phases.items() if k == "train" or not set(v) <= train}
    return {
        "family": family,
        "params": sum(p.numel() for p in model.parameters()),
        "notes": notes,
        "config": {k: v for k, v in shrunk.items() if not isinstance(v, dict)},
        "phases": phases,
    }


# -- the corpus: forked children with a timeout, a checkpoint, one compact file ------------------


def _in_child(spec, timeout: float) -> dict:
    fd, path = tempfile.mkstemp(prefix="eagerdecomp-rec-")
    os.close(fd)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)  # models warn a lot; the parent reports
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            try:
                result = {"ok": record_model(spec)}
            except BaseException as e:  # noqa: BLE001 - recorded as the model's reason
                text = str(e).strip().splitlines()
                result = {"error": f"{type(e).__name__}: {text[0][:300] if text else ''}"}
            with open(path, "w") as f:
                json.dump(result, f)
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.unlink(path)
            return {"error": f"timed out after {timeout:.0f} s"}
        time.sleep(0.05)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"error": f"the recording process died (status {status})"}
    finally:
        os.unlink(path)


def record_corpus(output=DATA, limit=None, only=None, timeout: float = 120.0, checkpoint=None, progress=print) -> dict:
    """Record every spec (see :func:`specs`) and write the compact corpus file to ``output``.

    ``checkpoint`` (a JSON-lines file, by default under ``cache_dir("coverage")``) keeps each
    result as it comes, so a run that was stopped resumes; it is removed once the corpus is written.
    Call it from a process that has not run autograd yet (as ``python -m eagerdecomp coverage
    record`` does): each model is recorded in a forked child, and autograd's worker threads do
    not survive a fork.
    """
    import transformers

    # NOTE: transformers' model infrastructure takes seconds to import; imported once here,
    # every forked child starts with it (each model's own module is imported in its child)
    import transformers.generation.utils  # noqa: F401
    import transformers.modeling_utils  # noqa: F401

    torch.set_num_threads(1)  # forked children must not inherit an OpenMP pool
    output = Path(output)
    tag = hashlib.sha1(str(output.resolve()).encode()).hexdigest()[:10]
    checkpoint = Path(checkpoint or cache_dir("coverage") / f"record-{tag}.jsonl")
    done = {}
    if checkpoint.exists():
        for line in checkpoint.read_text().splitlines():
            r = json.loads(line)
            done[r["name"]] = r
    todo = specs(limit, only)
    with open(checkpoint, "a") as ck:
        for i, spec in enumerate(todo, 1):
            if spec["name"] in done:
                continue
            t0 = time.perf_counter()
            result = dict(
                _in_child(spec, timeout), name=spec["name"], spec=spec, seconds=round(time.perf_counter() - t0, 1)
            )
            done[spec["name"]] = result
            ck.write(json.dumps(result) + "\n")
            ck.flush()
            progress(
                f"[{i}/{len(todo)}] {spec['name']}: "
                f"{'ok' if 'ok' in result else result['error'][:120]} ({result['seconds']} s)"
            )
    data = _compact([done[s["name"]] for s in todo if s["name"] in done], transformers.__version__)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    checkpoint.unlink()
    return data


def _compact(results: list, transformers_version: str) -> dict:
    """One file: op names once (``ops``), each model's phases as ``[[op index, count], ...]``."""
    ops = sorted({op for r in results if "ok" in r for phase in r["ok"]["phases"].values() for op in phase})
    index = {op: i for i, op in enumerate(ops)}
    models, skipped = {}, {}
    for r in results:
        if "ok" not in r:
            skipped[r["name"]] = r["error"]
            continue
        m = r["ok"]
        models[r["name"]] = {
            "family": m["family"],
            "source": r["spec"]["source"],
            "class": r["spec"]["class"],
            "params": m["params"],
            "config": m["config"],
            **({"notes": m["notes"]} if m.get("notes") else {}),
            "phases": {k: [[index[op], n] for op, n in v.items()] for k, v in m["phases"].items()},
        }
    return {
        "format": "eagerdecomp model corpus 1",
        "recorded": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers_version,
            "python": sys.version.split()[0],
        },
        "command": "python -m eagerdecomp coverage record",
        "ops": ops,
        "models": models,
        "skipped": skipped,
    }
