"""The built book in a real browser: headless Chromium (Debian's) driven by Playwright.

The pages are served from localhost. Every page must load without errors from the
book's own scripts and without reaching the network; every image must have a size;
every control of every static twin must change what is drawn; and every Colab launch
link must name, on the branch of executed notebooks, a chapter that exists in this repository.
"""

from __future__ import annotations

import re
from urllib.parse import urlparse

import pytest

from conftest import CHROMIUM, CHROMIUM_ARGS, ROOT, require_chromium, serve_folder, toc_files

# The built book (the html fixture) in a browser: out of the quick loop.
pytestmark = pytest.mark.slow

playwright_api = pytest.importorskip("playwright.sync_api")

@pytest.fixture(scope="module")
def server(html):
    require_chromium()
    with serve_folder(html) as url:
        yield url


@pytest.fixture(scope="module")
def browser(server):
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


# Messages from the theme's own machinery, not from the book's scripts: sphinx-thebe (via
# Jupyter Book) declares its configuration constant twice, pydata-sphinx-theme logs a notice
# as an error when no colour mode is stored, and the browser asks for a favicon we do not ship.
THIRD_PARTY_NOISE = ("Identifier 'THEBE_JS_URL' has already been declared", "Got invalid theme mode")


def _ours(message: str, url: str = "") -> bool:
    return not any(noise in message for noise in THIRD_PARTY_NOISE) and not url.endswith("/favicon.ico")


def open_page(browser, url, problems):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    base = urlparse(url)
    page.on("pageerror", lambda error: _ours(str(error)) and problems.append(f"script error: {error}"))
    page.on("console", lambda msg: msg.type == "error" and _ours(msg.text, msg.location.get("url", ""))
            and problems.append(f"console: {msg.text} ({msg.location.get('url')})"))

    def outside(request):
        target = urlparse(request.url)
        if target.scheme not in ("data", "blob", "about") and target.netloc != base.netloc:
            problems.append(f"network request to {request.url}")

    page.on("request", outside)
    page.goto(url, wait_until="load")
    page.wait_for_timeout(300)
    return page


@pytest.fixture(scope="module")
def loaded(server, browser):
    """Every page of the book, opened once: what went wrong while it loaded, its images' sizes, its
    number of top headings and its Colab launch links."""
    pages = {}
    for name in toc_files():
        problems = []
        page = open_page(browser, f"{server}/{name}.html", problems)
        pages[name] = dict(
            problems=problems,
            sizes=page.evaluate("Array.from(document.images).map(i => [i.src, i.naturalWidth, i.naturalHeight])"),
            headings=page.locator("h1").count(),
            launch=page.eval_on_selector_all("a[href*='colab.research.google.com']", "as => as.map(a => a.href)"))
        page.close()
    return pages


def test_every_page_loads_offline_without_script_errors_and_images_have_a_size(loaded):
    for name, page in loaded.items():
        assert all(w > 0 and h > 0 for _, w, h in page["sizes"]), (name, [s for s in page["sizes"] if not s[1]])
        assert page["headings"] >= 1
        assert not page["problems"], (name, page["problems"])


# A static twin is made by one of d2lmini's ``*_static(...)`` functions or an explorer's ``.static()``.
MAKES_A_TWIN = re.compile(r"_static\(|\.static\(")


def _twin_pages():
    """Chapters whose notebook makes a static twin."""
    return [name for name in toc_files()
            if (ROOT / f"{name}.ipynb").exists() and MAKES_A_TWIN.search((ROOT / f"{name}.ipynb").read_text())]


def test_every_page_with_a_static_twin_has_its_controls_tested(html):
    """The pages the control test below visits are all the pages the build put a twin on."""
    built = [name for name in toc_files()
             if re.search(r'class="d2l-(?:text-)?twin"', (html / f"{name}.html").read_text(encoding="utf-8"))]
    assert built, "no page of the built book holds a static twin"
    assert built == _twin_pages()


@pytest.mark.parametrize("name", _twin_pages())
def test_every_static_control_changes_the_drawing(server, browser, name):
    problems = []
    page = open_page(browser, f"{server}/{name}.html", problems)
    twins = page.locator(".d2l-twin")
    texts = page.locator(".d2l-text-twin")  # a text explorer's twin: each control changes the text shown
    assert twins.count() + texts.count() >= 1
    for t in range(texts.count()):
        twin = texts.nth(t)
        twin.scroll_into_view_if_needed()
        controls = twin.locator("select[data-control]")
        assert controls.count() >= 1
        for c in range(controls.count()):  # from the initial choice, another option of each control shows other text
            control, before = controls.nth(c), twin.locator("pre").inner_text()
            initial = control.input_value()
            shown = set()
            for option in control.locator("option").evaluate_all("os => os.map(o => o.value)"):
                control.select_option(option)
                shown.add(twin.locator("pre").inner_text())
            control.select_option(initial)
            assert twin.locator("pre").inner_text() == before and len(shown) > 1, (name, "text twin", t, c)
    for t in range(twins.count()):
        twin = twins.nth(t)
        twin.scroll_into_view_if_needed()
        controls = twin.locator("[data-control]")
        assert controls.count() >= 1
        for c in range(controls.count()):
            control = controls.nth(c)
            before_frame, before_png = twin.get_attribute("data-frame"), twin.locator("svg").screenshot()
            if control.evaluate("e => e.tagName") == "SELECT":
                options = control.locator("option").evaluate_all("os => os.map(o => o.value)")
                current = control.input_value()
                control.select_option(next(o for o in options if o != current))
            else:
                current = int(control.input_value())
                control.fill(str(current - 1 if current > 0 else current + 1))
            after_frame, after_png = twin.get_attribute("data-frame"), twin.locator("svg").screenshot()
            assert after_frame != before_frame, (name, t, c)
            assert after_png != before_png, (name, t, c, after_frame)
    page.close()
    assert not problems, problems


def test_a_predictions_answer_is_folded_until_opened(server, browser):
    """The answer after an experiment is a closed <details>: its text is hidden until the reader opens it."""
    name = next(n for n in toc_files() if n.startswith("chapters/0"))
    problems = []
    page = open_page(browser, f"{server}/{name}.html", problems)
    answer = page.locator("details.d2l-prediction")
    assert answer.count() == 1
    answer.scroll_into_view_if_needed()
    body = answer.locator("p")
    assert not body.is_visible()
    answer.locator("summary").click()
    assert body.is_visible() and body.inner_text().startswith("(")
    page.close()
    assert not problems, problems


def test_launch_links_open_notebooks_that_exist(loaded):
    """Each launch link opens the chapter from the branch of executed notebooks, at the path the chapter
    has in this repository (test_publish.py checks that the published notebook is there)."""
    import yaml

    branch = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["branch"]
    checked = 0
    for name in toc_files():
        if not (ROOT / f"{name}.ipynb").exists():
            continue
        links = loaded[name]["launch"]
        assert links, f"{name}: no Colab launch link"
        for link in links:
            assert f"/blob/{branch}/" in link, link
            path = link.split(f"/blob/{branch}/", 1)[1]
            assert path.endswith(".ipynb") and (ROOT / path).exists(), link
            checked += 1
    assert checked >= 1
