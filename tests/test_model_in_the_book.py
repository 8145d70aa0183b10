"""The capstone's trained models in the built chapter "The 2026 block", in headless Chromium.

The book's own build (the ``html`` fixture) trained the 2017 and 2026 blocks and wrote them into the
chapter's page (``d2lmini.webmodel.ModelTwin``). The test opens that page served from localhost and
opened as a file, types prompts, and checks that each model's greedy text is PyTorch's
(:func:`d2lmini.generate` on the page's own float16 weights, read back with
:func:`d2lmini.webmodel.import_model`) character for character, past the context; that temperature
and top-k change the text and a seed repeats it; that the attention grid is drawn and equals
PyTorch's; that a character outside the vocabulary and an empty prompt get a message; and prints
the time per token.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from d2lmini import generate
from d2lmini.webmodel import import_model, inside
from test_browser import THIRD_PARTY_NOISE
from conftest import CHROMIUM, CHROMIUM_ARGS, require_chromium, serve_folder
from test_web_model import run_in_page

# The built book (the html fixture) in a browser: out of the quick loop.
pytestmark = pytest.mark.slow

CHAPTER = "chapters/09_the_2026_block.html"
#: Prompts typed into the chapter: the samples' prompt, code, and one longer than the context of 64.
PROMPTS = ("The value of ", "def forward(self, x):\n    return ",
           "The key/value cache keeps the keys and values of every position so far, so each step ")
NEW_TOKENS = 200  # past the context for every prompt: the window slides


def chapter_page(browser, url: str):
    """The chapter opened at ``url``, its explorer ready; and the list its script errors go to."""
    problems = []
    tab = browser.new_page(viewport={"width": 1280, "height": 1000})
    tab.on("pageerror", lambda error: not any(noise in str(error) for noise in THIRD_PARTY_NOISE)
           and problems.append(f"script error: {error}"))
    tab.on("request", lambda request: not request.url.startswith(url.rsplit("/", 2)[0])
           and not request.url.startswith(("data:", "blob:")) and problems.append(f"request to {request.url}"))
    tab.goto(url, wait_until="load")
    tab.wait_for_selector(".d2l-lm-twin[data-state='idle']", timeout=60_000)
    tab.locator(".d2l-lm-twin").scroll_into_view_if_needed()
    return tab, problems


@pytest.fixture(scope="module")
def browser(html):
    require_chromium()
    playwright_api = pytest.importorskip("playwright.sync_api")
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def served(html):
    """The built book over HTTP from localhost: the chapter's address."""
    with serve_folder(html) as url:
        yield f"{url}/{CHAPTER}"


def page_models(tab) -> tuple[dict, list]:
    """The models the page holds, back in PyTorch ({name: LanguageModel}), and the vocabulary."""
    spec = json.loads(tab.locator(".d2l-lm-twin script[type='application/json']").text_content())
    return {m["name"]: import_model(m) for m in spec["models"]}, spec["vocab"]


def greedy_text(model, vocab, prompt: str, n: int) -> str:
    ids = torch.tensor([vocab.index(ch) for ch in prompt])
    return "".join(vocab[i] for i in generate(model, ids, n)[len(ids):].tolist())


def check_the_chapter(tab, problems, prompts=PROMPTS, new_tokens=NEW_TOKENS):
    models, vocab = page_models(tab)
    assert list(models) == ["2017 block", "2026 block"]
    twin = tab.locator(".d2l-lm-twin")
    twin.locator("[data-control='generate']").click()  # as the page opens: the samples' prompt, greedy
    tab.wait_for_selector(".d2l-lm-twin[data-state='done']", timeout=300_000)
    assert [pre.get_attribute("data-agrees") for pre in twin.locator(".d2l-lm-output").all()] == ["true", "true"]
    assert twin.locator(".d2l-lm-check").text_content().count("the same 300 characters as d2lmini.generate") == 2
    for prompt in prompts:  # typed: both models side by side, greedy
        shown = run_in_page(tab, prompt, length=new_tokens)
        assert shown["message"] == ""
        for name, model in models.items():
            expected = greedy_text(model, vocab, prompt, new_tokens)
            got = shown["texts"][name]
            first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
            assert got == expected, (name, prompt, first)
    return models, vocab


def test_the_chapter_generates_what_pytorch_generates_served(browser, served):
    tab, problems = chapter_page(browser, served)
    models, vocab = check_the_chapter(tab, problems)
    # temperature and top-k: a seed repeats its sample, another seed or temperature changes it, top-1 is greedy
    greedy = run_in_page(tab, PROMPTS[0], length=120)["texts"]
    sampled = run_in_page(tab, PROMPTS[0], temperature=0.8, top_k="5", seed=7, length=120)["texts"]
    assert sampled != greedy
    assert run_in_page(tab, PROMPTS[0], temperature=0.8, top_k="5", seed=7, length=120)["texts"] == sampled
    assert run_in_page(tab, PROMPTS[0], temperature=0.8, top_k="5", seed=8, length=120)["texts"] != sampled
    assert run_in_page(tab, PROMPTS[0], temperature=1.5, top_k="1", seed=3, length=120)["texts"] == greedy
    hot = run_in_page(tab, PROMPTS[0], temperature=2.0, seed=3, length=120)["texts"]
    assert all(len(set(hot[name])) > len(set(greedy[name])) for name in greedy)  # hotter: more distinct characters
    assert tab.locator(".d2l-lm-check").text_content() == ""  # sampled text is not compared
    # the attention grid of a short prompt: every head of every block, PyTorch's weights
    prompt = "for x in y:"
    run_in_page(tab, prompt, length=3)
    n = len(prompt)
    assert tab.locator(".d2l-lm-grid").count() == 2
    assert tab.locator(".d2l-lm-grid rect").count() == 2 * 4 * 4 * (1 + n * (n + 1) // 2)
    ids = [vocab.index(ch) for ch in prompt]
    for i, (name, model) in enumerate(models.items()):
        expected = inside(model, torch.tensor(ids))
        grid = tab.locator(".d2l-lm-grid").nth(i)
        assert grid.get_attribute("aria-label").startswith(name)
        # one square of the grid as the reader hovers it: block 1, head 1, the last character on itself
        titles = grid.locator("rect title").all_text_contents()
        last = next(t for t in titles[:n * (n + 1) // 2] if t.startswith(f"'{prompt[-1]}' → '{prompt[-1]}'"))
        assert float(last.rsplit(": ", 1)[1]) == pytest.approx(float(expected["attention"][0, 0, -1, -1]), abs=1e-3)
        rms = [float(td) for td in tab.locator(".d2l-lm-rms").nth(i).locator("td").all_text_contents()[1:]]
        assert rms == pytest.approx(expected["rms"], abs=1e-3)
    # bad prompts: a message, no text
    shown = run_in_page(tab, "naïve café", length=5)
    assert "'ï', 'é'" in shown["message"] and "vocabulary" in shown["message"] and not shown["texts"]
    assert "Type a prompt" in run_in_page(tab, "", length=5)["message"]
    tab.close()
    assert not problems, problems


def test_the_chapter_generates_what_pytorch_generates_opened_as_a_file(browser, html):
    tab, problems = chapter_page(browser, (html / CHAPTER).as_uri())
    check_the_chapter(tab, problems, prompts=PROMPTS[1:2])
    assert "vocabulary" in run_in_page(tab, "π = 3.14", length=5)["message"]
    tab.close()
    assert not problems, problems


def test_time_per_token_in_the_chapter(browser, served):
    """Milliseconds per token of each trained model in Chromium, wall time and the page's main-thread CPU
    time (Chrome's ThreadTime): with the cache, and once the window slides (each step recomputing the
    last 64 positions, as d2lmini.generate does). Printed, not asserted: the machine may be busy."""
    tab, problems = chapter_page(browser, served)
    cdp = tab.context.new_cdp_session(tab)
    cdp.send("Performance.enable")

    def thread_time():
        return next(m["value"] for m in cdp.send("Performance.getMetrics")["metrics"] if m["name"] == "ThreadTime")

    for i, name in enumerate(["2017 block", "2026 block"]):
        tab.evaluate("(i) => { var spec = JSON.parse(document.querySelector('.d2l-lm-twin script').textContent); "
                     "window.timed = new d2lmini.Generator(new d2lmini.LanguageModel(spec.models[i]), [1, 2, 3], {}); }", i)
        times = []
        for steps in (60, 200):
            cpu = thread_time()
            wall = tab.evaluate("(steps) => { var t = performance.now(); for (var i = 0; i < steps; i++) "
                                "window.timed.step(); return (performance.now() - t) / steps; }", steps)
            times.append((wall, (thread_time() - cpu) * 1000 / steps))
        print(f"{name}: {times[0][0]:.2f} ms per token with the cache ({times[0][1]:.2f} ms of CPU), {times[1][0]:.2f} ms "
              f"once the window slides ({times[1][1]:.2f} ms of CPU) (load average {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} CPUs)")
    tab.close()
    assert not problems, problems
