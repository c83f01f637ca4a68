"""Command line: ``python -m eagerdecomp coverage ...`` and ``python -m eagerdecomp profile script.py``.

``report`` is an alias of ``coverage`` (its name before the coverage tool got its subpackage).

Examples::

    python -m eagerdecomp coverage --opset core_aten          # every aten overload, and what to implement next
    python -m eagerdecomp coverage --opset prims --summary    # counts and the top of "implement next" only
    python -m eagerdecomp coverage --opset prims_fusion --models --summary   # prims + the library ops: models run
    python -m eagerdecomp coverage --opset-file ops.txt --format json -o coverage.json
    python -m eagerdecomp coverage --format html -o coverage.html   # the interactive page
    python -m eagerdecomp coverage --op gelu                  # the ops whose name contains "gelu"
    python -m eagerdecomp coverage --verify                   # check the verdicts against real lowering
    python -m eagerdecomp coverage --models --summary         # which models of the corpus run; ops to add for 50-100%
    python -m eagerdecomp coverage --models --corpus ../shared/data/pytorch_model_ops.json --format json
    python -m eagerdecomp coverage record                     # re-record the model corpus (tens of minutes)
    python -m eagerdecomp coverage graph                      # rebuild the graph the package ships (minutes)
    python -m eagerdecomp profile train.py --epochs 1         # run a script under the mode
    python -m eagerdecomp cache build -o bundle/              # pre-trace the demo, BERT and Llama kernels
    python -m eagerdecomp cache build --corpus models.json --models Bert Llama --dtypes float32,bfloat16 -o bundle/
    python -m eagerdecomp cache info bundle/                  # what a bundle was built for, and whether it is usable
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["main"]


def _opset(args):
    from eagerdecomp.ops.opset import OpSet

    if args.opset_file:
        return OpSet.from_file(args.opset_file)
    return OpSet.preset(args.opset)


def _write(text: str, path) -> None:
    if path in (None, "-"):
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    else:
        with open(path, "w") as f:
            f.write(text)
        print(f"wrote {path}", file=sys.stderr)


def _report(args) -> int:
    from eagerdecomp import coverage

    opset = _opset(args)
    graph = coverage.load_graph(rebuild=args.rebuild)
    if args.format == "html":
        from eagerdecomp.coverage.models import load_corpus
        from eagerdecomp.coverage.page import render

        corpora = [load_corpus(c) for c in args.corpus] if args.corpus else None
        _write(render(graph, opset, corpora), args.output or "coverage.html")
        return 0
    cov = coverage.analyse(graph, opset)
    if args.verify:
        return _verify(cov, graph, opset, args)
    if args.models:
        return _models(cov, args)
    if args.format == "json":
        data = cov.to_dict(args.top)
        if args.op:
            data["ops"] = [r for r in data["ops"] if args.op in r["op"]]
        _write(json.dumps(data, indent=1), args.output)
        return 0
    if args.op:
        rows = [r for r in cov.rows.values() if args.op in r.op]
        text = "\n".join(_row_text(cov, r) for r in rows) or f"no aten overload matches {args.op!r}"
    elif args.summary:
        text = cov.table(args.top, show=())
    else:
        text = cov.table(args.top)
    _write(text, args.output)
    return 0


def _models(cov, args) -> int:
    from eagerdecomp.coverage.models import TARGETS, analyse_models

    targets = args.target or TARGETS
    results = [analyse_models(cov, c) for c in (args.corpus or [None])]
    if args.format == "json":
        _write(json.dumps({"corpora": [m.to_dict(args.top, targets) for m in results]}, indent=1), args.output)
    else:
        _write("\n\n".join(m.table(args.top, targets, show_models=not args.summary) for m in results), args.output)
    return 0


def _record(args) -> int:
    from eagerdecomp.coverage.record import DATA, record_corpus

    def progress(msg):
        print(msg, file=sys.stderr, flush=True)

    data = record_corpus(args.output or DATA, limit=args.limit, only=args.only, timeout=args.timeout, progress=progress)
    print(
        f"recorded {len(data['models'])} models ({len(data['skipped'])} skipped) to {args.output or DATA}",
        file=sys.stderr,
    )
    return 0


def _ship_graph(args) -> int:
    from eagerdecomp.coverage.graph import SHIPPED, fingerprint, load_graph, write_shipped

    # NOTE: built afresh, not taken from the disk cache: the shipped file is what this code
    # and this torch give, whatever this machine cached before
    graph = load_graph(rebuild=True)
    path = write_shipped(graph, args.output or SHIPPED)
    print(
        f"wrote {path} ({path.stat().st_size // 1024} KB; fingerprint {fingerprint()}, built in "
        f"{graph.build_seconds:.0f} s)",
        file=sys.stderr,
    )
    return 0


def _verify(cov, graph, opset, args) -> int:
    from eagerdecomp import coverage

    ops = [r.op for r in cov.rows.values() if not args.op or args.op in r.op]
    print(f"lowering {len(ops)} ops on their samples under {opset.name or 'the opset'} ...", file=sys.stderr)
    real = coverage.verify([opset], ops, quiet=False)[0]
    counts, mismatches = coverage.check(cov, real)
    lines = [
        f"{cov.summary()}",
        "graph verdict against real lowering (eagerdecomp.runtime.lower.Lowerer, same samples):",
    ]
    lines += [f"  {n:6} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    lines += ["", f"mismatches ({len(mismatches)}):"] + [f"  {op}: {what}: {detail}" for op, what, detail in mismatches]
    _write("\n".join(lines), args.output)
    return 0


def _row_text(cov, r) -> str:
    node = cov.nodes.get(r.op, {})
    lines = [f"{r.op}: {r.status}"]
    if r.status == "reaches":
        lines.append(
            f"  depth {r.depth}, lands on: {', '.join(r.leaves) or '(no op: computes nothing a backend runs)'}"
        )
        if r.caveats:
            lines.append(f"  some inputs fail in: {', '.join(r.caveats)}")
    elif r.status in ("no path", "undetermined"):
        lines.append(f"  blocked by {' -> '.join(r.chain)}: {r.reason}")
    if node.get("via"):
        lines.append(f"  decomposition: {node['via']}")
    if node.get("children"):
        lines.append(f"  calls directly: {', '.join(node['children'])}")
    lines += [f"  note: {n}" for n in node.get("notes", ())]
    return "\n".join(lines)


def _profile(args) -> int:
    from eagerdecomp.profile import profile_script

    opset = _opset(args) if args.opset_file else args.opset
    p = profile_script(args.script, args.argv, opset=opset)
    _write(json.dumps(p.to_dict(), indent=1) if args.format == "json" else str(p), args.output)
    return 0


def _dtypes(text: str) -> list:
    import torch

    out = []
    for name in filter(None, (t.strip() for t in text.split(","))):
        dtype = getattr(torch, name.removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise argparse.ArgumentTypeError(f"{name!r} is not a floating torch dtype (float32, bfloat16, ...)")
        out.append(dtype)
    return out


def _corpus_workloads(args) -> list:
    """A workload per model of the corpus that the recorder can build here (``--models`` filters by name)."""
    from eagerdecomp.coverage.models import load_corpus
    from eagerdecomp.coverage.record import build, specs, train_step
    from eagerdecomp.workloads import Workload

    corpus = load_corpus(args.corpus)
    chosen = [s for s in specs(only=args.models) if s["name"] in corpus.models]
    missing = sorted(set(corpus.models) - {s["name"] for s in specs()})
    if missing:
        print(
            f"{len(missing)} models of {corpus.name} cannot be built here (skipped), e.g. {missing[:3]}",
            file=sys.stderr,
        )

    def run(spec, opset, dtype):
        import torch

        import eagerdecomp as ed

        model, x, labels, _, _ = build(spec)
        model.to(dtype)
        x = {k: v.to(dtype) if v.is_floating_point() else v for k, v in x.items()}
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with ed.EagerDecompMode(opset):
            train_step(model, x, labels, opt)
            model.eval()
            with torch.no_grad():
                model(**x)

    return [Workload(s["name"], lambda opset, dtype, s=s: run(s, opset, dtype)) for s in chosen]


def _cache_build(args) -> int:
    from eagerdecomp.ops.opset import OpSet
    from eagerdecomp.workloads import WORKLOADS, build

    if not args.output:
        raise OSError("cache build needs -o DIR: the bundle's folder")
    names = [w for w in (args.workloads or "").split(",") if w]
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown:
        raise OSError(f"unknown workload(s) {unknown}; known: {sorted(WORKLOADS)}")
    work = names + (_corpus_workloads(args) if args.corpus or args.models else [])
    opset = OpSet.from_file(args.opset_file) if args.opset_file else args.opset
    manifest = build(args.output, opset, work, args.dtypes, progress=lambda m: print(m, file=sys.stderr, flush=True))
    failed = [r for r in manifest["runs"] if r["error"]]
    print(
        f"wrote the bundle {args.output}: {manifest['entries']} entries for {len(manifest['opsets'])} opset folder(s), "
        f"{len(manifest['runs']) - len(failed)} workload run(s) ({len(failed)} failed); "
        f"use it with EAGERDECOMP_BUNDLE={args.output}",
        file=sys.stderr,
    )
    return 1 if failed else 0


def _cache_info(args) -> int:
    from eagerdecomp.runtime import bundle, disk

    manifest = bundle.read_manifest(args.dir)
    usable = manifest.get("sources") == disk.code_fingerprint()
    manifest["usable here"] = usable
    _write(json.dumps(manifest, indent=1, sort_keys=True), None)
    return 0 if usable else 1


def _parser() -> argparse.ArgumentParser:
    from eagerdecomp.ops.opset import PRESETS

    parser = argparse.ArgumentParser(prog="eagerdecomp", description="Which ops must my backend implement?")
    sub = parser.add_subparsers(dest="command", required=True)

    def opset_args(p):
        group = p.add_mutually_exclusive_group()
        group.add_argument("--opset", default="core_aten", choices=list(PRESETS), help="a preset (default core_aten)")
        group.add_argument("--opset-file", metavar="FILE", help="the opset as a file: one op name per line, # comments")
        p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")

    rep = sub.add_parser("coverage", aliases=["report"], help="coverage of every aten overload under an opset")
    opset_args(rep)
    rep.add_argument("--format", default="table", choices=["table", "json", "html"])
    rep.add_argument("--top", type=int, default=10, help="length of the 'implement next' list (default 10)")
    rep.add_argument("--summary", action="store_true", help="counts and 'implement next' only")
    rep.add_argument("--op", metavar="TEXT", help="only the ops whose name contains TEXT, in detail")
    rep.add_argument("--rebuild", action="store_true", help="rebuild the decomposition graph (else cached)")
    rep.add_argument(
        "--verify",
        action="store_true",
        help="check the graph's verdicts by lowering each op for real under the opset (minutes)",
    )
    rep.add_argument(
        "--models",
        action="store_true",
        help="per model of the corpus: runs or blocked, by family, and the ops to add for a share of models",
    )
    rep.add_argument(
        "--corpus",
        metavar="FILE",
        action="append",
        help="a model corpus (default: the one shipped); repeat to add more; "
        "PyTorch's pytorch_model_ops.json format is read too",
    )
    rep.add_argument(
        "--target",
        type=float,
        action="append",
        metavar="PERCENT",
        help="with --models: the smallest (greedy) op set to add to run this share of models (default 50, 80, 90, 100)",
    )
    rep.set_defaults(run=_report)
    actions = rep.add_subparsers(dest="action", metavar="record|graph")
    rec = actions.add_parser("record", help="record the model corpus: the aten ops each model calls (tens of minutes)")
    rec.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="where to write it (default: the shipped eagerdecomp/coverage/data/models.json)",
    )
    rec.add_argument("--only", nargs="+", metavar="TEXT", help="only the models whose name contains one of these")
    rec.add_argument("--limit", type=int, help="only the first N models")
    rec.add_argument("--timeout", type=float, default=120.0, help="seconds per model (default 120)")
    rec.set_defaults(run=_record)
    ship = actions.add_parser(
        "graph",
        help="build the decomposition graph for this torch and write it as the file the package ships (minutes)",
    )
    ship.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="where to write it (default: the shipped eagerdecomp/coverage/data/graph.json.gz)",
    )
    ship.set_defaults(run=_ship_graph)

    prof = sub.add_parser("profile", help="run a script under the mode and report what it hit")
    opset_args(prof)
    prof.add_argument("--format", default="table", choices=["table", "json"])
    prof.add_argument("script")
    prof.add_argument("argv", nargs=argparse.REMAINDER, help="arguments passed to the script")
    prof.set_defaults(run=_profile)

    cache = sub.add_parser("cache", help="kernel bundles: pre-traced kernels a device package ships")
    cache_actions = cache.add_subparsers(dest="action", required=True, metavar="build|info")
    build = cache_actions.add_parser(
        "build",
        help="run representative workloads under the mode and write every kernel they trace into a bundle folder",
    )
    build.add_argument(
        "-o", "--output", metavar="DIR", required=True, help="the bundle's folder (new, empty, or a bundle)"
    )
    group = build.add_mutually_exclusive_group()
    group.add_argument("--opset", default="core_aten", choices=list(PRESETS), help="a preset (default core_aten)")
    group.add_argument("--opset-file", metavar="FILE", help="the opset as a file: one op name per line, # comments")
    build.add_argument(
        "--workloads",
        default="demo,bert,llama",
        help="comma separated, of eagerdecomp.workloads.WORKLOADS (default demo,bert,llama; '' for none)",
    )
    build.add_argument(
        "--corpus",
        metavar="FILE",
        help="also run the models of this corpus (default with --models: the shipped one) that can be built here",
    )
    build.add_argument("--models", nargs="+", metavar="TEXT", help="only the corpus models whose name contains one")
    build.add_argument(
        "--dtypes", type=_dtypes, default="float32", help="floating dtypes to run each workload at (default float32)"
    )
    build.set_defaults(run=_cache_build)
    info = cache_actions.add_parser("info", help="a bundle's manifest, and whether this process can use it")
    info.add_argument("dir", metavar="DIR")
    info.set_defaults(run=_cache_info)
    return parser


def main(argv=None) -> int:
    from eagerdecomp.errors import EagerDecompError

    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except (EagerDecompError, OSError) as e:  # a bad op name or file: say so, no traceback
        print(f"eagerdecomp: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
