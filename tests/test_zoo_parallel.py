"""The zoo's parallel and partial-RoPE rows: Phi-2, Phi-3, Phi-4-mini, GPT-NeoX, GPT-J, Falcon, Command R, StableLM 2.

Each row's layer is converted by ``reference.from_hf`` and run with its model's own masks
and rotary tables (``tests/test_zoo.py`` checks every row at seed 0, padded and unpadded;
here: another seed, the variants that are not rows -- Falcon-40B, StableLM 2 12B's parallel
residual, GPT-NeoX's sequential residual, ... --, the columns ``describe`` reads, the
options the converters refuse, and mutations the check must catch: the interleaved-RoPE
permutation skipped, partial RoPE made full, the shared norm split in two).
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from conftest import made_with, mutated
from d2lmini import TransformerBlock, reference
from d2lmini.chapters import zoo
from d2lmini.attention import apply_rotary, rotary_cos_sin
from d2lmini.reference import compare_with_reference, from_hf, rope_interleaved_to_half

tf = pytest.importorskip("transformers")

TOLERANCE = 1e-5
NAMES = ("Phi-2", "Phi-3 mini", "Phi-4-mini", "GPT-NeoX", "GPT-J", "Falcon-7B", "Command R", "StableLM 2")
ROWS = {row.name: row for row in zoo.ZOO}


def _close(result):
    return result["max_abs_output"] > 0.5 and max(result["max_abs_diff"], result["max_abs_grad_diff"]) <= TOLERANCE


@pytest.mark.parametrize("name", NAMES)
def test_rows_reproduce_at_another_seed(name):
    result = compare_with_reference(ROWS[name].reference(), seed=1, padded=True)
    assert _close(result), result


# --------------------------------------------------------------------------- variants that are not rows


def _variant(name, model_type, layer_class, config_class, kwargs, *, rotary=True, falcon=False,
             attn_implementation="sdpa"):
    return zoo.hf_row(name, name, 2024, model_type, layer_class, config_class, kwargs,
                      attn_implementation=attn_implementation, rotary=rotary,
                      call_kwargs={"alibi": None} if falcon else None)


_FALCON = dict(hidden_size=64, num_attention_heads=4, alibi=False, ffn_hidden_size=160, num_hidden_layers=1)
VARIANTS = {
    "Falcon-40B (new_decoder_architecture, ln_attn + ln_mlp)": (
        _variant("Falcon-40B", "falcon", "FalconDecoderLayer", "FalconConfig",
                 dict(_FALCON, new_decoder_architecture=True, num_kv_heads=2), falcon=True), "parallel_two_norms"),
    "Falcon, new architecture with one norm": (
        _variant("Falcon-1ln", "falcon", "FalconDecoderLayer", "FalconConfig",
                 dict(_FALCON, new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=1,
                      bias=True), falcon=True), "parallel"),
    "Falcon, sequential multi-head (parallel_attn=False)": (
        _variant("Falcon-seq", "falcon", "FalconDecoderLayer", "FalconConfig",
                 dict(_FALCON, multi_query=False, parallel_attn=False, bias=True), falcon=True), "pre"),
    "StableLM 2 12B without qk_layernorm (parallel)": (
        _variant("StableLM par", "stablelm", "StableLmDecoderLayer", "StableLmConfig",
                 dict(**reference.TINY, num_hidden_layers=1, use_parallel_residual=True)), "parallel"),
    "GPT-NeoX sequential, no attention bias": (
        _variant("NeoX seq", "gpt_neox", "GPTNeoXLayer", "GPTNeoXConfig",
                 dict(hidden_size=64, num_attention_heads=4, intermediate_size=160, num_hidden_layers=1,
                      use_parallel_residual=False, attention_bias=False, rotary_pct=0.5),
                 rotary="GPTNeoXRotaryEmbedding"), "pre"),
    "Command R with attention biases": (
        _variant("Cohere b", "cohere", "CohereDecoderLayer", "CohereConfig",
                 dict(**reference.TINY, num_hidden_layers=1, attention_bias=True)), "parallel"),
}


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_variants_reproduce_their_layers(name, padded):
    row, placement = VARIANTS[name]
    result = compare_with_reference(row.reference(), seed=2, padded=padded)
    assert result["block"].placement == placement
    assert _close(result), result


def test_variant_biases_follow_the_layer():
    neox = compare_with_reference(VARIANTS["GPT-NeoX sequential, no attention bias"][0].reference())["block"]
    assert zoo.describe(neox)["bias"] == "FFN"  # GPTNeoXMLP always has biases
    falcon = compare_with_reference(VARIANTS["Falcon-40B (new_decoder_architecture, ln_attn + ln_mlp)"][0]
                                    .reference())["block"]
    assert falcon.attention.num_kv_heads == 2 and zoo.describe(falcon)["bias"] == "none"


# --------------------------------------------------------------------------- describe


def test_describe_reads_parallel_placements_partial_rope_and_biases():
    table = {r["name"]: r for r in zoo.zoo_table(rows=[ROWS[name] for name in NAMES])}
    assert all(r["reproduced"] for r in table.values())
    assert table["Phi-2"]["placement"] == "parallel"
    assert table["GPT-NeoX"]["placement"] == "parallel, two norms"
    assert table["StableLM 2"]["placement"] == "pre"
    assert table["Phi-2"]["positions"].endswith("on 8/16 = 50% of each head")
    assert table["GPT-NeoX"]["positions"].endswith("= 25% of each head")
    assert table["GPT-J"]["positions"].endswith("= 25% of each head")
    assert table["Phi-4-mini"]["positions"].endswith("= 75% of each head")
    assert table["Phi-3 mini"]["positions"] == "RoPE, base 10000" and "window 5" in table["Phi-3 mini"]["attention"]
    assert table["Falcon-7B"]["attention"].startswith("MQA 4/1 heads")
    assert table["Command R"]["norm"].startswith("LayerNorm (no bias)")
    assert table["GPT-J"]["bias"] == "FFN" and table["Command R"]["bias"] == "none"
    assert table["StableLM 2"]["bias"] == "q, k, v" and table["Phi-2"]["bias"] == "all"
    assert table["GPT-J"]["ffn"].startswith("GELU (tanh)") and table["Command R"]["ffn"].startswith("SwiGLU")


# --------------------------------------------------------------------------- mutations the check catches


def _mutated(row, mutate):
    """``row``'s reference whose converted block is changed by ``mutate(block)``."""
    return mutated(row.reference(), mutate)


def _caught(reference_):
    result = compare_with_reference(reference_, seed=0)
    return max(result["max_abs_diff"], result["max_abs_grad_diff"]) > 100 * TOLERANCE


def partial_rope(attention):
    """``rope_scaling`` for the partial RoPE of ``attention`` (``None``: every feature turns)."""
    if attention.rotary_dim is None:
        return None
    return {"rope_type": "default", "partial_rotary_factor": attention.rotary_dim / attention.head_dim}


def _full_rope(block):
    block.attention.rotary_dim = None  # the rotary cache is keyed on it: no stale table


def _two_norms(block):
    """Give the FFN a norm of its own, with different gains (the shared norm split in two)."""
    own = copy.deepcopy(block.addnorm1.norm_in)
    own.weight.mul_(1.2)
    block.addnorm2.norm_in = own


def _one_norm(block):
    block.addnorm2.norm_in = block.addnorm1.norm_in


@pytest.mark.parametrize("name", ["Phi-2", "Phi-4-mini", "GPT-NeoX", "GPT-J", "StableLM 2"])
def test_partial_rope_made_full_is_caught(name):
    assert _caught(_mutated(ROWS[name], _full_rope))


@pytest.mark.parametrize("name", ["Phi-2", "GPT-J", "Falcon-7B", "Command R"])
def test_shared_norm_split_in_two_is_caught(name):
    assert _caught(_mutated(ROWS[name], _two_norms))


def test_two_norms_merged_into_one_is_caught():
    assert _caught(_mutated(ROWS["GPT-NeoX"], _one_norm))


@pytest.mark.parametrize("name", ["GPT-J", "Command R"])
def test_skipping_the_interleave_permutation_is_caught(name, monkeypatch):
    assert not _caught(ROWS[name].reference())
    # the converters' copy helper permutes through the name in its own module, d2lmini.reference.base
    monkeypatch.setattr(reference.base, "rope_interleaved_to_half", lambda weight, head_dim, rotary_dim=None: weight)
    assert _caught(ROWS[name].reference())


def test_phi3_window_forgotten_is_caught():
    assert _caught(_mutated(ROWS["Phi-3 mini"], lambda block: setattr(block.attention, "window", None)))


@pytest.mark.parametrize("name", ["GPT-NeoX", "Phi-2", "Falcon-7B"])
def test_the_reference_layers_are_really_parallel(name):
    """The converted weights in a sequential pre-norm block do not reproduce the layer."""
    ref = ROWS[name].reference()
    convert = ref.convert

    def sequential(layer, config):
        block = convert(layer, config)
        pre = TransformerBlock(block.num_hiddens, block.attention.num_heads, norm=block.norm, placement="pre",
                               bias=block.attention.W_q.bias is not None, causal=True,
                               num_kv_heads=block.attention.num_kv_heads, ffn_num_hiddens=block.ffn.ffn_num_hiddens,
                               act=block.ffn.act, rope_theta=block.attention.rope_theta,
                               rope_scaling=partial_rope(block.attention), eps=block.addnorm1.norm_in.eps).eval()
        state = block.state_dict()
        for key in ("weight", "bias"):  # the shared norm, once per connection
            if f"addnorm1.norm_in.{key}" in state and f"addnorm2.norm_in.{key}" not in state:
                state[f"addnorm2.norm_in.{key}"] = state[f"addnorm1.norm_in.{key}"]
        pre.load_state_dict(state)
        return pre

    assert _caught(dataclasses.replace(ref, convert=sequential))


# --------------------------------------------------------------------------- the interleaved-to-half permutation


def test_rope_interleaved_to_half_moves_even_features_first_within_each_head():
    rows = torch.arange(2 * 6, dtype=torch.float32)  # two heads of 6 features, 4 of them rotated
    out = rope_interleaved_to_half(rows, head_dim=6, rotary_dim=4)
    assert out.tolist() == [0, 2, 1, 3, 4, 5, 6, 8, 7, 9, 10, 11]
    full = rope_interleaved_to_half(torch.arange(6.0)[:, None].expand(6, 3), head_dim=6)
    assert full[:, 0].tolist() == [0, 2, 4, 1, 3, 5] and full.shape == (6, 3)


def test_permuted_projections_give_the_interleaved_rotation_logits():
    """q.k with GPT-J's rotate_every_two equals q.k with half-split RoPE on the permuted rows."""
    torch.manual_seed(0)
    head_dim, r, n, d = 8, 6, 5, 12
    Wq, Wk, X = torch.randn(head_dim, d), torch.randn(head_dim, d), torch.randn(n, d)
    cos, sin = rotary_cos_sin(n, r, 10000.0)  # (n, r), each angle in both halves
    angles_cos, angles_sin = cos[:, : r // 2].repeat_interleave(2, -1), sin[:, : r // 2].repeat_interleave(2, -1)

    def interleaved(x):  # pairs (2l, 2l + 1), as transformers' GPT-J and Cohere
        rot, rest = x[..., :r], x[..., r:]
        turned = torch.stack((-rot[..., 1::2], rot[..., ::2]), dim=-1).flatten(-2)
        return torch.cat((rot * angles_cos + turned * angles_sin, rest), dim=-1)

    logits = interleaved(X @ Wq.T) @ interleaved(X @ Wk.T).T
    q = apply_rotary(X @ rope_interleaved_to_half(Wq, head_dim, r).T, cos, sin)
    k = apply_rotary(X @ rope_interleaved_to_half(Wk, head_dim, r).T, cos, sin)
    torch.testing.assert_close(q @ k.T, logits, atol=1e-5, rtol=1e-5)
    plain = apply_rotary(X @ Wq.T, cos, sin) @ apply_rotary(X @ Wk.T, cos, sin).T
    assert (plain - logits).abs().max() > 1e-2  # without the permutation: other logits


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(head_dim=6, rotary_dim=3), ValueError, "even"),
    (dict(head_dim=6, rotary_dim=8), ValueError, "rotary_dim"),
    (dict(head_dim=5, rotary_dim=4), ValueError, "multiple of head_dim"),
    (dict(head_dim=6.0), TypeError, "head_dim"),
])
def test_rope_interleaved_to_half_rejects_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        rope_interleaved_to_half(torch.zeros(12, 4), **kwargs)


# --------------------------------------------------------------------------- options refused


@pytest.mark.parametrize("name, changes, match", [
    ("Phi-2", dict(qk_layernorm=True), "qk_layernorm"),
    ("StableLM 2", dict(qk_layernorm=True), "qk_layernorm"),
    ("Command R", dict(use_qk_norm=True), "use_qk_norm"),
    ("Falcon-7B", dict(alibi=True), "alibi"),
    ("Phi-4-mini", dict(rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0}), "rope_type"),
    ("GPT-NeoX", dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0,
                                       "partial_rotary_factor": 0.25}), "rope_type"),
    ("Phi-2", dict(hidden_act="tanh"), "activation"),
])
def test_unsupported_options_raise_value_error(name, changes, match):
    layer, config = made_with(ROWS[name], **changes)
    with pytest.raises(ValueError, match=match):
        from_hf(layer, config)
