"""The coverage page in a real browser (headless Chromium driven by selenium).

The page recomputes coverage in JavaScript; these tests check its figures against the
Python analysis after each click, and that its copy-paste Python builds the ticked opset.
Needs Debian's ``chromium`` and ``chromium-driver`` packages and ``selenium``; skipped
(with the reason) without them. Set EAGERDECOMP_SCREENSHOT=path.png to keep a screenshot.
"""

import os
import re
import shutil

import pytest

import eagerdecomp as ed
import eagerdecomp.coverage as cov
from eagerdecomp.coverage.models import TARGETS, Corpus, analyse_models, load_corpus
from eagerdecomp.coverage.page import render
from eagerdecomp.coverage.record import DATA

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")

BROWSER = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
DRIVER = shutil.which("chromedriver")
_MISSING = "needs headless Chromium and chromedriver: apt-get install -y chromium chromium-driver"
if os.environ.get("EAGERDECOMP_REQUIRE_BROWSER") == "1" and (BROWSER is None or DRIVER is None):
    raise RuntimeError(f"EAGERDECOMP_REQUIRE_BROWSER=1 (as on CI) but the browser test {_MISSING}")
pytestmark = pytest.mark.skipif(BROWSER is None or DRIVER is None, reason=_MISSING)

PACKETS = ["aten::silu", "aten::hardswish", "aten::softplus", "aten::t_", "aten::addcmul"]
OPINFOS = {"nn.functional.silu", "nn.functional.hardswish", "nn.functional.softplus", "addcmul"}
FIGURES = {
    "in opset": "count-in-opset",
    "reaches": "count-reaches",
    "no path": "count-no-path",
    "undetermined": "count-undetermined",
}


@pytest.fixture(scope="module")
def graph():
    return cov.build_graph(PACKETS, OPINFOS, quiet=True)


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = BROWSER
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


def figures(browser) -> dict:
    return {status: int(browser.find_element("id", element).text) for status, element in FIGURES.items()}


def next_list(browser) -> list:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, 20).until(lambda b: "computing" not in b.find_element("id", "next").text)
    return browser.find_elements("css selector", "#next li")


def tick(browser, op: str) -> None:
    """Filter the op list down to ``op`` and click its checkbox, as a person would."""
    search = browser.find_element("id", "search")
    search.clear()
    search.send_keys(op)
    browser.find_element("css selector", f'#op-list input[data-op="{op}"]').click()
    search.clear()
    search.send_keys(" ")  # an input event: the full list is shown again


def python_opset(browser) -> ed.OpSet:
    code = browser.find_element("id", "python").text
    scope: dict = {}
    exec(code.split("\nwith ")[0], scope)  # noqa: S102 - the page's own output, checked here
    return scope["opset"]


def test_page_figures_follow_ticks(graph, browser, tmp_path):
    page = tmp_path / "coverage.html"
    page.write_text(render(graph, "core_aten"))
    browser.get(page.as_uri())

    core = ed.OpSet.preset("core_aten")
    assert figures(browser) == cov.analyse(graph, core).counts()
    assert python_opset(browser) == core

    # untick mul, which silu's decomposition calls: silu loses its path
    opset = core - ed.OpSet(["aten.mul.Tensor"])
    tick(browser, "aten.mul.Tensor")
    expected = cov.analyse(graph, opset)
    assert figures(browser) == expected.counts() != cov.analyse(graph, core).counts()
    assert expected.row("aten.silu.default").status == "no path"
    assert "aten.silu.default" in browser.find_element("id", "unreachable").text
    assert python_opset(browser) == opset

    # the page's first "implement next" pick is Python's, with the same count; tick it there
    picks = expected.implement_next(10)
    items = next_list(browser)
    shown = [re.match(r"(\S+) unlocks (\d+)", li.text).groups() for li in items]
    assert shown == [(op, str(n)) for op, n in picks] and picks
    items[0].find_element("css selector", "button").click()
    opset = opset | ed.OpSet([picks[0][0]])
    assert figures(browser) == cov.analyse(graph, opset).counts()

    # a whole group: all prims; the tables switch to refs, as the runtime's would
    group = next(el for el in browser.find_elements("css selector", "#groups label") if el.text.startswith("prims"))
    group.find_element("tag name", "input").click()
    opset = opset | ed.OpSet([n for n in graph.nodes("aten") if n.startswith("prims.")])  # the prims the page knows
    assert browser.find_element("id", "flavour").text.startswith("refs")
    assert figures(browser) == cov.analyse(graph, opset).counts()
    assert python_opset(browser) == opset

    shot = os.environ.get("EAGERDECOMP_SCREENSHOT") or str(tmp_path / "coverage.png")
    assert browser.save_screenshot(shot)
    assert os.path.getsize(shot) > 10_000

    # back to a preset
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element("id", "preset")).select_by_value("prims")
    assert figures(browser) == cov.analyse(graph, "prims").counts()
    assert python_opset(browser) == ed.OpSet.preset("prims")
    # the prims preset a device team starts from: prims plus the library ops a fusion compiler keeps
    Select(browser.find_element("id", "preset")).select_by_value("prims_fusion")
    assert figures(browser) == cov.analyse(graph, "prims_fusion").counts()
    assert python_opset(browser) == ed.OpSet.preset("prims_fusion") != ed.OpSet.preset("prims")


# a corpus over the ops this graph knows, plus one it does not ("not analysed")
TOY_MODELS = {
    "toy/silu-net": ("a", ["aten.silu.default", "aten.mul.Tensor", "aten.addmm.default"]),
    "toy/hardswish-net": ("a", ["aten.hardswish.default", "aten.hardswish_backward.default"]),
    "toy/softplus-net": ("b", ["aten.softplus.default", "aten.addcmul.default"]),
    "toy/lgamma-net": ("b", ["aten.lgamma.default", "aten.silu.default"]),
    "toy/core-only": ("b", ["aten.mul.Tensor"]),
}


def models_panel(browser) -> dict:
    """What the models panel shows, in the shape of ModelCoverage.to_dict."""
    rows = browser.find_elements("css selector", "#models tr")
    families = {}
    for tr in browser.find_elements("css selector", "#families tr"):
        f, runs, n, _ = (td.text for td in tr.find_elements("tag name", "td"))
        families[f] = {"runs": int(runs), "models": int(n)}
    return {
        "counts": {s: int(browser.find_element("id", f"models-{s}").text) for s in ("runs", "blocked", "undetermined")},
        "families": families,
        "models": {
            tr.get_attribute("data-model"): {
                "status": tr.get_attribute("data-status"),
                "blockers": [b for b in tr.find_elements("tag name", "td")[3].text.split(", ") if b],
            }
            for tr in rows
        },
        "implement_next": [
            re.match(r"(\S+) unlocks (\d+), needed by (\d+)", li.text).groups()
            for li in browser.find_elements("css selector", "#models-next li")
        ],
    }


def expected_panel(m) -> dict:
    d = m.to_dict(10)
    return {
        "counts": d["counts"],
        "families": d["families"],
        "models": {k: {"status": v["status"], "blockers": v["blockers"]} for k, v in d["models"].items()},
        "implement_next": [(r["op"], str(r["unlocks"]), str(r["needed_by"])) for r in d["implement_next"]],
    }


def slider_targets(browser) -> dict:
    out = {}
    for k, pct in enumerate(TARGETS):
        browser.execute_script(
            "const s = document.getElementById('target'); s.value = arguments[0];s.dispatchEvent(new Event('input'));",
            k,
        )
        out[pct] = [
            li.text for li in browser.find_elements("css selector", "#target-ops li") if "already there" not in li.text
        ]
    return out


def test_models_panel_matches_python(graph, browser, tmp_path):
    """Per family, per model (status and blockers), implement next and the slider's op lists
    equal eagerdecomp.coverage.models' answers, on two corpora and after each tick."""
    toy = Corpus("toy", {m: {"family": f, "ops": {o: 1 for o in ops}} for m, (f, ops) in TOY_MODELS.items()}, {})
    corpora = [toy] + ([load_corpus()] if DATA.exists() else [])
    page = tmp_path / "coverage.html"
    page.write_text(render(graph, "core_aten", corpora))
    browser.get(page.as_uri())

    def check(opset, corpus):
        m = analyse_models(cov.analyse(graph, opset), corpus)
        assert models_panel(browser) == expected_panel(m)
        assert slider_targets(browser) == {t: m.ops_for(t) for t in TARGETS}
        return m

    core = ed.OpSet.preset("core_aten")
    m = check(core, toy)
    assert m.status["toy/silu-net"] == "runs" and m.status["toy/lgamma-net"] in ("blocked", "undetermined")
    tick(browser, "aten.mul.Tensor")  # unticked: silu loses its path, and the models that call it
    opset = core - ed.OpSet(["aten.mul.Tensor"])
    m = check(opset, toy)
    assert m.status["toy/silu-net"] == "blocked" and "aten.mul.Tensor" in m.blockers["toy/silu-net"]
    if len(corpora) > 1:  # the shipped corpus: the same answers over hundreds of models
        from selenium.webdriver.support.ui import Select

        Select(browser.find_element("id", "corpus")).select_by_index(1)
        check(opset, corpora[1])
