"""The block zoo: every row's Hugging Face layer reproduced by reference.from_hf, with the model's own masks."""

from __future__ import annotations


import pytest
from torch import nn

from conftest import made_with, mutated
from d2lmini import reference
from d2lmini.chapters import zoo
from d2lmini.reference import HF_CONVERTERS, compare_with_reference, from_hf

pytest.importorskip("transformers")

TOLERANCE = 1e-5  # max |Δ| in float32
ROWS = {row.name: row for row in zoo.ZOO}


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("name", list(ROWS))
def test_row_reproduces_its_layer(name, padded):
    result = compare_with_reference(ROWS[name].reference(), batch_size=2, num_steps=16, seed=0, padded=padded)
    assert result["max_abs_output"] > 0.5  # a real signal, not zeros compared with zeros
    assert result["max_abs_diff"] <= TOLERANCE
    assert result["max_abs_grad_diff"] <= TOLERANCE


def test_zoo_has_the_rows_and_every_supported_class():
    assert len(zoo.ZOO) == len(ROWS) == 33
    # Qwen3.5's two layer types, dense and MoE (a Gated DeltaNet has no zoo description), are checked in
    # tests/test_qwen3_5_layer.py, tests/test_qwen3_5_moe.py and in chapter 10's 2026 table instead; so
    # are GLM-5's layers (tests/test_glm5.py), Llama 4's four layer kinds (tests/test_llama4.py) and Gemma 4's
    # local and global layers (tests/test_gemma4.py).
    assert {row.layer_class for row in zoo.ZOO} == set(HF_CONVERTERS) - {
        "Qwen3_5DecoderLayer", "Qwen3_5MoeDecoderLayer", "GlmMoeDsaDecoderLayer", "Llama4TextDecoderLayer",
        "Gemma4TextDecoderLayer",
        "DeepseekV4DecoderLayer"}  # streams in, streams out: tests/test_deepseek_v4.py and chapter 10
    for row in zoo.ZOO:
        assert row.layer_class in HF_CONVERTERS[row.layer_class].__doc__  # its converter names the class
        assert 2017 <= row.year <= 2026 and row.family


def test_zoo_table_reads_its_columns_from_the_blocks():
    rows = {r["name"]: r for r in zoo.zoo_table(rows=[ROWS["Gemma 2 (local)"], ROWS["SmolLM3 (NoPE)"],
                                                       ROWS["Granite 3.0"], ROWS["OLMo"]])}
    gemma = rows["Gemma 2 (local)"]
    assert gemma["reproduced"] and gemma["max_abs_grad_diff"] <= TOLERANCE
    assert "window 5" in gemma["attention"] and "soft-cap 5" in gemma["attention"]
    assert gemma["placement"] == "sandwich" and gemma["ffn"].startswith("GeGLU")
    assert rows["SmolLM3 (NoPE)"]["positions"] == "none in the layer"
    assert rows["Granite 3.0"]["residual"] == "0.22" and "scale 0.0078" in rows["Granite 3.0"]["attention"]
    assert rows["OLMo"]["norm"].startswith("LayerNorm (no parameters)")
    with pytest.raises(TypeError, match="block"):
        zoo.describe(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="num_steps"):
        zoo.zoo_table(num_steps=1)


@pytest.mark.parametrize("name, layer_type, window", [
    ("Gemma 2 (local)", "sliding_attention", 5), ("Gemma 2 (global)", "full_attention", None),
    ("Gemma 3 (local)", "sliding_attention", 5), ("Gemma 3 (global)", "full_attention", None),
    ("OLMo 3 (sliding)", "sliding_attention", 5), ("OLMo 3 (full)", "full_attention", None),
    ("Ministral 8B (sliding)", "sliding_attention", 5), ("Ministral 8B (full)", "full_attention", None),
    ("gpt-oss (sliding)", "sliding_attention", 5), ("gpt-oss (full)", "full_attention", None), ("Mistral 7B", None, 5), ("StarCoder2", None, 5),
    ("Qwen2", "full_attention", None),
])
def test_layer_idx_selects_the_layer_type(name, layer_type, window):
    row = ROWS[name]
    layer, config = row.make(0)
    if layer_type is not None:
        assert config.layer_types[row.layer_idx] == layer_type
    assert from_hf(layer, config, row.layer_idx).attention.window == window


def test_gemma3_local_layers_use_the_local_rope_base():
    local, glob = ROWS["Gemma 3 (local)"], ROWS["Gemma 3 (global)"]
    layer, config = local.make(0)
    assert from_hf(layer, config, 0).attention.rope_theta == config.rope_parameters["sliding_attention"]["rope_theta"]
    layer, config = glob.make(0)
    assert from_hf(layer, config, 0).attention.rope_theta == config.rope_parameters["full_attention"]["rope_theta"]
    assert config.rope_parameters["full_attention"]["rope_theta"] != 10000.0


def _mutated(row, mutate):
    """``row``'s reference whose converted block is changed by ``mutate(block)``."""
    return mutated(row.reference(), mutate)


def _set_rope(theta):
    def mutate(block):
        block.attention.rope_theta = theta  # the rotary cache is keyed on it: no stale table
    return mutate


@pytest.mark.parametrize("name, mutate", [
    ("Llama 3", lambda block: block.ffn.W_2.weight.mul_(1.01)),  # a wrong weight
    ("Mistral 7B", lambda block: setattr(block.attention, "window", None)),  # the window forgotten
    ("Gemma 2 (local)", lambda block: setattr(block.attention, "window", 6)),  # window off by one
    ("OLMo 3 (sliding)", lambda block: setattr(block.attention, "window", 4)),
    ("Gemma 2 (global)", lambda block: setattr(block.attention, "logit_softcap", None)),  # no soft-cap
    ("Gemma 3 (local)", _set_rope(1_000_000.0)),  # the global layers' RoPE base on a local layer
    ("SmolLM3 (NoPE)", _set_rope(2_000_000.0)),  # RoPE on a NoPE layer
    ("Gemma 3 (global)", lambda block: block.addnorm1.norm_in.weight.sub_(1.0)),  # w instead of 1 + w
    ("Qwen2", lambda block: block.attention.W_k.bias.zero_()),  # the q/k/v biases dropped
])
def test_the_check_catches_a_wrong_block(name, mutate):
    result = compare_with_reference(_mutated(ROWS[name], mutate), seed=0)
    assert max(result["max_abs_diff"], result["max_abs_grad_diff"]) > 100 * TOLERANCE


def test_from_hf_rejects_unsupported_classes_listing_the_supported_ones():
    import transformers as tf

    with pytest.raises(TypeError, match="Linear.*supported.*LlamaDecoderLayer.*SmolLM3DecoderLayer"):
        from_hf(nn.Linear(4, 4), None)
    config = tf.LlamaConfig(**reference.TINY, num_hidden_layers=1)
    with pytest.raises(TypeError, match="LlamaMLP.*Gemma2DecoderLayer"):
        from_hf(tf.models.llama.modeling_llama.LlamaMLP(config), config)


def test_from_hf_checks_layer_idx():
    row = ROWS["Gemma 2 (local)"]
    layer, config = row.make(0)
    with pytest.raises(ValueError, match="layer_idx=1.*built with layer_idx=0"):
        from_hf(layer, config, 1)
    with pytest.raises(ValueError, match="layer_idx"):
        from_hf(layer, config, -1)
    with pytest.raises(TypeError, match="layer_idx"):
        from_hf(layer, config, 0.0)


@pytest.mark.parametrize("name, changes, match", [
    ("OLMo", dict(clip_qkv=8.0), "clip_qkv"),
    ("Qwen3", dict(use_sliding_window=True), "use_sliding_window"),
    ("Gemma 3 (global)", dict(attn_logit_softcapping=50.0), "soft-capping"),
    ("Gemma 2 (local)", dict(use_bidirectional_attention=True), "bidirectional"),
    ("Llama 3", dict(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}), "rope_type"),
    ("Llama 3", dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
    ("Llama 3", dict(hidden_act="gelu"), "activation"),
])
def test_unsupported_options_raise_value_error(name, changes, match):
    row = ROWS[name]
    layer, config = made_with(row, **changes)
    with pytest.raises(ValueError, match=match):
        from_hf(layer, config, row.layer_idx)


def test_references_share_the_zoo_rows():
    """REFERENCES' Hugging Face entries are the zoo's rows for the same classes (one place for each)."""
    for name in ("BertLayer", "GPT2Block", "LlamaDecoderLayer", "Qwen3DecoderLayer", "Olmo2DecoderLayer"):
        row = next(row for row in zoo.ZOO if row.layer_class == name)
        assert row.make is reference.REFERENCES[name].make and row.call is reference.REFERENCES[name].call


def test_the_zoo_page_names_the_converted_classes_without_a_row():
    # The zoo's first cell says which classes from_hf converts but its last table leaves to
    # the 2026 table's own checks; the list must stay what the code does.
    without_row = set(HF_CONVERTERS) - {row.layer_class for row in zoo.ZOO}
    assert without_row == {"DeepseekV4DecoderLayer", "Gemma4TextDecoderLayer", "GlmMoeDsaDecoderLayer",
                           "Llama4TextDecoderLayer", "Qwen3_5DecoderLayer", "Qwen3_5MoeDecoderLayer"}
