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
from eagerdecomp.coverage.page import render

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")

BROWSER = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
DRIVER = shutil.which("chromedriver")
_MISSING = "needs headless Chromium and chromedriver: apt-get install -y chromium chromium-driver"
if os.environ.get("EAGERDECOMP_REQUIRE_BROWSER") == "1" and (BROWSER is None or DRIVER is None):
    raise RuntimeError(f"EAGERDECOMP_REQUIRE_BROWSER=1 (as on CI) but the browser test {_MISSING}")
pytestmark = pytest.mark.skipif(BROWSER is None or DRIVER is None, reason=_MISSING)

PACKETS = ["aten::silu", "aten::hardswish", "aten::softplus", "aten::t_", "aten::addcmul"]
OPINFOS = {"nn.functional.silu", "nn.functional.hardswish", "nn.functional.softplus", "addcmul"}
FIGURES = {"in opset": "count-in-opset", "reaches": "count-reaches", "no path": "count-no-path", "undetermined": "count-undetermined"}


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
