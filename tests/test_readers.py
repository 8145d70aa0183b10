"""The stored notebooks read the same in the HTML book, in Jupyter and in Colab.

Colab and Jupyter render a notebook's Markdown cells as GitHub-flavoured Markdown with
dollar math, nothing more, so a MyST role, directive or target would show there as raw
text. These tests render every stored notebook's Markdown the way those two do
(markdown-it's GFM-like preset with the dollar-math plugin) and look for MyST-only
syntax in the result. The text that quotes a run's numbers is not Markdown at all: a code
cell writes it as Markdown output (``Markdown(rf\"\"\"...\"\"\")``), so its numbers are the ones
that run computed in every reader. Its template is checked the same way.

Citations are plain Markdown links whose text and address both come from
``references.bib``; figures are numbered by hand in their captions, and checked here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest
from markdown_it import MarkdownIt
from mdit_py_plugins.dollarmath import dollarmath_plugin
from pybtex.database import parse_file

from conftest import ROOT, chapter_notebooks

NOTEBOOKS = chapter_notebooks()
PROSE_TITLE = "#@title Run to fill in the numbers"
# A replacement field of an f-string: {value:.2f}, but not the doubled braces {{ }} of LaTeX.
PLACEHOLDER = re.compile(r"(?<!\{)\{(?!\{)[^{}]*\}(?!\})")

# What GFM (as Colab and Jupyter render it) leaves on the page when the source is MyST-only.
MYST_ONLY = {
    "role": re.compile(r"\{[a-zA-Z][\w:.-]*\}<code>"),  # {cite:t}`key`, {glue:text}`x`, {numref}`f`
    "directive fence": re.compile(r'<code class="language-\{'),  # ```{figure} ...
    "colon fence": re.compile(r"(^|<p>|\n):::"),  # :::{note}
    "target": re.compile(r"(^|<p>|\n)\([\w:.-]+\)="),  # (label)=
    "substitution": re.compile(r"\{\{[^}]*\}\}"),  # {{ name }}
    "block break": re.compile(r"(^|<p>|\n)\+\+\+"),  # +++
    "comment": re.compile(r"(^|<p>|\n)%"),  # % a MyST comment
}


def gfm() -> MarkdownIt:
    """The renderer of Colab and Jupyter: GitHub-flavoured Markdown and $ / $$ math."""
    return MarkdownIt("gfm-like").use(dollarmath_plugin)


def prose_cells(nb) -> list:
    """The code cells whose output is the chapter's text with this run's numbers."""
    return [cell for cell in nb.cells if cell.cell_type == "code" and cell.source.startswith(PROSE_TITLE)]


# A number as a paragraph quotes it: 3, -0.25, 1,024, 1.2e-05, +0.031.
NUMBER = re.compile(r"[-+−]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")


def quoted_numbers(markdown: str) -> list[str]:
    """The numbers a paragraph shows its reader (not those inside link addresses)."""
    return NUMBER.findall(re.sub(r"\]\([^)\s]*\)", "]", markdown))


def prose_outputs(nb) -> list[str]:
    """The Markdown each prose cell of an executed notebook wrote, in order."""
    return [output["data"]["text/markdown"] for cell in prose_cells(nb) for output in cell.get("outputs", [])
            if "text/markdown" in output.get("data", {})]


def prose_template(cell) -> str:
    """The Markdown a prose cell writes, with every ``{expression:format}`` shown as 0."""
    match = re.fullmatch(r'#@title [^\n]*\nMarkdown\(rf"""\n(.*)\n"""\)', cell.source, re.S)
    assert match, f"a prose cell is one Markdown(rf\"\"\"...\"\"\") call: {cell.source[:200]!r}"
    text = PLACEHOLDER.sub("0", match.group(1))
    return text.replace("{{", "{").replace("}}", "}")


def reader_markdown(nb) -> list[str]:
    """Every piece of Markdown a reader's notebook shows: Markdown cells and prose templates."""
    return [cell.source for cell in nb.cells if cell.cell_type == "markdown"] + [
        prose_template(cell) for cell in prose_cells(nb)]


def myst_only(markdown: str) -> list[str]:
    html = gfm().render(markdown)
    return [f"{kind}: {m.group(0)!r}" for kind, pattern in MYST_ONLY.items() for m in pattern.finditer(html)]


def test_the_detector_finds_what_colab_would_show_raw():
    for source in ("From {glue:text}`x:.2f` to", "{cite:t}`xiong2020layer`", "```{note}\nHi\n```",
                   ":::{note}\nHi\n:::", "(fig-label)=\n# Title", "{{ version }}", "% comment", "+++"):
        assert myst_only(source), source
    plain = ("[Xiong et al. (2020)](https://arxiv.org/abs/2002.04745) find $\\frac{a}{b}$\n\n"
             "$$\nx_{ij} = {a \\brace b}\n$$\n\n```python\nd = {'a': 1}\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |")
    assert myst_only(plain) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_myst_only_syntax_reaches_colab_or_jupyter(path):
    nb = nbformat.read(path, as_version=4)
    found = [hit for markdown in reader_markdown(nb) for hit in myst_only(markdown)]
    assert found == [], f"{path.name}: {len(found)} pieces of MyST-only syntax: {found[:10]}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_prose_cells_are_hidden_code_in_every_reader(path):
    """Input removed in the HTML, a collapsed form in Colab, a collapsed input in Jupyter."""
    nb = nbformat.read(path, as_version=4)
    for cell in prose_cells(nb):
        assert "remove-input" in cell.metadata.get("tags", []), cell.source[:80]
        assert cell.metadata.get("cellView") == "form", cell.source[:80]
        assert cell.metadata.get("jupyter", {}).get("source_hidden") is True, cell.source[:80]
        assert PLACEHOLDER.search(cell.source), f"a prose cell quotes a computed value: {cell.source[:80]!r}"
    for cell in nb.cells:
        if cell.cell_type == "code" and "Markdown(rf" in cell.source:
            assert cell in prose_cells(nb), f"prose cells start with {PROSE_TITLE!r}: {cell.source[:80]!r}"


# ---------------------------------------------------------------------------------- citations


def _plain(text: str) -> str:
    return text.replace("{\\L}", "Ł").replace("{", "").replace("}", "").replace("\\", "")


def bibliography() -> dict[str, tuple[str, str, str]]:
    """``key -> (authors as cited, year, address)`` for every entry of ``references.bib``.

    Authors as the author-year style cites them: "Zhang and Sennrich", "Xiong et al.".
    The address is the entry's ``url``, else its arXiv abstract page.
    """
    entries = {}
    for key, entry in parse_file(ROOT / "references.bib").entries.items():
        names = [_plain(" ".join(p.prelast_names + p.last_names)) for p in entry.persons["author"]]
        if len(names) == 1:
            who = names[0]
        elif len(names) == 2 and "others" not in names:
            who = f"{names[0]} and {names[1]}"
        else:
            who = f"{names[0]} et al."
        arxiv = entry.fields.get("eprint") or re.search(r"arXiv:(\S+)", entry.fields.get("journal", "") + " arXiv:?")
        url = entry.fields.get("url") or f"https://arxiv.org/abs/{arxiv if isinstance(arxiv, str) else arxiv.group(1)}"
        assert "?" not in url, f"{key}: no url, eprint or arXiv journal in references.bib"
        entries[key] = (who, entry.fields["year"], url)
    return entries


LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def test_every_citation_is_its_bibliography_entry():
    """A link to a cited work reads "Authors (Year)" or "Authors, Year", as the bib says; works of the same
    authors and year carry a letter (2016a, 2016b), one per work and the same in every chapter."""
    by_url = {url: (who, year) for who, year, url in bibliography().values()}
    shared = {pair for pair in by_url.values() if list(by_url.values()).count(pair) > 1}
    cited, letters = set(), {}
    for path in NOTEBOOKS:
        for markdown in reader_markdown(nbformat.read(path, as_version=4)):
            for text, url in LINK.findall(markdown):
                if url in by_url:
                    who, year = by_url[url]
                    if (who, year) in shared:  # two works of one year: 2016a, 2016b
                        match = re.fullmatch(rf"{re.escape(who)}(?: \(|, ){year}([a-z])\)?", text)
                        assert match, f"{path.name}: [{text}]({url}) needs a letter after {year}"
                        assert letters.setdefault(url, match[1]) == match[1], f"{path.name}: [{text}]({url})"
                        assert [letters.get(u) for u, pair in by_url.items() if pair == (who, year)].count(
                            match[1]) == 1, f"{path.name}: [{text}]({url}): another work has this letter"
                    else:
                        assert text in (f"{who} ({year})", f"{who}, {year}"), f"{path.name}: [{text}]({url})"
                    cited.add(url)
                elif re.search(r"\bet al\.|\(\d{4}\)|, \d{4}$", text):
                    pytest.fail(f"{path.name}: [{text}]({url}) reads as a citation but is not in references.bib")
    uncited = sorted(key for key, (_, _, url) in bibliography().items() if url not in cited)
    assert uncited == [], f"entries of references.bib no chapter cites: {uncited}"


def test_relative_links_point_at_pages_of_the_book():
    for path in NOTEBOOKS:
        for markdown in reader_markdown(nbformat.read(path, as_version=4)):
            for text, url in LINK.findall(markdown):
                if re.match(r"[a-z]+:", url) or url.startswith("#"):
                    continue
                target = (path.parent / url.partition("#")[0]).resolve()
                assert target.exists(), f"{path.name}: [{text}]({url}) points at nothing"


# ---------------------------------------------------------------------------------- figures


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_figures_are_numbered_in_order_and_referenced_figures_exist(path):
    nb = nbformat.read(path, as_version=4)
    captions = [(i, m.group(1)) for i, cell in enumerate(nb.cells) if cell.cell_type == "markdown"
                for m in [re.match(r"\*\*Figure (\d+\.\d+)\.\*\* ", cell.source)] if m]
    chapter = int(path.stem[:2]) if path.stem[:2].isdigit() else None
    assert [number for _, number in captions] == [f"{chapter}.{k}" for k in range(1, len(captions) + 1)]
    for i, _ in captions:  # a caption sits right under the cell that draws the figure
        assert nb.cells[i - 1].cell_type == "code", f"{path.name}: caption {i} follows no code cell"
    numbers = {number for _, number in captions}
    for markdown in reader_markdown(nb):
        for number in re.findall(r"Figure (\d+\.\d+)", markdown):
            assert number in numbers, f"{path.name}: Figure {number} is referred to but not drawn"


def conditional_text(source: str) -> list[str]:
    """The conditionals of a code cell that choose between pieces of text (``"grew" if a > b
    else "shrank"``, or an ``if`` whose branches build an f-string or a phrase): prose
    assembled from the numbers, which a chapter must not do."""
    def is_text(node) -> bool:
        return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str)
                                                   and len(node.value.split()) >= 2)

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.IfExp):
            branches = [node.body, node.orelse]
        elif isinstance(node, ast.If):
            branches = node.body + node.orelse
        else:
            continue
        if any(is_text(n) for branch in branches for n in ast.walk(branch)):
            found.append(ast.unparse(node).splitlines()[0][:100])
    return found


def test_the_detector_finds_text_chosen_by_a_condition():
    assert conditional_text('word = "grew by far" if a > b else "shrank"')
    assert conditional_text('if a > b:\n    s = f"{a} is more"\nelse:\n    s = "less than b"')
    assert not conditional_text('x = 1 if a > b else 2\nif a:\n    print(a)\nlabel = "grew by far"')


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_sentence_is_chosen_by_the_numbers(path):
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code":
            assert not conditional_text(cell.source), f"{path.name}: {conditional_text(cell.source)}"


#: The chapters of Parts I and II: each opens with its objectives and has the reader build its part.
BUILD_CHAPTERS = [path for path in NOTEBOOKS
                  if path.parent.name == "chapters" and path.stem[:2].isdigit() and int(path.stem[:2]) <= 9]


def reader_parts(nb) -> list[tuple[str, str]]:
    """``(part, check)`` for each visible code cell that defines a class or a function from
    scratch (the reader's part) and is followed by a cell that checks it with
    ``torch.testing.assert_close`` or ``d2lmini.exercises.check_build`` against ``d2lmini``."""
    cells = [cell for cell in nb.cells if cell.cell_type == "code"]
    found = []
    for cell, after in zip(cells, cells[1:]):
        tree = ast.parse(cell.source)
        defines = any(isinstance(node, (ast.ClassDef, ast.FunctionDef)) for node in tree.body)
        if defines and "remove-input" not in cell.metadata.get("tags", []) \
                and ("assert_close" in after.source or "check_build(" in after.source) and "d2lmini." in after.source:
            found.append((cell.source, after.source))
    return found


def test_parts_i_and_ii_are_chapters_1_to_9():
    assert [path.stem[:2] for path in BUILD_CHAPTERS] == [f"{k:02d}" for k in range(1, 10)]


@pytest.mark.parametrize("path", BUILD_CHAPTERS, ids=lambda p: p.stem)
def test_the_chapter_opens_with_what_the_reader_will_be_able_to_do(path):
    first = nbformat.read(path, as_version=4).cells[0]
    assert first.cell_type == "markdown" and "What you will be able to do" in first.source, path.name


@pytest.mark.parametrize("path", BUILD_CHAPTERS, ids=lambda p: p.stem)
def test_the_reader_builds_the_part_and_checks_it_against_d2lmini(path):
    parts = reader_parts(nbformat.read(path, as_version=4))
    assert parts, f"{path.name}: no cell writes a part that the next cell checks against d2lmini"
    for part, _ in parts:
        assert len(part.strip().splitlines()) <= 25, f"{path.name}: the reader's part has more than 25 lines"
