"""The appendix "The Block Zoo" (chapters/zoo.ipynb) and chapter 10's three zoo rows: the table
functions return every row with its columns, a layer class missing from the installed
transformers is reported rather than raised, and the page cites a source for every row."""

from __future__ import annotations

import dataclasses
import inspect
import re
import types

import nbformat
import pytest
import torch
import yaml

from conftest import ROOT
from d2lmini import TransformerBlock, reference
from d2lmini.chapters import ch09_the_2026_block as ch09
from d2lmini.chapters import zoo
from d2lmini.reference.gemma import GemmaAttention
from d2lmini.reference.llama import LlamaVariantAttention

pytest.importorskip("transformers")

PAGE = ROOT / "chapters" / "zoo.ipynb"
ROWS = {row.name: row for row in zoo.ZOO}
META = ("name", "family", "year", "layer_class", "layer_idx", "note", "max_abs_diff", "max_abs_grad_diff",
        "max_abs_output", "reproduced", "status", "block")


@pytest.fixture(scope="module")
def table():
    return zoo.zoo_table(seed=0)


def _future_row(name="Future", model_type="llama", layer_class="LlamaFutureLayer", config_class="LlamaConfig"):
    """A row whose layer (or its module, or its config) this transformers does not have."""
    return zoo.hf_row(name, "Future", 2027, model_type, layer_class, config_class,
                      dict(**reference.TINY, num_hidden_layers=1))


# --------------------------------------------------------------------------- the table


def test_zoo_table_returns_every_row_with_its_columns(table):
    assert [r["name"] for r in table] == [row.name for row in zoo.ZOO]
    describe_keys = set(zoo.describe(table[0]["block"]))
    for r, row in zip(table, zoo.ZOO):
        assert set(META) | describe_keys <= set(r), r["name"]
        assert (r["family"], r["year"], r["layer_class"]) == (row.family, row.year, row.layer_class)
        assert r["status"] == "reproduced" and r["reproduced"], r["name"]
        assert max(r["max_abs_diff"], r["max_abs_grad_diff"]) <= zoo.TOLERANCE
        assert isinstance(r["block"], TransformerBlock)


def test_zoo_frame_has_one_line_per_row_and_every_descriptive_column(table):
    frame = zoo.zoo_frame(table)
    assert list(frame.index) == [row.name for row in zoo.ZOO]
    assert "family" not in frame.columns  # the model's name says it; the table stays narrow
    for column in ("year", "layer class", "norm, placement", "attention (test layer)",
                   "positions (test layer)", "FFN (test layer)", "biases", "residual scale", "max |Δ| output",
                   "max |Δ| input grad", "check", "note"):
        assert column in frame.columns, column
    bert = frame.loc["BERT"]
    assert bert["norm, placement"].startswith("LayerNorm") and bert["norm, placement"].endswith(", post")
    assert bert["max |Δ| output"] == "0" and frame.loc["GPT-2", "max |Δ| output"].endswith("e-07")
    # a column describe() gains later shows up without touching zoo_frame
    extra = [dict(r, sinks="yes" if r["name"] == "BERT" else "no") for r in table[:2]]
    assert list(zoo.zoo_frame(extra)["sinks"]) == ["yes", "no"]


def test_features_by_year_counts_the_rows_of_each_year(table):
    by_year = zoo.features_by_year(table)
    assert by_year["rows"].sum() == len(table)
    assert list(by_year.index) == sorted({r["year"] for r in table})
    assert by_year.loc[2018, "post-norm"] == 1 and by_year["post-norm"].sum() == 1  # BERT only
    assert by_year.loc[2024, "logit soft-cap"] == 2  # Gemma 2's two layers
    assert (by_year != 0).any().all()  # features no row has are left out
    assert "attention sinks" not in by_year.columns or by_year["attention sinks"].sum() > 0


def test_block_features_reads_the_block():
    plain = zoo.block_features(TransformerBlock(8, 2))
    assert plain["RMSNorm"] and plain["gated FFN"] and not plain["post-norm"] and not plain["RoPE"]
    block = TransformerBlock(8, 2, norm="layer", placement="post", act="relu", bias=True, attn_factory=lambda: GemmaAttention(
        8, 2, bias=True, causal=True, rope_theta=1e4, qk_norm="per_head", window=3, logit_softcap=10.0))
    features = zoo.block_features(block)
    assert features["post-norm"] and features["biases"] and features["RoPE"] and features["QK-norm"]
    assert features["sliding window"] and features["logit soft-cap"] and not features["gated FFN"]
    assert not features["partial RoPE"] and not features["mixture of experts"]
    with pytest.raises(TypeError, match="block"):
        zoo.block_features(torch.nn.Linear(2, 2))


# --------------------------------------------------------------------------- an older transformers


@pytest.mark.parametrize("kwargs, missing", [
    (dict(layer_class="LlamaFutureLayer"), "transformers.models.llama.modeling_llama.LlamaFutureLayer"),
    (dict(model_type="futurelm", layer_class="FutureDecoderLayer"), "transformers.models.futurelm"),
    (dict(config_class="FutureConfig", layer_class="LlamaDecoderLayer"), "transformers.FutureConfig"),
], ids=["class", "module", "config"])
def test_a_layer_the_installed_transformers_lacks_is_reported_not_raised(kwargs, missing, monkeypatch):
    import transformers

    row = _future_row(**kwargs)
    with pytest.raises((ImportError, AttributeError)) as raised:
        row.make(0)
    assert zoo.missing_from_transformers(raised.value) == missing
    monkeypatch.setattr(zoo, "ZOO", (ROWS["BERT"], row))  # as if the zoo had a row newer than this release
    bert, future = zoo.zoo_table()
    assert bert["status"] == "reproduced"
    assert future["status"] == f"not in this transformers {transformers.__version__}" == \
        f"not in this transformers {zoo.transformers_version()}"
    assert future["max_abs_diff"] is None and future["max_abs_grad_diff"] is None and future["block"] is None
    assert not future["reproduced"] and "norm" not in future and future["year"] == 2027
    line = zoo.zoo_frame([bert, future]).loc["Future"]
    assert line["norm, placement"] == line["attention (test layer)"] == line["max |Δ| output"] == "—"
    assert line["check"] == future["status"]
    assert zoo.features_by_year([bert, future])["rows"].sum() == 1  # counted only where measured


def test_missing_from_transformers_recognizes_only_a_missing_transformers_name():
    import transformers

    assert zoo.missing_from_transformers(ModuleNotFoundError("x", name="transformers.models.futurelm")) == \
        "transformers.models.futurelm"
    assert zoo.missing_from_transformers(ImportError("cannot import name", name="transformers")).startswith(
        "transformers.")
    try:
        transformers.masking_utils.no_such_function  # noqa: B018
    except AttributeError as error:
        assert zoo.missing_from_transformers(error) == "transformers.masking_utils.no_such_function"
    # not about the release: transformers absent, another package, a config attribute, another error
    assert zoo.missing_from_transformers(ModuleNotFoundError("x", name="transformers")) is None
    assert zoo.missing_from_transformers(ModuleNotFoundError("x", name="numpy.futurelm")) is None
    try:
        types.SimpleNamespace().missing  # noqa: B018
    except AttributeError as error:
        assert zoo.missing_from_transformers(error) is None
    assert zoo.missing_from_transformers(ValueError("transformers")) is None


def test_other_failures_are_raised():
    def broken(seed):
        raise AttributeError("'LlamaConfig' object has no attribute 'hidden_size'")

    row = dataclasses.replace(ROWS["Llama 3"], make=broken)
    with pytest.raises(AttributeError, match="hidden_size"):
        zoo.zoo_row(row)


def test_a_mismatch_is_reported():
    llama = ROWS["Llama 3"]

    def call(layer, config, X, valid_lens):
        return 1.001 * llama.call(layer, config, X, valid_lens)

    (r,) = zoo.zoo_table(rows=[dataclasses.replace(llama, call=call)])
    assert r["status"] == "MISMATCH" and not r["reproduced"] and r["max_abs_diff"] > zoo.TOLERANCE


# --------------------------------------------------------------------------- the page


def _cells():
    return nbformat.read(PAGE, as_version=4).cells


def test_the_page_is_the_appendix_between_the_chapters_and_the_back_matter():
    parts = yaml.safe_load((ROOT / "_toc.yml").read_text())["parts"]
    captions = [part["caption"] for part in parts]
    assert captions == ["Part I. The block", "Part II. The modern block", "Part III. The frontier",
                        "Appendix", "Solutions", "Back matter"]
    assert parts[3]["chapters"] == [{"file": "chapters/zoo"}]


def test_the_page_has_the_chapters_setup_cell():
    chapter10 = nbformat.read(ROOT / "chapters" / "09_the_2026_block.ipynb", as_version=4)
    setup = [cell for cell in _cells() if cell.cell_type == "code"][0]
    assert setup.source == [cell for cell in chapter10.cells if cell.cell_type == "code"][0].source


def test_the_page_cites_a_source_for_every_row():
    (sources,) = [cell.source for cell in _cells() if cell.cell_type == "markdown" and "## Sources" in cell.source]
    for row in zoo.ZOO:
        model = re.sub(r" \(.*\)$", "", row.name)  # Gemma 2 (local) -> Gemma 2
        line = re.search(rf"^\* \*\*{re.escape(model)}\*\* \((\d{{4}})[,)].*?\]\(http", sources, re.M | re.S)
        assert line, f"the Sources list of chapters/zoo.ipynb has no cited line for {model}"
        assert int(line.group(1)) == row.year, f"{model}: the Sources say {line.group(1)}, the row {row.year}"


def test_the_page_names_the_rows_it_could_not_measure():
    code = [cell.source for cell in _cells() if cell.cell_type == "code"]
    assert any("missing" in text and "transformers_version()" in text and "print(" in text for text in code)


# --------------------------------------------------------------------------- a decade in three rows


def test_zoo_switches_puts_three_rows_side_by_side():
    decade, rows = zoo.zoo_switches()
    assert list(decade.columns) == ["BERT, 2018", "Gemma 2 (local), 2024", "OLMo 3 (sliding), 2025"]
    assert list(decade.index) == list(zoo.SWITCHES)
    assert all(r["reproduced"] for r in rows)
    assert decade.loc["placement"].tolist() == ["'post'", "'sandwich'", "'post_sublayer'"]
    assert decade.loc["rope_theta", "BERT, 2018"] == "None" and decade.loc["causal", "BERT, 2018"] == "False"
    assert decade.loc["qk_norm", "OLMo 3 (sliding), 2025"] == "'projection'"
    with pytest.raises(ValueError, match="names.*Llama 4.*rows"):
        zoo.zoo_switches(["BERT", "Llama 4"])


def test_zoo_switches_reports_a_row_this_transformers_lacks(monkeypatch):
    monkeypatch.setattr(zoo, "ZOO", (ROWS["BERT"], _future_row()))
    decade, _ = zoo.zoo_switches(["BERT", "Future"])
    assert set(decade["Future, 2027"]) == {f"not in this transformers {zoo.transformers_version()}"}


def test_block_switches_reads_the_constructor_arguments_back():
    assert zoo.block_switches(TransformerBlock(8, 2))["bias"] is False
    assert zoo.block_switches(TransformerBlock(8, 2, bias=True))["bias"] is True
    qwen2 = TransformerBlock(8, 2, attn_factory=lambda: LlamaVariantAttention(8, 2, qkv_bias=True, window=4, causal=True,
                                                                              rope_theta=1e4))
    switches = zoo.block_switches(qwen2)
    assert (switches["bias"], switches["window"], switches["rope_theta"]) == ("qkv", 4, 1e4)
    assert tuple(switches) == zoo.SWITCHES
    scaled = TransformerBlock(8, 2)
    scaled.attention.scale = 0.25
    assert zoo.block_switches(scaled)["scale"] == 0.25
    # the rows are named as the constructor's arguments, so a reader can type them
    # (scale and logit_softcap: the attribute of the attention, the argument of GemmaAttention)
    assert set(zoo.SWITCHES) <= set(ch09.constructor_arguments()) | {"scale", "logit_softcap"}
    with pytest.raises(TypeError, match="block"):
        zoo.block_switches(torch.nn.Linear(2, 2))
