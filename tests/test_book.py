"""The built book: every page, the chapter's executed table and figures, the run's numbers, citations.

Also proves the build can fail: a tiny book made with this repository's own
``_config.yml`` and one notebook cell that raises must make the build exit non-zero.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from urllib.parse import unquote, urlparse

import nbformat
import pytest
import torch
from bs4 import BeautifulSoup
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

import d2lmini
from conftest import ROOT, build, code_notebooks, toc_files  # the html fixture (conftest.py) builds the book once
from test_readers import bibliography as bibliography_keys
from test_readers import prose_outputs, quoted_numbers

# Every test here runs jupyter-book: on the whole book (the html fixture) or on a tiny one.
pytestmark = pytest.mark.slow


def page(html: Path, name: str) -> BeautifulSoup:
    return BeautifulSoup((html / f"{name}.html").read_text(encoding="utf-8"), "html.parser")


def text_of(soup: BeautifulSoup, separator: str = " ") -> str:
    return re.sub(r"\s+", " ", soup.get_text(separator))


def test_every_toc_page_is_built(html):
    assert (html / "index.html").exists()
    for name in toc_files():
        assert (html / f"{name}.html").exists(), name


def test_internal_links_and_images_resolve(html):
    for path in html.rglob("*.html"):
        soup = BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")
        anchors = {tag.get("id") for tag in soup.find_all(id=True)}
        for tag, attr in (("a", "href"), ("img", "src")):
            for element in soup.find_all(tag):
                link = element.get(attr)
                if not link or urlparse(link).scheme or link.startswith(("mailto:", "//")):
                    continue
                target_path, _, fragment = link.partition("#")
                target = (path.parent / unquote(target_path)).resolve() if target_path else path
                assert target.exists(), f"{path.name}: broken {attr} {link}"
                if fragment and target == path:
                    assert fragment in anchors, f"{path.name}: missing anchor #{fragment}"


def figure_captions(soup: BeautifulSoup, chapter: int) -> dict[str, BeautifulSoup]:
    """``"4.1" -> caption paragraph`` for the numbered figures of a chapter's page."""
    captions = {}
    for paragraph in soup.find_all("p"):
        match = re.match(rf"Figure ({chapter}\.\d+)\. ", paragraph.get_text())
        if match:
            captions[match.group(1)] = paragraph
    return captions


def test_chapter_holds_its_executed_table_and_figure(html):
    soup = page(html, "chapters/04_norm_placement")
    tables = [t for t in soup.find_all("table") if "token spread" in t.get_text()]
    assert len(tables) == 2
    assert len(tables[0].find("tbody").find_all("tr")) == 10  # post/pre x k = 4, 8, 16, 24, 32
    assert len(tables[1].find("tbody").find_all("tr")) == 5  # five placements at k = 32
    captions = figure_captions(soup, 4)
    assert list(captions) == ["4.1", "4.2", "4.3", "4.4"]
    for number, caption in captions.items():  # each caption sits under the cell that drew its figure
        cell = caption.find_previous_sibling("div", class_="cell")
        image = cell.find("img") if cell is not None else None
        assert image is not None, f"Figure {number} has no image above its caption"
        image_file = (html / "chapters" / image["src"]).resolve()
        assert image_file.exists() and image_file.stat().st_size > 5_000, number
    assert "Thirty-two freshly initialized blocks" in captions["4.1"].get_text()


def test_the_text_quotes_the_numbers_this_code_computes(html):
    text = text_of(page(html, "chapters/04_norm_placement"))
    probes = {p: d2lmini.probe_depth(p, norm="layer", depth=32, dtype=torch.float64, seed=0) for p in ("post", "pre")}
    pre, post = probes["pre"], probes["post"]
    for number in (f"{pre.stream_rms[8]:.3g}", f"{pre.stream_rms[32]:.3g}", f"{post.token_spread[32]:.3g}",
                   f"{pre.token_spread[32]:.3g}", f"{post.qk_vo_ratio(32):.3g}", f"{pre.qk_vo_ratio(32):.3g}"):
        assert number in text, number


@pytest.mark.parametrize("name", [path.relative_to(ROOT).with_suffix("").as_posix() for path in code_notebooks()])
def test_every_paragraph_written_by_the_run_is_on_the_page(html, name):
    """The Markdown each prose cell wrote in the build's run is on the page, numbers and all."""
    built = nbformat.read(html.parent / "jupyter_execute" / f"{name}.ipynb", as_version=4)
    text = text_of(page(html, name), separator="")
    assert "numbers[" not in text and "{glue" not in text and "{cite" not in text
    for markdown in prose_outputs(built):
        position = 0
        for number in quoted_numbers(markdown):
            found = text.find(number, position)
            assert found >= 0, f"{name}: {number} of {markdown[:120]!r} is not on the page"
            position = found


def test_citations_link_to_the_work_and_the_bibliography_lists_every_entry(html):
    chapter = page(html, "chapters/04_norm_placement")
    links = {a.get_text(): a["href"] for a in chapter.find_all("a", href=True)}
    assert links.get("Xiong et al., 2020", links.get("Xiong et al. (2020)")) == "https://arxiv.org/abs/2002.04745"
    bibliography = page(html, "chapters/references")
    text = text_of(bibliography)
    assert "On layer normalization in the Transformer architecture" in text
    assert "pure attention loses rank doubly exponentially with depth" in text
    entries = bibliography.find_all("div", class_="citation")
    assert len(entries) == len(bibliography_keys()), (len(entries), len(bibliography_keys()))


def test_no_dead_widget_in_the_static_page(html):
    raw = (html / "chapters" / "04_norm_placement.html").read_text(encoding="utf-8")
    assert "application/vnd.jupyter.widget-view+json" not in raw
    assert "widget-view" not in raw and "jupyter-widgets" not in raw
    text = text_of(BeautifulSoup(raw, "html.parser"), separator="")
    assert "d2lmini.depth_explorer(" in text  # the code is shown, the slider is not


def _fixture_book(tmp_path: Path, cell_source: str) -> Path:
    book = tmp_path / "book"
    book.mkdir()
    shutil.copy(ROOT / "_config.yml", book / "_config.yml")
    shutil.copy(ROOT / "references.bib", book / "references.bib")
    (book / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n  - file: chapter\n")
    (book / "intro.md").write_text("# Fixture\n\nA book with one chapter.\n")
    nb = new_notebook(cells=[new_markdown_cell("# Chapter"), new_code_cell(cell_source)])
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nbformat.write(nb, book / "chapter.ipynb")
    return book


# The one cell of the tiny book each test builds.
TINY_BOOK_CELLS = {
    "test_a_cell_that_raises_fails_the_build": 'raise RuntimeError("this chapter is broken")',
    "test_the_same_fixture_builds_when_the_cell_is_fine": 'print("this chapter is fine")',
}


def queue_jobs(item, jobs, tmp_path_factory):
    """At the start of the session, queue the build of each selected test's tiny book (conftest.Jobs):
    they run in the background, beside the whole book's build."""
    cell = TINY_BOOK_CELLS.get(item.originalname)
    if cell is not None:
        folder = tmp_path_factory.mktemp("tiny_book")
        jobs.add(("tiny book", item.originalname), lambda: build(_fixture_book(folder, cell), folder / "out"))


def test_a_cell_that_raises_fails_the_build(jobs):
    proc = jobs.result(("tiny book", "test_a_cell_that_raises_fails_the_build"))
    assert proc.returncode != 0
    assert "this chapter is broken" in proc.stdout + proc.stderr


def test_the_same_fixture_builds_when_the_cell_is_fine(jobs):
    proc = jobs.result(("tiny book", "test_the_same_fixture_builds_when_the_cell_is_fine"))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


def test_every_chapter_page_stays_under_3_mb(html):
    for name in toc_files():
        path = html / f"{name}.html"
        soup = BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")
        images = {(path.parent / unquote(img["src"])).resolve() for img in soup.find_all("img")
                  if img.get("src") and not urlparse(img["src"]).scheme}
        weight = path.stat().st_size + sum(p.stat().st_size for p in images if p.exists())
        assert weight <= 3 * 2**20, f"{name}: {weight / 2**20:.2f} MiB"


#: The most words of prose a chapter's page may hold: Parts I and II, then Part III.
WORD_BUDGET = {**{f"{k:02d}": 2500 for k in range(1, 10)}, "10": 3000, "11": 3000}


def prose_words(soup: BeautifulSoup) -> int:
    """Words of prose on a built page: paragraphs, list items, headings and captions, written
    by hand or by the run, outside code, display math and tables (and outside the page's
    navigation); an inline formula counts its symbols that are words or numbers (``$W_q x$``: two)."""
    article = soup.select_one("article") or soup
    for element in article.select("pre, table, div.cell_input, div.math, script, style, a.headerlink"):
        element.decompose()
    return len(re.findall(r"[^\W_][\w'’.,:;!?-]*", article.get_text(" ")))


def test_prose_words_count_what_a_reader_reads():
    soup = BeautifulSoup("<article><h1>A title</h1><p>One two <span class='math'>\\(a + b\\)</span>.</p><pre>code code</pre>"
                         "<table><tr><td>cell</td></tr></table><div class='math'>x + y</div>"
                         "<ul><li>four five</li></ul></article><nav>menu</nav>", "html.parser")
    assert prose_words(soup) == 8


@pytest.mark.parametrize("number", sorted(WORD_BUDGET))
def test_every_chapter_keeps_to_its_word_budget(html, number):
    [name] = [f for f in toc_files() if f.startswith(f"chapters/{number}_")]
    words = prose_words(page(html, name))
    assert words <= WORD_BUDGET[number], f"{name}: {words} words of prose, budget {WORD_BUDGET[number]}"
