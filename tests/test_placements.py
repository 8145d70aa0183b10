"""The placement records (d2lmini.placements): the block, the figures and the tables read one entry per placement."""

from __future__ import annotations

import pytest

from d2lmini import AddNorm, TransformerBlock, plot
from d2lmini.block import PARALLEL_PLACEMENTS, PLACEMENTS, SEQUENTIAL_PLACEMENTS, SUBLAYER_NORM_PLACEMENTS
from d2lmini.placements import PLACEMENT_TABLE, placement_field, placements


@pytest.mark.parametrize("name", SEQUENTIAL_PLACEMENTS)
def test_add_norm_has_the_norms_its_record_names(name):
    record, add_norm = PLACEMENT_TABLE[name], AddNorm(8, name)
    assert (add_norm.norm_in is not None, add_norm.norm_out is not None, add_norm.norm_post is not None) == (
        record.norm_in, record.norm_out, record.norm_post)


def test_the_blocks_tuples_and_the_figures_dicts_are_read_from_the_records():
    assert PLACEMENTS == ("post", "pre", "post_sublayer", "sandwich", "parallel", "parallel_two_norms")
    assert SEQUENTIAL_PLACEMENTS + PARALLEL_PLACEMENTS == PLACEMENTS
    assert SUBLAYER_NORM_PLACEMENTS == ("post_sublayer", "sandwich")
    assert list(plot.PLACEMENT_COLORS) == ["post", "pre", "post_sublayer", "sandwich", "sandwich_scaled", "mhc"]
    assert plot.PLACEMENT_LABELS["sandwich"] == PLACEMENT_TABLE["sandwich"].label == "sandwich (Gemma 2/3)"
    assert plot.PLACEMENT_SHORT_LABELS == placement_field("short_label") and set(plot.PLACEMENT_SHORT_LABELS) == set(PLACEMENTS)
    assert set(plot.PLACEMENT_FORMULAS) == {"post", "pre", "post_sublayer", "sandwich", "sandwich_scaled"}
    for name in PLACEMENTS:
        TransformerBlock(8, 2, placement=name)  # every block placement builds
    with pytest.raises(TypeError, match="unknown attributes"):
        placements(colour="red")
    with pytest.raises(TypeError, match="not an attribute"):
        placement_field("colour")



@pytest.mark.parametrize("name", PLACEMENTS)
def test_the_language_model_ends_with_a_norm_unless_its_stream_is_normalized(name):
    # A placement's record decides the final norm: one entry, not a name compared somewhere.
    from d2lmini import LanguageModel

    model = LanguageModel(12, 1, 8, num_hiddens=8, num_heads=2, placement=name)
    assert (model.final_norm is not None) == PLACEMENT_TABLE[name].final_norm == (not PLACEMENT_TABLE[name].norm_post)


def test_chapter_4s_diagrams_draw_the_norms_each_record_names():
    import matplotlib.pyplot as plt

    from d2lmini.chapters.ch04_norm_placement import draw_placement_diagrams

    names = tuple(plot.PLACEMENT_FORMULAS)
    fig = draw_placement_diagrams(names)
    for ax, name in zip(fig.axes, names):
        boxes = sum(text.get_text().startswith("N") for text in ax.texts)
        record = PLACEMENT_TABLE[name]
        assert boxes == record.norm_in + record.norm_out + record.norm_post, name
    plt.close(fig)
