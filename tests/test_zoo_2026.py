"""The zoo's 2025 rows (Ministral 3, Arcee Trinity local and global, gpt-oss), the RoPE reader and describe()."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import mutated
from d2lmini import MultiHeadAttention, TransformerBlock, reference
from d2lmini.chapters import zoo
from d2lmini.reference import TINY_CONFIGS, compare_with_reference, from_hf, hf_reference
from d2lmini.reference.base import rope_kwargs

pytest.importorskip("transformers")

TOLERANCE = 1e-5  # max |Δ| in float32
ROWS = {row.name: row for row in zoo.ZOO}


def _mutated(row, mutate):
    """``row``'s reference whose converted block is changed by ``mutate(block)``."""
    return mutated(row.reference(), mutate)


def _core(block):
    """The MultiHeadAttention of a block (inside a GatedAttention for Trinity)."""
    return getattr(block.attention, "attention", block.attention)


def _differs(ref) -> bool:
    result = compare_with_reference(ref, seed=0)
    return max(result["max_abs_diff"], result["max_abs_grad_diff"]) > 100 * TOLERANCE


# --------------------------------------------------------------------------- Ministral 3


def test_ministral3_row_has_yarn_and_query_scaling_that_varies_within_the_sequence():
    layer, config = ROWS["Ministral 3"].make(0)
    att = from_hf(layer, config, 0).attention
    assert att.rope_scaling["rope_type"] == "yarn" and att.rope_scaling["factor"] == 16.0
    assert "llama_4_scaling_beta" not in att.rope_scaling  # a query-scaling key, not a RoPE one
    assert att.query_scaling == (0.1, 4)  # period 4 < 16 steps: the factor changes within the test sequence
    assert att.window is None and config.sliding_window is None


@pytest.mark.parametrize("mutate", [lambda block: setattr(block.attention, "query_scaling", None),
                                    lambda block: setattr(block.attention, "rope_scaling", None)],
                         ids=["query scaling dropped", "YaRN dropped"])
def test_ministral3_check_catches_a_dropped_feature(mutate):
    assert _differs(_mutated(ROWS["Ministral 3"], mutate))


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
def test_ministral3_with_a_sliding_window(padded):
    ref = hf_reference("Ministral 3 (windowed)", "ministral3", "Ministral3DecoderLayer", "Ministral3Config",
                       dict(TINY_CONFIGS["ministral3"], sliding_window=5))
    result = compare_with_reference(ref, seed=0, padded=padded)
    assert result["block"].attention.window == 5
    assert max(result["max_abs_diff"], result["max_abs_grad_diff"]) <= TOLERANCE


def test_ministral3_without_its_query_scaling_keys_is_refused():
    layer, config = ROWS["Ministral 3"].make(0)
    config.rope_parameters = {k: v for k, v in config.rope_parameters.items() if k != "llama_4_scaling_beta"}
    with pytest.raises(ValueError, match="llama_4_scaling_beta"):
        from_hf(layer, config, 0)


# --------------------------------------------------------------------------- Arcee Trinity


@pytest.mark.parametrize("name, window, rope", [("Arcee Trinity (local)", 5, True),
                                                ("Arcee Trinity (global)", None, False)])
def test_trinity_layer_types(name, window, rope):
    row = ROWS[name]
    layer, config = row.make(0)
    att = _core(from_hf(layer, config, row.layer_idx))
    assert att.window == window and (att.rope_theta is not None) == rope


@pytest.mark.parametrize("name, mutate", [
    ("Arcee Trinity (local)", lambda block: setattr(_core(block), "window", None)),  # the window removed
    ("Arcee Trinity (local)", lambda block: setattr(_core(block), "rope_theta", None)),  # no RoPE
    ("Arcee Trinity (global)", lambda block: block.ffn.shared.W_2.weight.mul_(1.01)),  # a wrong weight
], ids=["window removed", "RoPE removed", "shared expert"])
def test_trinity_check_catches_a_wrong_block(name, mutate):
    assert _differs(_mutated(ROWS[name], mutate))


def test_compare_with_trinity_is_unchanged():
    result = zoo.compare_with_trinity()
    assert result["max_abs_diff"] <= TOLERANCE and result["max_abs_grad_diff"] <= TOLERANCE
    assert abs(result["max_abs_output"] - 7.174245357513428) < 1e-6  # the chapter's numbers do not move


# --------------------------------------------------------------------------- gpt-oss


def _set_limit(limit):
    def mutate(block):
        for expert in block.ffn.experts:
            expert.swiglu_limit = limit
    return mutate


def test_gpt_oss_row_is_a_sliding_layer_with_sinks_yarn_biases_and_the_moe():
    layer, config = ROWS["gpt-oss (sliding)"].make(0)
    assert config.layer_types[0] == "sliding_attention" and config._attn_implementation == "eager"
    block = from_hf(layer, config, 0)
    att = block.attention
    assert att.window == 5 and att.sinks is not None and att.W_o.bias is not None
    assert att.rope_scaling == {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                                "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
    assert block.ffn.router.bias is not None and block.ffn.shared is None
    assert {expert.act for expert in block.ffn.experts} == {"swiglu_clamped"}


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
def test_gpt_oss_full_attention_layer(padded):
    ref = hf_reference("gpt-oss (full)", "gpt_oss", "GptOssDecoderLayer", "GptOssConfig", TINY_CONFIGS["gpt_oss"],
                       layer_idx=1, attn_implementation="eager")
    result = compare_with_reference(ref, seed=0, padded=padded)
    assert result["block"].attention.window is None
    assert max(result["max_abs_diff"], result["max_abs_grad_diff"]) <= TOLERANCE


@pytest.mark.parametrize("mutate", [
    lambda block: block.attention.sinks.zero_(),
    lambda block: setattr(block.attention, "rope_scaling", None),
    lambda block: setattr(block.attention, "window", None),
    lambda block: block.ffn.router.bias.zero_(),
    _set_limit(7.0),
], ids=["sinks zeroed", "YaRN dropped", "window removed", "router bias zeroed", "clamp limit 7"])
def test_gpt_oss_check_catches_a_wrong_block(mutate):
    assert _differs(_mutated(ROWS["gpt-oss (sliding)"], mutate))


def test_gpt_oss_other_swiglu_alpha_is_refused():
    layer, config = ROWS["gpt-oss (sliding)"].make(0)
    layer.mlp.experts.alpha = 1.0
    with pytest.raises(ValueError, match="swiglu_alpha"):
        from_hf(layer, config, 0)


# --------------------------------------------------------------------------- the RoPE reader


@pytest.mark.parametrize("name, rope_parameters", [
    ("Llama 3", {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8}),
    ("Llama 3", {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
    ("Mistral 7B", {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "original_max_position_embeddings": 8,
                    "truncate": False}),
    ("Mistral 7B", {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "original_max_position_embeddings": 8,
                    "mscale": 0.7}),  # mscale alone: transformers ignores it
])
def test_scaled_rope_of_llama_family_rows_is_reproduced(name, rope_parameters):
    row = ROWS[name]
    make = row.make

    def scaled(seed):
        layer, config = make(seed)
        config.rope_parameters = dict(rope_parameters)
        return layer, config

    ref = dataclasses.replace(row.reference(), make=scaled)
    result = compare_with_reference(ref, seed=0)
    assert result["block"].attention.rope_scaling["rope_type"] == rope_parameters["rope_type"]
    assert max(result["max_abs_diff"], result["max_abs_grad_diff"]) <= TOLERANCE


def test_rope_kwargs_reads_every_form_of_the_config():
    import transformers as tf

    plain = tf.LlamaConfig(**reference.TINY, rope_theta=1234.0)
    assert rope_kwargs(plain) == {"rope_theta": 1234.0, "rope_scaling": None}
    partial = tf.PhiConfig(hidden_size=64, num_attention_heads=4, partial_rotary_factor=0.5)
    assert rope_kwargs(partial, partial=True)["rope_scaling"] == {"rope_type": "default",
                                                                  "partial_rotary_factor": 0.5}
    assert MultiHeadAttention(64, 4, **rope_kwargs(partial, partial=True)).rotary_dim == 8
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        rope_kwargs(partial)
    yarn = tf.LlamaConfig(**reference.TINY, max_position_embeddings=64,
                          rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": None,
                                           "original_max_position_embeddings": 16})
    assert rope_kwargs(yarn)["rope_scaling"] == {"rope_type": "yarn", "factor": 4.0,
                                                  "original_max_position_embeddings": 16}
    for rope_type in ("dynamic", "longrope"):
        config = tf.LlamaConfig(**reference.TINY)
        config.rope_parameters = {"rope_type": rope_type, "rope_theta": 1e4, "factor": 2.0}
        with pytest.raises(ValueError, match="rope_type"):
            rope_kwargs(config)


# --------------------------------------------------------------------------- describe()


def test_describe_reads_the_new_features_from_the_modules():
    rows = {r["name"]: r for r in zoo.zoo_table(rows=[ROWS["Ministral 3"], ROWS["Arcee Trinity (local)"],
                                                       ROWS["Arcee Trinity (global)"], ROWS["gpt-oss (sliding)"]])}
    assert all(r["reproduced"] for r in rows.values())
    m3 = rows["Ministral 3"]
    assert "query scaling 1 + 0.1 log(1 + floor(p / 4))" in m3["attention"]
    assert m3["positions"] == "RoPE, base 1e+06, yarn scaling x16"
    local, glob = rows["Arcee Trinity (local)"], rows["Arcee Trinity (global)"]
    assert "sigmoid output gate" in local["attention"] and "window 5" in local["attention"]
    assert glob["positions"] == "none in the layer" and local["positions"].startswith("RoPE")
    assert glob["ffn"] == "MoE: 8 SwiGLU experts of 32 hidden, top-2, 1 shared, sigmoid router"
    gpt_oss = rows["gpt-oss (sliding)"]
    assert gpt_oss["attention"].endswith("window 5, sinks") and gpt_oss["bias"] == "all"
    assert gpt_oss["positions"] == "RoPE, base 150000, yarn scaling x32"
    assert gpt_oss["ffn"] == "MoE: 4 SwiGLU (clamped) experts of 160 hidden, top-2, softmax router with bias"
    block = TransformerBlock(32, 4, rope_theta=100.0, sinks=True, causal=True,
                             rope_scaling={"rope_type": "default", "partial_rotary_factor": 0.5})
    described = zoo.describe(block)
    assert described["positions"] == "RoPE, base 100, on 4/8 = 50% of each head"
    assert described["attention"].endswith("sinks")
