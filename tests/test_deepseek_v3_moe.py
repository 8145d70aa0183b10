"""Group-limited routing (moe.MixtureOfExperts num_groups/topk_groups) against Hugging Face DeepSeek-V3.

``reference.from_deepseek_v3_moe`` converts ``DeepseekV3MoE`` (transformers 5.24) into a
``MixtureOfExperts``; ``mla.from_deepseek_v3_layer`` uses it for the MoE layers, so a whole
DeepSeek-V3 (and Kimi K2) MoE layer -- MLA, routed and shared experts -- is reproduced.
"""

from __future__ import annotations

import pytest
import torch

from d2lmini import MixtureOfExperts
from d2lmini.reference import (TOLERANCE, Reference, compare_with_reference, from_deepseek_v3_layer,
                               from_deepseek_v3_moe, hf_call, hf_make, output_and_grad_differences, randomize_, tiny_config)

#: 8 experts in 4 groups of 2, a token's 2 experts from the best 2 groups; layer 1 is a MoE layer.
TINY = tiny_config("deepseek_v3")


def _make(layer_class: str, **overrides):
    pytest.importorskip("transformers")
    if layer_class == "DeepseekV3MoE":  # a sublayer: built without a layer index
        def make(seed):
            from transformers import DeepseekV3Config
            from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

            torch.manual_seed(seed)
            config = DeepseekV3Config(**dict(TINY, **overrides))
            config._experts_implementation = "eager"
            return randomize_(DeepseekV3MoE(config), seed).eval(), config
    else:
        make = hf_make("deepseek_v3", layer_class, "DeepseekV3Config", dict(TINY, **overrides), layer_idx=1)

    def seeded(seed):
        module, config = make(seed)
        gate = module.gate if hasattr(module, "gate") else module.mlp.gate
        with torch.no_grad():  # a selection bias large enough to change which groups win
            gate.e_score_correction_bias.copy_(torch.randn(8, generator=torch.Generator().manual_seed(seed)) * 0.3)
        return module, config
    return seeded


@pytest.mark.parametrize("groups", [(4, 2), (4, 1), (1, 1)], ids=["2 of 4 groups", "1 of 4", "no groups"])
def test_moe_matches_deepseek_v3_moe(groups):
    moe, config = _make("DeepseekV3MoE", n_group=groups[0], topk_group=groups[1])(0)
    ours = from_deepseek_v3_moe(moe, config).eval()
    assert (ours.num_groups, ours.topk_groups) == groups
    gen = torch.Generator().manual_seed(1)
    X, R = torch.randn(2, 16, 48, generator=gen), torch.randn(2, 16, 48, generator=gen)
    result = output_and_grad_differences([moe, ours], X, R, torch.ones(2, 16, 1, dtype=torch.bool))
    assert max(result["max_abs_diff"], result["max_abs_grad_diff"]) <= TOLERANCE, result
    assert result["max_abs_output"] > 0.1


def test_whole_moe_layer_matches_deepseek_v3_decoder_layer():
    call = hf_call("deepseek_v3", "DeepseekV3DecoderLayer", layer_idx=1, rotary="DeepseekV3RotaryEmbedding")
    ref = Reference("DeepseekV3DecoderLayer", "DeepSeek-V3 (MoE)", _make("DeepseekV3DecoderLayer"),
                    from_deepseek_v3_layer, call, causal=True)
    result = compare_with_reference(ref)
    assert max(result["max_abs_diff"], result["max_abs_grad_diff"]) <= TOLERANCE, result
    assert isinstance(result["block"].ffn, MixtureOfExperts)


def test_group_limit_changes_the_choice_and_defaults_are_unchanged():
    torch.manual_seed(0)
    free = MixtureOfExperts(16, 8, top_k=2, router="sigmoid")
    limited = MixtureOfExperts(16, 8, top_k=2, router="sigmoid", num_groups=4, topk_groups=1)
    one_group = MixtureOfExperts(16, 8, top_k=2, router="sigmoid", num_groups=4)  # topk_groups = all
    limited.load_state_dict(free.state_dict())
    one_group.load_state_dict(free.state_dict())
    X = torch.randn(64, 16)
    _, chosen = limited.route(X)
    assert (chosen // 2)[:, 0].eq((chosen // 2)[:, 1]).all()  # both experts from the one allowed group
    assert not torch.equal(limited(X), free(X))
    torch.testing.assert_close(one_group(X), free(X), rtol=0, atol=0)
    assert "num_groups" in repr(limited) and "num_groups" not in repr(free)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_groups=3), "num_groups must divide"),
    (dict(num_groups=4, topk_groups=5), "topk_groups must be <="),
    (dict(num_groups=4, topk_groups=1, top_k=3), "cannot come from"),
    (dict(num_groups=0), "num_groups"),
    (dict(num_groups=4, topk_groups=0), "topk_groups"),
])
def test_bad_groups_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MixtureOfExperts(16, 8, **{"top_k": 2, **kwargs})


def test_converter_refuses_unnormalized_weights():
    moe, config = _make("DeepseekV3MoE", norm_topk_prob=False)(0)
    with pytest.raises(ValueError, match="norm_topk_prob"):
        from_deepseek_v3_moe(moe, config)
