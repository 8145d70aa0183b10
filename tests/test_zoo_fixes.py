"""Regression tests for the zoo review: converters' layer_idx, dropout, BERT decoders, biases, describe's bias
column, the rotary cache, SmolLM3's windows, hf_call's mask, and the paths the review checked by hand."""

from __future__ import annotations

import pytest
import torch

from d2lmini import reference
from d2lmini.chapters import zoo
from d2lmini.attention import MultiHeadAttention
from d2lmini.reference import (
    TINY,
    TINY_CONFIGS,
    Reference,
    compare_with_reference,
    from_bert_layer,
    from_gpt2_block,
    from_gpt_oss_layer,
    from_hf,
    from_llama_layer,
    from_ministral_layer,
    from_qwen2_layer,
    from_smollm3_layer,
    hf_call,
    hf_make,
    hf_reference,
)

pytest.importorskip("transformers")

TOLERANCE = reference.TOLERANCE
_BERT = dict(hidden_size=64, num_attention_heads=4, intermediate_size=256)


def _reproduces(ref: Reference) -> dict:
    result = compare_with_reference(ref, batch_size=2, num_steps=16, seed=0, padded=True)
    assert result["max_abs_output"] > 0.5
    assert result["max_abs_diff"] <= TOLERANCE and result["max_abs_grad_diff"] <= TOLERANCE, result
    return result


# --------------------------------------------------------------------------- 1. layer_idx of converters called directly

_DIRECT = {  # converter, model_type, layer class, config class, config, layer_idx, attn implementation, expected
    "gpt-oss full layer": (from_gpt_oss_layer, "gpt_oss", "GptOssDecoderLayer", "GptOssConfig", TINY_CONFIGS["gpt_oss"], 1,
                           "eager", {"window": None}),
    "Qwen2 sliding layer": (from_qwen2_layer, "qwen2", "Qwen2DecoderLayer", "Qwen2Config",
                            dict(**TINY, num_hidden_layers=2, use_sliding_window=True, sliding_window=5,
                                 max_window_layers=1), 1, "sdpa", {"window": 5}),
    "Ministral sliding layer": (from_ministral_layer, "ministral", "MinistralDecoderLayer", "MinistralConfig",
                                dict(**TINY, num_hidden_layers=2, sliding_window=5, head_dim=16,
                                     layer_types=["full_attention", "sliding_attention"]), 1, "sdpa", {"window": 5}),
    "SmolLM3 NoPE layer": (from_smollm3_layer, "smollm3", "SmolLM3DecoderLayer", "SmolLM3Config",
                           dict(**TINY, num_hidden_layers=4), 3, "sdpa", {"rope_theta": None}),
}


@pytest.mark.parametrize("name", list(_DIRECT))
def test_a_converter_called_directly_converts_the_layers_own_type(name):
    convert, model_type, cls, config_cls, kwargs, idx, impl, expected = _DIRECT[name]
    make = hf_make(model_type, cls, config_cls, kwargs, layer_idx=idx, attn_implementation=impl)
    layer, config = make(0)
    block = convert(layer, config)  # no layer_idx: the layer's own
    for attribute, value in expected.items():
        assert getattr(block.attention, attribute) == value
    _reproduces(Reference(cls, name, make, lambda layer, config: convert(layer, config),
                          hf_call(model_type, cls, layer_idx=idx), True))
    with pytest.raises(ValueError, match=f"layer_idx=0, but this {cls} was built with layer_idx={idx}"):
        convert(layer, config, 0)
    assert convert(layer, config, idx).attention.window == block.attention.window
    assert from_hf(layer, config).attention.window == block.attention.window  # from_hf's default: the same


# --------------------------------------------------------------------------- 2. dropout in training mode

def _llama(**changes):
    return hf_make("llama", "LlamaDecoderLayer", "LlamaConfig", dict(**TINY, num_hidden_layers=1, **changes))(0)


@pytest.mark.parametrize("convert", [from_hf, from_llama_layer])
def test_a_training_layer_with_a_dropout_the_block_cannot_place_is_refused(convert):
    layer, config = _llama(attention_dropout=0.1)
    assert convert(layer, config).training is False  # eval: dropout does nothing, converted
    with pytest.raises(ValueError, match=r"training mode with config\.attention_dropout=0\.1.*layer\.eval\(\)"):
        convert(layer.train(), config)
    layer, config = _llama()  # attention_dropout=0: nothing to reproduce
    assert convert(layer.train(), config).training


@pytest.mark.parametrize("make, convert, attention, branch", [
    (hf_make("bert", "BertLayer", "BertConfig", _BERT), from_bert_layer,
     "attention_probs_dropout_prob", "hidden_dropout_prob"),
    (hf_make("gpt2", "GPT2Block", "GPT2Config", dict(n_embd=64, n_head=4)), from_gpt2_block, "attn_pdrop",
     "resid_pdrop"),
])
def test_bert_and_gpt2_dropouts_are_reproduced_when_equal(make, convert, attention, branch):
    layer, config = make(0)
    assert getattr(config, attention) == getattr(config, branch) == 0.1  # the defaults
    block = from_hf(layer.train(), config)
    assert block.training and block.attention.dropout == 0.1
    assert block.addnorm1.dropout.p == block.addnorm2.dropout.p == 0.1  # each branch output, as the layer
    assert block.ffn.dropout.p == 0.0  # the layer drops out no FFN hidden unit
    assert convert(layer.eval(), config).ffn.dropout.p == 0.0
    setattr(config, attention, 0.2)
    with pytest.raises(ValueError, match=attention):
        convert(layer.train(), config)


def test_eval_layers_with_dropouts_convert_and_reproduce():
    _reproduces(hf_reference("StarCoder2", "starcoder2", "Starcoder2DecoderLayer", "Starcoder2Config",
                             dict(**TINY, num_hidden_layers=1, residual_dropout=0.1, attention_dropout=0.1)))


# --------------------------------------------------------------------------- 3. BERT as a decoder

def test_bert_is_decoder_is_causal_and_cross_attention_is_refused():
    ref = hf_reference("BERT decoder", "bert", "BertLayer", "BertConfig", dict(_BERT, is_decoder=True))
    assert ref.convert(*ref.make(0)).attention.causal
    _reproduces(ref)
    layer, config = hf_make("bert", "BertLayer", "BertConfig", dict(_BERT, is_decoder=True,
                                                                     add_cross_attention=True))(0)
    with pytest.raises(ValueError, match="add_cross_attention"):
        from_hf(layer, config)


# --------------------------------------------------------------------------- 5. attention_bias and mlp_bias

_BIASES = {(True, False): "q, k, v, o", (False, True): "FFN", (True, True): "all"}


@pytest.mark.parametrize("attention_bias, mlp_bias", list(_BIASES))
@pytest.mark.parametrize("model_type, cls, config_cls, extra", [
    ("llama", "LlamaDecoderLayer", "LlamaConfig", {}),
    ("granite", "GraniteDecoderLayer", "GraniteConfig", {}),
    ("smollm3", "SmolLM3DecoderLayer", "SmolLM3Config", {}),
])
def test_every_combination_of_attention_and_mlp_biases(model_type, cls, config_cls, extra, attention_bias,
                                                       mlp_bias):
    ref = hf_reference(cls, model_type, cls, config_cls,
                       dict(**TINY, num_hidden_layers=1, attention_bias=attention_bias, mlp_bias=mlp_bias, **extra))
    _reproduces(ref)
    assert zoo.describe(ref.convert(*ref.make(0)))["bias"] == _BIASES[attention_bias, mlp_bias]


def test_attention_bias_on_a_family_without_mlp_biases():
    ref = hf_reference("OLMo 2", "olmo2", "Olmo2DecoderLayer", "Olmo2Config",
                       dict(**TINY, num_hidden_layers=1, attention_bias=True))
    _reproduces(ref)
    assert zoo.describe(ref.convert(*ref.make(0)))["bias"] == "q, k, v, o"


def test_a_bias_mismatch_names_the_projection():
    layer, config = _llama()
    config.mlp_bias = True  # the config says biases, the layer (built before) has none
    with pytest.raises(ValueError, match="bias mismatch in the FFN's W_1"):
        from_hf(layer, config)


# --------------------------------------------------------------------------- 7. describe's bias column for MoE

def test_describe_reports_router_and_expert_biases():
    ref = hf_reference("gpt-oss", "gpt_oss", "GptOssDecoderLayer", "GptOssConfig",
                       dict(TINY_CONFIGS["gpt_oss"], attention_bias=False), attn_implementation="eager")
    block = ref.convert(*ref.make(0))
    assert zoo.describe(block)["bias"] == "FFN, router"
    row = next(row for row in zoo.ZOO if row.name == "gpt-oss (sliding)")
    assert zoo.describe(row.reference().convert(*row.make(0)))["bias"] == "all"


def test_describe_rejects_foreign_sublayers():
    block = zoo.TransformerBlock(32, 4, attn_factory=lambda: torch.nn.MultiheadAttention(32, 4))
    with pytest.raises(TypeError, match="block.attention"):
        zoo.describe(block)


# --------------------------------------------------------------------------- 8. the rotary cache

@pytest.mark.parametrize("attribute, value, kwargs", [
    ("rope_theta", 500.0, {"rope_theta": 500.0}),
    ("rotary_dim", 8, {"rope_scaling": {"rope_type": "default", "partial_rotary_factor": 0.5}}),
    ("rope_scaling", {"rope_type": "linear", "factor": 4.0}, {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
])
def test_changing_rope_attributes_never_reuses_a_stale_table(attribute, value, kwargs):
    torch.manual_seed(0)
    att = MultiHeadAttention(32, 2, causal=True, rope_theta=10000.0).eval()
    X = torch.randn(2, 12, 32)
    before = att(X, X, X)
    setattr(att, attribute, value)
    fresh = MultiHeadAttention(32, 2, causal=True, **{"rope_theta": 10000.0, **kwargs}).eval()
    fresh.load_state_dict(att.state_dict())
    after = att(X, X, X)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, fresh(X, X, X), rtol=0, atol=0)


# --------------------------------------------------------------------------- SmolLM3 windows, hf_call's mask

def test_smollm3_windows_follow_layer_types_as_its_model_does():
    config = dict(**TINY, num_hidden_layers=2, use_sliding_window=False, sliding_window=5,
                  layer_types=["sliding_attention", "full_attention"])
    ref = hf_reference("SmolLM3", "smollm3", "SmolLM3DecoderLayer", "SmolLM3Config", config)
    assert ref.convert(*ref.make(0)).attention.window == 5
    _reproduces(ref)
    layer, config = ref.make(0)
    config.no_rope_layers = []
    with pytest.raises(ValueError, match="no_rope_layers"):
        from_hf(layer, config)


def test_hf_call_rejects_an_unknown_mask():
    with pytest.raises(ValueError, match="mask"):
        hf_call("llama", "LlamaDecoderLayer", mask="sliding_window")


# --------------------------------------------------------------------------- the review's hand-checked paths

_HAND_CHECKED = {
    "Qwen2 sliding layer": (dict(model_type="qwen2", layer_class="Qwen2DecoderLayer", config_class="Qwen2Config",
                                 config_kwargs=dict(**TINY, num_hidden_layers=2, use_sliding_window=True,
                                                    sliding_window=5, max_window_layers=1), layer_idx=1),
                            lambda block: block.attention.window == 5),
    "SmolLM3 NoPE layer with use_sliding_window": (
        dict(model_type="smollm3", layer_class="SmolLM3DecoderLayer", config_class="SmolLM3Config",
             config_kwargs=dict(**TINY, num_hidden_layers=4, use_sliding_window=True, sliding_window=5), layer_idx=3),
        lambda block: block.attention.window == 5 and block.attention.rope_theta is None),
    "AFMoE dense layer": (dict(model_type="afmoe", layer_class="AfmoeDecoderLayer", config_class="AfmoeConfig",
                               config_kwargs=dict(TINY_CONFIGS["afmoe"], num_dense_layers=1), layer_idx=0),
                          lambda block: type(block.ffn).__name__ == "FeedForward"),
    "OLMo 3 full layer, per-layer-type YaRN": (
        dict(model_type="olmo3", layer_class="Olmo3DecoderLayer", config_class="Olmo3Config",
             config_kwargs=dict(TINY_CONFIGS["olmo3"], max_position_embeddings=64, rope_parameters={
                 "full_attention": dict(rope_type="yarn", rope_theta=500000.0, factor=8.0,
                                        original_max_position_embeddings=8, beta_fast=32.0, beta_slow=1.0),
                 "sliding_attention": dict(rope_type="default", rope_theta=10000.0)}), layer_idx=3),
        lambda block: block.attention.window is None and block.attention.rope_scaling["rope_type"] == "yarn"),
    "Gemma 3 global layer, linear x8": (
        dict(model_type="gemma3", layer_class="Gemma3DecoderLayer", config_class="Gemma3TextConfig",
             config_kwargs=dict(TINY_CONFIGS["gemma3_sliding"], rope_parameters={
                 "full_attention": dict(rope_type="linear", factor=8.0, rope_theta=1_000_000.0),
                 "sliding_attention": dict(rope_type="default", rope_theta=10000.0)}),
             layer_idx=1, unit_offset_norms=True),
        lambda block: block.attention.rope_scaling == {"rope_type": "linear", "factor": 8.0}),
}


@pytest.mark.parametrize("name", list(_HAND_CHECKED))
def test_hand_checked_paths_reproduce_their_layers(name):
    kwargs, took_the_path = _HAND_CHECKED[name]
    kwargs = dict(kwargs)
    ref = hf_reference(name, kwargs.pop("model_type"), kwargs.pop("layer_class"), kwargs.pop("config_class"),
                       kwargs.pop("config_kwargs"), **kwargs)
    assert took_the_path(ref.convert(*ref.make(0)))
    _reproduces(ref)


# --------------------------------------------------------------------------- the zoo's order

def test_zoo_rows_are_in_release_year_order():
    years = [row.year for row in zoo.ZOO]
    assert years == sorted(years)
    assert years[0] == 2018 and years[-1] >= 2025
