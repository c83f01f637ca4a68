"""The coverage page: one self-contained HTML file (inline CSS and JavaScript, data as JSON).

A person picks a preset, ticks and unticks ops or whole groups, and sees at
once the coverage figures, the ops with no path (and what blocks them), what
to implement next, and the Python that builds that opset. No server, no
network: the page carries the one-level graphs of :mod:`eagerdecomp.coverage`
and recomputes reachability in the browser with the same least-fixpoint
algorithm as :class:`~eagerdecomp.coverage.Coverage` (a browser test checks
they agree).

Example::

    >>> import eagerdecomp.coverage as cov, eagerdecomp.coverage.page as page
    >>> html = page.render(cov.load_graph(), "core_aten")     # doctest: +SKIP
    >>> open("coverage.html", "w").write(html)                # doctest: +SKIP
"""

from __future__ import annotations

import datetime
import json

import torch

from eagerdecomp.coverage.graph import NODE_KINDS, Graph, _resolve
from eagerdecomp.coverage.models import TARGETS, passes_through
from eagerdecomp.ops.opset import PRESETS, RUNTIME_EXTRAS, OpSet

__all__ = ["render", "page_data", "GROUPS"]


def _tagged(tag):
    return lambda op: tag in op.tags


def _writes(op) -> bool:
    return any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments)


# Groups a person can tick or untick at once: (label, predicate on an OpOverload).
GROUPS = [
    ("core ATen (torch.Tag.core)", _tagged(torch.Tag.core)),
    ("prims", lambda op: op.namespace == "prims"),
    ("runtime extras (copy_, as_strided_, set_)", lambda op: op in RUNTIME_EXTRAS),
    ("pointwise (torch.Tag.pointwise)", _tagged(torch.Tag.pointwise)),
    ("reductions (torch.Tag.reduction)", _tagged(torch.Tag.reduction)),
    ("random (nondeterministic_seeded)", _tagged(torch.Tag.nondeterministic_seeded)),
    ("out= overloads", _tagged(torch.Tag.out)),
    ("in-place overloads", lambda op: _writes(op) and torch.Tag.out not in op.tags),
    ("backward ops", lambda op: "backward" in op._schema.name),
    ("views", lambda op: any(r.alias_info is not None and not r.alias_info.is_write for r in op._schema.returns)),
]


def _corpus_data(corpus, index: dict) -> dict:
    """One corpus for the page: per model its family and op indices; ops the graph lacks are
    listed apart (``extra``, indices from ``len(index)`` on): never reached, "not analysed"."""
    extra: dict = {}
    models = []
    for name_, m in sorted(corpus.models.items()):
        ops = sorted(op for op in m["ops"] if not passes_through(op))
        ids = [index[op] if op in index else len(index) + extra.setdefault(op, len(extra)) for op in ops]
        models.append([name_, m["family"], ids])
    return {"name": corpus.name, "meta": corpus.meta, "extra": list(extra), "models": models}


def page_data(graph: Graph, opset="core_aten", corpora=None) -> dict:
    """The JSON the page embeds: op names, both flavours' graphs by index, presets, groups,
    and the model corpora (default: the shipped one, when present)."""
    if corpora is None:
        from eagerdecomp.coverage.models import load_corpus
        from eagerdecomp.coverage.record import DATA

        corpora = [load_corpus()] if DATA.exists() else []
    in_graph = set(graph.flavours["aten"]) | set(graph.flavours["prims"])
    # NOTE: a corpus op the graph lacks still gets a row (never analysed: it runs only when
    # ticked), so an opset holding it counts it as Python's analysis does
    called = {op for c in corpora for m in c.models.values() for op in m["ops"] if not passes_through(op)}
    names = sorted(in_graph | {op for op in called - in_graph if _resolve(op) is not None})
    index = {n: i for i, n in enumerate(names)}
    kinds = {k: i for i, k in enumerate(NODE_KINDS)}
    graphs = {}
    for flavour, nodes in graph.flavours.items():
        missing = {"kind": "undetermined", "children": [], "reason": "not analysed", "via": ""}
        entries = [nodes.get(n, missing) for n in names]
        graphs[flavour] = {
            "kind": [kinds[e["kind"]] for e in entries],
            "children": [[index[c] for c in e["children"] if c in index] for e in entries],
            "reason": [e["reason"] for e in entries],
            "via": [e["via"] for e in entries],
        }
    ops = {n: _resolve(n) for n in names}
    groups = []
    for label, pred in GROUPS:
        members = [index[n] for n, op in ops.items() if op is not None and pred(op)]
        groups.append({"name": label, "ops": members})
    presets = {p: [index[n] for n in (str(op) for op in OpSet.preset(p).ops) if n in index] for p in PRESETS}
    start = OpSet.coerce(opset)
    return {
        "corpora": [_corpus_data(c, index) for c in corpora],
        "targets": list(TARGETS),
        "torch": torch.__version__,
        "generated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "names": names,
        "aten": [i for i, n in enumerate(names) if n.startswith("aten.") and n in in_graph],
        "kinds": list(NODE_KINDS),
        "graphs": graphs,
        "presets": presets,
        "groups": groups,
        "initial": {
            "preset": start.name if start.name in PRESETS else "",
            "ops": [index[str(op)] for op in start.ops if str(op) in index],
        },
    }


def render(graph: Graph, opset="core_aten", corpora=None) -> str:
    """The page as one HTML string, starting from ``opset`` (a preset name, an OpSet or ops);
    ``corpora``: :class:`~eagerdecomp.coverage.models.Corpus` objects for the models panel."""
    data = json.dumps(page_data(graph, opset, corpora), separators=(",", ":"))
    # NOTE: "</" inside a <script> would end it early; JSON allows "<\/" for it
    options = "".join(f'<option value="{p}">{p}</option>' for p in PRESETS)
    return _TEMPLATE.replace("/*PRESETS*/", options).replace("/*DATA*/", data.replace("</", "<\\/"))


_TEMPLATE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>eagerdecomp coverage: which ops must my backend implement?</title>
<style>
  :root { --ok:#1a7f37; --in:#0969da; --no:#cf222e; --und:#9a6700; --bg:#f6f8fa; --line:#d0d7de; }
  * { box-sizing: border-box; }
  body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1f2328; }
  header { padding: 14px 20px; border-bottom: 1px solid var(--line); background: var(--bg); }
  header h1 { font-size: 18px; margin: 0 0 4px; }
  header .sub { color: #59636e; font-size: 12px; }
  main { display: grid; grid-template-columns: 380px 1fr; gap: 0; height: calc(100vh - 64px); }
  aside { border-right: 1px solid var(--line); display: flex; flex-direction: column; min-height: 0; }
  section.panel { padding: 12px 16px; border-bottom: 1px solid var(--line); }
  h2 { font-size: 13px; text-transform: uppercase; letter-spacing: .04em; color: #59636e; margin: 0 0 8px; }
  select, input[type=search], button { font: inherit; padding: 4px 8px; border: 1px solid var(--line); border-radius: 6px; background: #fff; }
  button { cursor: pointer; } button:hover { background: var(--bg); }
  #groups label { display: flex; gap: 6px; align-items: center; padding: 1px 0; }
  #groups .n { margin-left: auto; color: #59636e; font-variant-numeric: tabular-nums; font-size: 12px; }
  #picker { flex: 1; min-height: 0; display: flex; flex-direction: column; }
  #picker .tools { display: flex; gap: 6px; flex-wrap: wrap; margin-bottom: 6px; }
  #picker input[type=search] { width: 100%; margin-bottom: 6px; }
  #op-list { flex: 1; overflow: auto; border: 1px solid var(--line); border-radius: 6px; font: 12px/1.6 ui-monospace, SFMono-Regular, Menlo, monospace; }
  #op-list label { display: flex; gap: 6px; align-items: center; padding: 0 6px; white-space: nowrap; }
  #op-list label:nth-child(odd) { background: #fbfbfc; }
  .dot { width: 8px; height: 8px; border-radius: 50%; flex: none; }
  .s-in .dot, .dot.s-in { background: var(--in); } .s-reaches .dot, .dot.s-reaches { background: var(--ok); }
  .s-nopath .dot, .dot.s-nopath { background: var(--no); } .s-und .dot, .dot.s-und { background: var(--und); }
  .s-other .dot { background: #afb8c1; }
  .content { overflow: auto; padding: 0 20px 40px; }
  .figures { display: grid; grid-template-columns: repeat(5, 1fr); gap: 10px; margin: 16px 0; }
  .fig { border: 1px solid var(--line); border-radius: 8px; padding: 10px 12px; }
  .fig .v { font-size: 26px; font-weight: 600; font-variant-numeric: tabular-nums; }
  .fig .l { color: #59636e; font-size: 12px; display: flex; gap: 6px; align-items: center; }
  .bar { height: 10px; border-radius: 5px; overflow: hidden; display: flex; background: #eaeef2; margin: 6px 0 2px; }
  .bar div { height: 100%; }
  .cols { display: grid; grid-template-columns: 1fr 1fr; gap: 20px; }
  table { border-collapse: collapse; width: 100%; font-size: 12px; table-layout: fixed; }
  col.c-op { width: 26%; } col.c-st { width: 10%; } col.c-by { width: 30%; } col.c-why { width: 34%; }
  td { overflow-wrap: anywhere; }
  th, td { text-align: left; padding: 3px 6px; border-bottom: 1px solid #eaeef2; vertical-align: top; }
  td.op, td.mono { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; }
  ol#next { padding-left: 22px; margin: 0; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; }
  ol#next li { padding: 2px 0; } ol#next button { font-size: 11px; padding: 0 6px; margin-left: 6px; }
  pre#python { background: var(--bg); border: 1px solid var(--line); border-radius: 6px; padding: 10px; font-size: 12px; max-height: 260px; overflow: auto; white-space: pre; }
  .muted { color: #59636e; } .flav { font-weight: 600; }
  .scroll { max-height: 420px; overflow: auto; }
</style>
</head>
<body>
<header>
  <h1>Which ops must my backend implement?</h1>
  <div class="sub">eagerdecomp coverage &middot; torch <span id="torch"></span> &middot; generated <span id="generated"></span> &middot;
    every aten overload, decomposed with PyTorch's tables on sample inputs. Tick the ops your backend runs.</div>
</header>
<main>
<aside>
  <section class="panel">
    <h2>Start from</h2>
    <select id="preset">/*PRESETS*/<option value="">nothing</option></select>
    <span class="muted" style="margin-left:8px">tables: <span id="flavour" class="flav"></span></span>
  </section>
  <section class="panel">
    <h2>Groups</h2>
    <div id="groups"></div>
  </section>
  <section class="panel" id="picker">
    <h2>Ops (<span id="ticked-n"></span> ticked)</h2>
    <input type="search" id="search" placeholder="filter, e.g. gelu or aten.add">
    <div class="tools">
      <select id="show"><option value="all">all ops</option><option value="ticked">ticked</option><option value="unticked">not ticked</option><option value="nopath">no path</option><option value="und">undetermined</option></select>
      <button id="tick-shown">tick shown</button><button id="untick-shown">untick shown</button>
    </div>
    <div id="op-list"></div>
  </section>
</aside>
<div class="content">
  <div class="figures">
    <div class="fig"><div class="l">aten overloads</div><div class="v" id="count-total"></div></div>
    <div class="fig"><div class="l"><span class="dot s-in"></span>in the opset</div><div class="v" id="count-in-opset"></div></div>
    <div class="fig"><div class="l"><span class="dot s-reaches"></span>reach it by decomposition</div><div class="v" id="count-reaches"></div></div>
    <div class="fig"><div class="l"><span class="dot s-nopath"></span>no path</div><div class="v" id="count-no-path"></div></div>
    <div class="fig"><div class="l"><span class="dot s-und"></span>undetermined</div><div class="v" id="count-undetermined"></div></div>
  </div>
  <div class="bar" id="bar"></div>
  <div class="muted">Coverage: <b id="coverage-pct"></b> of aten overloads run on this opset (in it, or by decomposition).</div>
  <div class="cols">
    <div>
      <h2 style="margin-top:18px">Implement next</h2>
      <div class="muted" style="margin-bottom:6px">Greedy: each op unlocks the most ops still without a path, assuming the ones above it are done.</div>
      <ol id="next"></ol>
    </div>
    <div>
      <h2 style="margin-top:18px">This opset in Python</h2>
      <button id="copy">copy</button> <span id="copied" class="muted"></span>
      <pre id="python"></pre>
    </div>
  </div>
  <h2 style="margin-top:18px">Ops without a path (<span id="unreachable-n"></span>)</h2>
  <div class="scroll"><table><colgroup><col class="c-op"><col class="c-st"><col class="c-by"><col class="c-why"></colgroup><thead><tr><th>op</th><th>status</th><th>blocked by</th><th>why</th></tr></thead><tbody id="unreachable"></tbody></table></div>
  <section id="models-panel">
  <h2 style="margin-top:18px">Models</h2>
  <div class="muted">Corpus <select id="corpus"></select> <span id="corpus-meta"></span>. A model runs when every aten op it calls
    runs on this opset; its blockers are the ops with no way down that it needs.</div>
  <div class="figures" style="grid-template-columns: repeat(4, 1fr)">
    <div class="fig"><div class="l">models</div><div class="v" id="models-total"></div></div>
    <div class="fig"><div class="l"><span class="dot s-reaches"></span>run</div><div class="v" id="models-runs"></div></div>
    <div class="fig"><div class="l"><span class="dot s-nopath"></span>blocked</div><div class="v" id="models-blocked"></div></div>
    <div class="fig"><div class="l"><span class="dot s-und"></span>undetermined</div><div class="v" id="models-undetermined"></div></div>
  </div>
  <div class="muted">Coverage: <b id="models-pct"></b> of the corpus's models run on this opset.</div>
  <div class="cols">
    <div>
      <h2 style="margin-top:18px">Per family</h2>
      <table><thead><tr><th>family</th><th>run</th><th>models</th><th>share</th></tr></thead><tbody id="families"></tbody></table>
    </div>
    <div>
      <h2 style="margin-top:18px">Ops to add for <span id="target-pct"></span> of models</h2>
      <input type="range" id="target" min="0" max="0" step="1" value="0" style="width:240px"> <span id="target-label" class="muted"></span>
      <div class="muted">Greedy, not proven minimal: each step adds one blocked model's missing blockers, the set that completes the most models per op.
        <button id="tick-target">tick them</button></div>
      <ol id="target-ops" class="mono" style="font-size:12px"></ol>
      <h2 style="margin-top:18px">Implement next, by models</h2>
      <ol id="models-next" class="mono" style="font-size:12px"></ol>
    </div>
  </div>
  <h2 style="margin-top:18px">Each model</h2>
  <input type="search" id="model-search" placeholder="filter models, e.g. llama or vision" style="width:360px">
  <div class="scroll"><table><colgroup><col style="width:34%"><col style="width:16%"><col style="width:12%"><col style="width:38%"></colgroup>
    <thead><tr><th>model</th><th>family</th><th>status</th><th>blocked by</th></tr></thead><tbody id="models"></tbody></table></div>
  </section>
  <h2 style="margin-top:18px">Look up an op</h2>
  <input type="search" id="lookup" placeholder="e.g. aten.gelu.default" style="width:360px"> <div id="lookup-out" class="mono" style="margin-top:6px"></div>
</div>
</main>
<script id="data" type="application/json">/*DATA*/</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const N = D.names.length, K = {}; D.kinds.forEach((k, i) => K[k] = i);
const idx = new Map(D.names.map((n, i) => [n, i]));
const isPrims = D.names.map(n => n.startsWith("prims."));
const isAten = new Uint8Array(N); D.aten.forEach(i => isAten[i] = 1);
let ticked = new Uint8Array(N), base = "core_aten";
const $ = id => document.getElementById(id);
const esc = s => String(s).replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));

// parents per flavour, computed once
for (const g of Object.values(D.graphs)) {
  g.parents = Array.from({length: N}, () => []);
  g.children.forEach((cs, p) => { if (g.kind[p] === K["decomposes"]) cs.forEach(c => g.parents[c].push(p)); });
}

function flavour() { for (let i = 0; i < N; i++) if (ticked[i] && isPrims[i]) return "prims"; return "aten"; }

// Least fixpoint, as eagerdecomp.coverage._reach: depth[i] >= 0 when op i reaches the opset.
function reach(g) {
  const depth = new Int32Array(N).fill(-1), missing = new Int32Array(N), queue = [];
  for (let i = 0; i < N; i++) {
    if (ticked[i] || g.kind[i] === K["infrastructure"]) { depth[i] = 0; queue.push(i); }
    else if (g.kind[i] === K["decomposes"]) {
      missing[i] = g.children[i].length;
      if (missing[i] === 0) { depth[i] = 1; queue.push(i); }
    }
  }
  for (let q = 0; q < queue.length; q++) {
    for (const p of g.parents[queue[q]]) {
      if (depth[p] >= 0) continue;
      if (--missing[p] === 0) {
        let d = 0; for (const c of g.children[p]) d = Math.max(d, depth[c]);
        depth[p] = d + 1; queue.push(p);
      }
    }
  }
  return depth;
}

// As Coverage._blocker: follow the first unreachable child until an op stops.
function blocker(g, depth, i) {
  const chain = [i], seen = new Set([i]);
  for (;;) {
    const j = chain[chain.length - 1], k = g.kind[j];
    if (k !== K["decomposes"]) {
      return {chain, reason: g.reason[j] || D.kinds[k], definite: k === K["no decomposition"] || k === K["declined"]};
    }
    const stuck = g.children[j].filter(c => depth[c] < 0);
    const nxt = stuck.find(c => !seen.has(c));
    if (nxt === undefined) return {chain: chain.concat([stuck[0]]), reason: "decomposition cycle", definite: true};
    chain.push(nxt); seen.add(nxt);
  }
}

function unlockedBy(g, reached, c) {
  const out = new Set([c]), queue = [c], missing = new Map();
  for (let q = 0; q < queue.length; q++) {
    for (const p of g.parents[queue[q]]) {
      if (reached[p] || out.has(p)) continue;
      let left = missing.has(p) ? missing.get(p) : g.children[p].filter(x => !reached[x]).length;
      left -= 1; missing.set(p, left);
      if (left === 0) { out.add(p); queue.push(p); }
    }
  }
  return out;
}

function implementNext(g, depth, k, fl) {
  const reached = new Uint8Array(N); for (let i = 0; i < N; i++) reached[i] = depth[i] >= 0 ? 1 : 0;
  const picks = [];
  for (let r = 0; r < k; r++) {
    let best = -1, bestGain = 0;
    for (let c = 0; c < N; c++) {  // in name order, like the Python ranking: ties go to the first
      if (reached[c] || (fl === "aten" && isPrims[c])) continue;  // a prims op would switch the tables
      let gain = 0; for (const o of unlockedBy(g, reached, c)) gain += isAten[o];
      if (gain > bestGain) { best = c; bestGain = gain; }
    }
    if (best < 0) break;
    picks.push([best, bestGain]);
    for (const o of unlockedBy(g, reached, best)) reached[o] = 1;
  }
  return picks;
}

// --- models, as eagerdecomp.coverage.models.ModelCoverage ---------------------------------
// A model runs when all its ops run; its blockers: a depth-first walk down unreachable
// decompositions from each op, collecting ops without one and, on a cycle, the op closing it.
function opBlockers(g, depth, i, memo) {
  if (memo.has(i)) return memo.get(i);
  const out = new Set(), runs = j => j < N && depth[j] >= 0, dec = j => j < N && g.kind[j] === K["decomposes"];
  if (!runs(i)) {
    if (!dec(i)) out.add(i);
    else {
      const visited = new Set([i]), onPath = new Set([i]), stack = [[i, 0]];
      while (stack.length) {
        const top = stack[stack.length - 1], kids = g.children[top[0]];
        if (top[1] >= kids.length) { stack.pop(); onPath.delete(top[0]); continue; }
        const c = kids[top[1]++];
        if (runs(c)) continue;
        if (onPath.has(c)) { out.add(c); continue; }
        if (visited.has(c)) continue;
        visited.add(c);
        if (dec(c)) { onPath.add(c); stack.push([c, 0]); } else out.add(c);
      }
    }
  }
  memo.set(i, out);
  return out;
}

function opName(corpus, i) { return i < N ? D.names[i] : corpus.extra[i - N]; }
function blockerKind(g, i) { return i >= N ? "not analysed" : g.kind[i] === K["decomposes"] ? "cycle" : D.kinds[g.kind[i]]; }

function analyseModels(g, depth, corpus) {
  const memo = new Map(), models = [];
  for (const [name, family, ops] of corpus.models) {
    const b = new Set();
    for (const i of ops) for (const j of opBlockers(g, depth, i, memo)) b.add(j);
    const names = [...b].map(j => opName(corpus, j)).sort();
    let status = "runs";
    if (b.size) status = [...b].some(j => ["no decomposition", "declined", "cycle"].includes(blockerKind(g, j))) ? "blocked" : "undetermined";
    models.push({name, family, status, blockers: names});
  }
  return models;
}

function cmpList(a, b) {
  for (let k = 0; k < Math.min(a.length, b.length); k++) if (a[k] !== b[k]) return a[k] < b[k] ? -1 : 1;
  return a.length - b.length;
}

// As ModelCoverage.ops_for: greedy, one blocked model's missing blockers at a time.
function opsFor(models, percent) {
  const need = Math.ceil(models.length * percent / 100), groups = new Map();
  let covered = 0;
  for (const m of models) {
    if (!m.blockers.length) { covered++; continue; }
    const key = m.blockers.join("\n");
    if (!groups.has(key)) groups.set(key, {req: m.blockers, n: 0});
    groups.get(key).n++;
  }
  const have = new Set(), picked = [];
  while (covered < need && groups.size) {
    let best = null;
    for (const {req} of groups.values()) {
      const add = req.filter(o => !have.has(o)), union = new Set([...have, ...add]);
      let done = 0; for (const gr of groups.values()) if (gr.req.every(o => union.has(o))) done += gr.n;
      const key = [-done / add.length, add.length, add];
      if (best === null || key[0] < best[0] || (key[0] === best[0] && (key[1] < best[1] || (key[1] === best[1] && cmpList(key[2], best[2]) < 0)))) best = key;
    }
    for (const o of best[2]) { have.add(o); picked.push(o); }
    for (const [k, gr] of [...groups]) if (gr.req.every(o => have.has(o))) { covered += gr.n; groups.delete(k); }
  }
  return picked;
}

function modelsNext(models, k) {
  const alone = new Map(), needed = new Map();
  for (const m of models) {
    for (const o of m.blockers) needed.set(o, (needed.get(o) || 0) + 1);
    if (m.blockers.length === 1) alone.set(m.blockers[0], (alone.get(m.blockers[0]) || 0) + 1);
  }
  return [...needed.keys()].map(o => [o, alone.get(o) || 0, needed.get(o)])
    .sort((a, b) => b[1] - a[1] || b[2] - a[2] || (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0)).slice(0, k);
}

function renderModels() {
  const panel = $("models-panel");
  if (!D.corpora.length) { panel.style.display = "none"; return; }
  const corpus = D.corpora[+$("corpus").value], models = analyseModels(state.g, state.depth, corpus);
  const c = {runs: 0, blocked: 0, undetermined: 0}, fam = new Map();
  for (const m of models) {
    c[m.status]++;
    if (!fam.has(m.family)) fam.set(m.family, [0, 0]);
    const f = fam.get(m.family); f[1]++; if (m.status === "runs") f[0]++;
  }
  state.models = models;
  $("models-total").textContent = models.length; $("models-runs").textContent = c.runs;
  $("models-blocked").textContent = c.blocked; $("models-undetermined").textContent = c.undetermined;
  $("models-pct").textContent = (100 * c.runs / Math.max(1, models.length)).toFixed(1) + "%";
  $("families").innerHTML = [...fam.keys()].sort().map(f => { const [r, n] = fam.get(f);
    return '<tr data-family="' + esc(f) + '"><td>' + esc(f) + "</td><td>" + r + "</td><td>" + n + "</td><td>" + (100 * r / n).toFixed(1) + "%</td></tr>"; }).join("");
  const pct = D.targets[+$("target").value], ops = opsFor(models, pct);
  state.targetOps = ops;
  $("target-pct").textContent = pct + "%"; $("target-label").textContent = pct + "%: " + ops.length + " ops";
  $("target-ops").innerHTML = ops.length ? ops.map(o => "<li>" + esc(o) + "</li>").join("") : "<li class='muted'>none: already there</li>";
  $("models-next").innerHTML = modelsNext(models, 10).map(([o, a, n]) => "<li>" + esc(o) + " <span class='muted'>unlocks " + a + ", needed by " + n + "</span></li>").join("");
  filterModels();
}

function filterModels() {
  const q = $("model-search").value.trim().toLowerCase();
  const rows = (state.models || []).filter(m => !q || m.name.toLowerCase().includes(q) || m.family.toLowerCase().includes(q));
  $("models").innerHTML = rows.map(m => '<tr data-model="' + esc(m.name) + '" data-status="' + m.status + '"><td class="mono">' + esc(m.name) + "</td><td>" + esc(m.family) +
    "</td><td>" + m.status + '</td><td class="mono">' + m.blockers.map(esc).join(", ") + "</td></tr>").join("");
}

let state = null;
function compute() {
  const fl = flavour(), g = D.graphs[fl], depth = reach(g);
  const status = new Array(N), rows = [];
  const counts = {"in": 0, "reaches": 0, "nopath": 0, "und": 0};
  for (let i = 0; i < N; i++) {
    let s;
    if (ticked[i]) s = "in";
    else if (depth[i] >= 0) s = "reaches";
    else { const b = blocker(g, depth, i); s = b.definite ? "nopath" : "und"; if (isAten[i]) rows.push([i, s, b]); }
    status[i] = s;
    if (isAten[i]) counts[s]++;
  }
  state = {fl, g, depth, status, rows, counts};
  render();
}

function python() {
  const inBase = new Uint8Array(N); if (base) D.presets[base].forEach(i => inBase[i] = 1);
  const add = [], drop = [];
  for (let i = 0; i < N; i++) { if (ticked[i] && !inBase[i]) add.push(D.names[i]); if (!ticked[i] && inBase[i]) drop.push(D.names[i]); }
  const list = xs => "[\n" + xs.map(x => '    "' + x + '",').join("\n") + "\n]";
  let expr = base ? 'ed.OpSet.preset("' + base + '")' : "ed.OpSet([])";
  if (add.length) expr += " | ed.OpSet(" + list(add) + ")";
  if (drop.length) expr += " - ed.OpSet(" + list(drop) + ")";
  return "import eagerdecomp as ed\n\nopset = " + expr + "\n\nwith ed.EagerDecompMode(opset):\n    ...  # your model";
}

let listBuilt = false;
function buildList() {
  const parts = [];
  for (let i = 0; i < N; i++) parts.push('<label data-i="' + i + '"><input type="checkbox" data-op="' + esc(D.names[i]) + '"><span class="dot"></span>' + esc(D.names[i]) + "</label>");
  $("op-list").innerHTML = parts.join("");
  listBuilt = true;
}

function filterList() {
  const q = $("search").value.trim().toLowerCase(), show = $("show").value;
  for (const el of $("op-list").children) {
    const i = +el.dataset.i, s = state.status[i];
    let vis = !q || D.names[i].toLowerCase().includes(q);
    if (show === "ticked") vis = vis && ticked[i]; else if (show === "unticked") vis = vis && !ticked[i];
    else if (show === "nopath") vis = vis && s === "nopath"; else if (show === "und") vis = vis && s === "und";
    el.style.display = vis ? "" : "none";
  }
}

function render() {
  const {fl, status, rows, counts} = state, total = D.aten.length;
  if (!listBuilt) buildList();
  for (const el of $("op-list").children) {
    const i = +el.dataset.i;
    el.className = "s-" + (isAten[i] || ticked[i] || status[i] === "reaches" ? status[i] : (status[i] === "in" ? "in" : "other"));
    el.firstChild.checked = !!ticked[i];
  }
  filterList();
  $("flavour").textContent = fl === "prims" ? "refs (opset has prims)" : "aten";
  $("ticked-n").textContent = ticked.reduce((a, b) => a + b, 0);
  $("count-total").textContent = total;
  $("count-in-opset").textContent = counts.in; $("count-reaches").textContent = counts.reaches;
  $("count-no-path").textContent = counts.nopath; $("count-undetermined").textContent = counts.und;
  $("coverage-pct").textContent = (100 * (counts.in + counts.reaches) / total).toFixed(1) + "%";
  $("bar").innerHTML = [["in", "var(--in)"], ["reaches", "var(--ok)"], ["nopath", "var(--no)"], ["und", "var(--und)"]]
    .map(([k, c]) => '<div style="width:' + (100 * counts[k] / total) + '%;background:' + c + '" title="' + k + '"></div>').join("");
  for (const inp of $("groups").querySelectorAll("input")) {
    const ops = D.groups[+inp.dataset.g].ops, n = ops.reduce((a, i) => a + ticked[i], 0);
    inp.checked = n === ops.length && n > 0; inp.indeterminate = n > 0 && n < ops.length;
    inp.parentNode.querySelector(".n").textContent = n + "/" + ops.length;
  }
  $("unreachable-n").textContent = rows.length;
  $("unreachable").innerHTML = rows.map(([i, s, b]) =>
    '<tr><td class="op">' + esc(D.names[i]) + "</td><td>" + (s === "nopath" ? "no path" : "undetermined") +
    '</td><td class="mono">' + (b.chain.length > 1 ? b.chain.slice(1).map(j => esc(D.names[j])).join(" &rarr; ") : "itself") +
    "</td><td>" + esc(b.reason) + "</td></tr>").join("");
  $("python").textContent = python();
  renderModels();
  $("next").innerHTML = "<li class='muted'>computing&hellip;</li>";
  clearTimeout(render.t);
  render.t = setTimeout(() => {
    const picks = implementNext(state.g, state.depth, 10, state.fl);
    $("next").innerHTML = picks.length ? picks.map(([i, n]) => "<li>" + esc(D.names[i]) + " <span class='muted'>unlocks " + n +
      "</span><button data-add='" + i + "'>tick</button></li>").join("") : "<li class='muted'>nothing left to unlock</li>";
  }, 0);
  lookup();
}

function lookup() {
  const q = $("lookup").value.trim(), i = idx.get(q), out = $("lookup-out");
  if (i === undefined) { out.textContent = q ? "no such op in the graph" : ""; return; }
  const {g, depth, status} = state, kids = g.children[i].map(c => D.names[c]).join(", ");
  out.innerHTML = "<b>" + esc(q) + "</b>: " + esc({"in": "in the opset", "reaches": "reaches the opset, depth " + depth[i], "nopath": "no path", "und": "undetermined", "other": ""}[status[i]]) +
    "<br>decomposition: " + esc(g.via[i] || D.kinds[g.kind[i]]) + (kids ? "<br>calls directly: " + esc(kids) : "") +
    (g.reason[i] ? "<br>note: " + esc(g.reason[i]) : "");
}

function setPreset(p) {
  base = p; ticked = new Uint8Array(N);
  if (p) D.presets[p].forEach(i => ticked[i] = 1);
  compute();
}

$("groups").innerHTML = D.groups.map((gr, k) => '<label><input type="checkbox" data-g="' + k + '">' + esc(gr.name) + '<span class="n"></span></label>').join("");
$("groups").addEventListener("change", e => {
  const ops = D.groups[+e.target.dataset.g].ops, on = e.target.checked;
  ops.forEach(i => ticked[i] = on ? 1 : 0); compute();
});
$("op-list").addEventListener("change", e => { const i = idx.get(e.target.dataset.op); ticked[i] = e.target.checked ? 1 : 0; compute(); });
$("preset").addEventListener("change", e => setPreset(e.target.value));
$("search").addEventListener("input", filterList);
$("show").addEventListener("change", filterList);
$("lookup").addEventListener("input", lookup);
$("next").addEventListener("click", e => { const i = e.target.dataset.add; if (i !== undefined) { ticked[+i] = 1; compute(); } });
function tickShown(on) { for (const el of $("op-list").children) if (el.style.display !== "none") ticked[+el.dataset.i] = on; compute(); }
$("tick-shown").addEventListener("click", () => tickShown(1));
$("untick-shown").addEventListener("click", () => tickShown(0));
$("copy").addEventListener("click", () => {
  const text = $("python").textContent;
  (navigator.clipboard ? navigator.clipboard.writeText(text) : Promise.reject()).then(
    () => $("copied").textContent = "copied", () => $("copied").textContent = "select the text and copy it");
});
$("corpus").innerHTML = D.corpora.map((c, k) => '<option value="' + k + '">' + esc(c.name) + "</option>").join("");
$("corpus").addEventListener("change", () => { updateCorpusMeta(); renderModels(); });
function updateCorpusMeta() {
  const c = D.corpora[+$("corpus").value]; if (!c) return;
  const m = c.meta, v = m.versions ? Object.entries(m.versions).map(([k, x]) => k + " " + x).join(", ") : "";
  $("corpus-meta").textContent = "(" + c.models.length + " models" + (m.recorded ? ", recorded " + m.recorded : "") + (v ? ", " + v : "") + (m.source ? ", " + m.source : "") + ")";
}
updateCorpusMeta();
$("target").max = D.targets.length - 1; $("target").value = D.targets.indexOf(90) >= 0 ? D.targets.indexOf(90) : 0;
$("target").addEventListener("input", renderModels);
$("model-search").addEventListener("input", filterModels);
$("tick-target").addEventListener("click", () => { for (const o of state.targetOps || []) if (idx.has(o)) ticked[idx.get(o)] = 1; compute(); });
$("torch").textContent = D.torch; $("generated").textContent = D.generated;
$("preset").value = D.initial.preset;
base = D.initial.preset; D.initial.ops.forEach(i => ticked[i] = 1);
compute();
</script>
</body>
</html>
"""
