"""gpt-oss's mixture of experts: reference.gpt_oss.ClampedSwiGLU experts and MixtureOfExperts(router_bias=True).

Checked against Hugging Face ``GptOssMLP`` (``GptOssTopKRouter`` + ``GptOssExperts``, eager
experts) on a tiny random config, float32, with inputs large enough that the clamps of
the SwiGLU engage (counted below); outputs and input gradients to 1e-5.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch.nn import functional as F

from d2lmini import FeedForward, MixtureOfExperts, TransformerBlock
from d2lmini.chapters.ch07_ffn import ffn_as_memories
from d2lmini.ffn import ACTS, default_ffn_num_hiddens
from d2lmini.reference import copy_gptoss_experts, randomize_
from d2lmini.reference.base import copy_linear
from d2lmini.reference.gpt_oss import SWIGLU_CLAMPED_ALPHA, SWIGLU_CLAMPED_LIMIT, ClampedSwiGLU

GPT_OSS = dict(alpha=SWIGLU_CLAMPED_ALPHA)  # ClampedSwiGLU's gpt-oss form: the slope and the + 1

D, E, K, H_FFN = 64, 4, 2, 32


# --------------------------------------------------------------------------- ClampedSwiGLU(alpha=1.702)


def _clamped_ffn(limit=SWIGLU_CLAMPED_LIMIT, seed=0):
    torch.manual_seed(seed)
    return randomize_(ClampedSwiGLU(16, 24, bias=True, swiglu_limit=limit, **GPT_OSS), seed)


def test_swiglu_clamped_is_the_gpt_oss_formula():
    ffn = _clamped_ffn(limit=1.5)
    X = 4 * torch.randn(3, 5, 16)
    g = (X @ ffn.W_g.weight.T + ffn.W_g.bias).clamp(max=1.5)
    u = (X @ ffn.W_1.weight.T + ffn.W_1.bias).clamp(-1.5, 1.5)
    expected = (g * torch.sigmoid(1.702 * g) * (u + 1)) @ ffn.W_2.weight.T + ffn.W_2.bias
    torch.testing.assert_close(ffn(X), expected, atol=1e-6, rtol=1e-6)


def test_swiglu_clamped_defaults_and_constants():
    assert "swiglu_clamped" not in ACTS  # a released model's: d2lmini.reference.gpt_oss
    assert SWIGLU_CLAMPED_ALPHA == 1.702 and SWIGLU_CLAMPED_LIMIT == 7.0
    ffn = ClampedSwiGLU(48, **GPT_OSS)
    assert ffn.swiglu_limit == 7.0 and ffn.gated and ffn.act == "swiglu_clamped"
    assert ffn.ffn_num_hiddens == default_ffn_num_hiddens(48, "swiglu") == 128
    assert "swiglu_limit=7.0" in repr(ffn)
    assert ClampedSwiGLU(48).act == "swiglu"  # DeepSeek-V4's form
    assert not hasattr(FeedForward(48, act="swiglu"), "swiglu_limit")


def test_without_clamps_the_plus_one_is_the_only_difference_from_a_slope_1702_swish():
    """Inside the limits (small inputs) it is W_2(swish_1.702(W_g x) * (W_1 x + 1))."""
    ffn = _clamped_ffn(limit=1e6)
    X = torch.randn(4, 16)
    G, U = ffn.W_g(X), ffn.W_1(X)
    torch.testing.assert_close(ffn(X), ffn.W_2(G * torch.sigmoid(1.702 * G) * (U + 1)))


def test_the_limit_changes_the_output():
    X = 10 * torch.randn(4, 16)
    assert (_clamped_ffn(limit=7.0)(X) - _clamped_ffn(limit=0.5)(X)).abs().max() > 1e-2
    swiglu = FeedForward(16, 24, act="swiglu", bias=True)
    swiglu.load_state_dict(_clamped_ffn().state_dict())
    assert (swiglu(X) - _clamped_ffn()(X)).abs().max() > 1e-2


def test_existing_gated_acts_are_unchanged():
    torch.manual_seed(0)
    ffn = FeedForward(16, 24, act="swiglu", bias=True)
    X = torch.randn(4, 16)
    assert torch.equal(ffn(X), ffn.W_2(F.silu(ffn.W_g(X)) * ffn.W_1(X)))


@pytest.mark.parametrize("limit, error", [(0.0, ValueError), (-1.0, ValueError), (float("inf"), ValueError),
                                          ("7", TypeError), (True, TypeError)])
def test_bad_swiglu_limit_is_rejected(limit, error):
    with pytest.raises(error, match="swiglu_limit"):
        ClampedSwiGLU(16, swiglu_limit=limit, **GPT_OSS)


@pytest.mark.parametrize("act", ["geglu", "gelu"])
def test_a_clamp_on_another_act_is_rejected(act):
    with pytest.raises(ValueError, match="act must be 'swiglu'"):
        ClampedSwiGLU(16, act=act)
    with pytest.raises(ValueError, match="act must be 'swiglu'"):
        MixtureOfExperts(16, 4, act=act, expert=ClampedSwiGLU)
    for name in ("swiglu_limit", "swiglu_clamped"):  # the chapters' FFN takes neither
        with pytest.raises((TypeError, ValueError), match=name):
            FeedForward(16, **({"swiglu_limit": 7.0} if name == "swiglu_limit" else {"act": name}))


def test_block_takes_the_clamped_ffn_and_chapter_seven_refuses_its_memories():
    block = TransformerBlock(32, 4, ffn_factory=lambda: ClampedSwiGLU(32, **GPT_OSS))
    assert block.ffn.swiglu_limit == 7.0
    assert block(torch.randn(1, 3, 32)).shape == (1, 3, 32)
    with pytest.raises(ValueError, match="ClampedSwiGLU"):
        ffn_as_memories(block.ffn, torch.randn(3, 32))


# --------------------------------------------------------------------------- router bias


def test_router_bias_adds_a_bias_and_changes_the_routing():
    torch.manual_seed(0)
    plain = MixtureOfExperts(16, 4)
    assert plain.router.bias is None
    torch.manual_seed(0)
    biased = MixtureOfExperts(16, 4, router_bias=True)
    assert biased.router.bias.shape == (4,)
    with torch.no_grad():
        biased.router.weight.copy_(plain.router.weight)
        biased.router.bias.copy_(torch.tensor([5.0, -5.0, 0.0, 0.0]))
        for a, b in zip(biased.experts, plain.experts):
            b_state = b.state_dict()
            a.load_state_dict(b_state)
    X = torch.randn(20, 16)
    assert (biased.route(X)[1] == 0).any(dim=-1).all()  # expert 0 always chosen
    assert (biased(X) - plain(X)).abs().max() > 1e-3
    assert biased.num_active_parameters() == plain.num_active_parameters() + 4


def test_router_bias_must_be_a_bool():
    with pytest.raises(TypeError, match="router_bias"):
        MixtureOfExperts(16, 4, router_bias=1)


def test_defaults_build_the_same_moe_as_before():
    torch.manual_seed(0)
    a = MixtureOfExperts(16, 4)
    torch.manual_seed(0)
    b = MixtureOfExperts(16, 4, router_bias=False, expert=FeedForward)
    X = torch.randn(5, 16)
    assert torch.equal(a(X), b(X))


# --------------------------------------------------------------------------- against GptOssMLP


def _gptoss(seed=0, limit=7.0):
    tf = pytest.importorskip("transformers")
    config = tf.GptOssConfig(hidden_size=D, intermediate_size=H_FFN, num_local_experts=E, num_experts_per_tok=K,
                             swiglu_limit=limit, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                             head_dim=16)
    config._experts_implementation = "eager"
    torch.manual_seed(seed)
    mlp = randomize_(tf.models.gpt_oss.modeling_gpt_oss.GptOssMLP(config), seed).eval()
    with torch.no_grad():  # clamped hidden units reach (7 + 1) * 7: keep the outputs O(1), so 1e-5 is tight
        mlp.experts.down_proj.mul_(0.1)
    moe = MixtureOfExperts(D, E, top_k=K, ffn_num_hiddens=H_FFN, bias=True, router_bias=True,
                           expert=partial(ClampedSwiGLU, swiglu_limit=limit, **GPT_OSS)).eval()
    copy_linear(moe.router, mlp.router.weight, mlp.router.bias)
    copy_gptoss_experts(moe.experts, mlp.experts)
    return mlp, moe


def _inputs(seed, scale=3.0):
    gen = torch.Generator().manual_seed(seed + 1)
    return scale * torch.randn(2, 9, D, generator=gen), torch.randn(2, 9, D, generator=gen)


def _differences(mlp, moe, X, R):
    outputs, grads = [], []
    for run in (lambda Z: mlp(Z)[0], moe):
        Z = X.clone().requires_grad_(True)
        Y = run(Z)
        (Y * R).sum().backward()
        outputs.append(Y.detach())
        grads.append(Z.grad)
    return (float((outputs[0] - outputs[1]).abs().max()), float((grads[0] - grads[1]).abs().max()),
            float(outputs[0].abs().max()))


def _clamp_counts(mlp, moe, X):
    """How many gate entries exceed the limit, and up entries leave [-limit, limit], over the routed tokens."""
    tokens = X.reshape(-1, D)
    _, experts = moe.route(tokens)
    above = outside = 0
    for e, ffn in enumerate(moe.experts):
        chosen = tokens[(experts == e).any(-1)]
        limit = mlp.experts.limit
        above += int((ffn.W_g(chosen) > limit).sum())
        outside += int((ffn.W_1(chosen).abs() > limit).sum())
    return above, outside


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_moe_equals_gpt_oss_mlp_with_the_clamps_engaged(seed):
    mlp, moe = _gptoss(seed)
    X, R = _inputs(seed)
    above, outside = _clamp_counts(mlp, moe, X)
    assert above > 0 and outside > 0, (above, outside)  # both clamps act on this batch
    out_diff, grad_diff, scale = _differences(mlp, moe, X, R)
    assert scale > 0.5
    assert out_diff <= 1e-5 and grad_diff <= 1e-5, (out_diff, grad_diff)


def test_gpt_oss_router_weights_are_the_softmax_routers_renormalized_top_k():
    """softmax over the k selected logits == softmax over all, restricted to the top k, renormalized."""
    mlp, moe = _gptoss(0)
    tokens = _inputs(0)[0].reshape(-1, D)
    _, scores, indices = mlp.router(tokens)
    weights, experts = moe.route(tokens)
    assert torch.equal(experts, indices)
    torch.testing.assert_close(weights, scores, atol=1e-6, rtol=1e-6)


def test_a_smaller_limit_on_both_sides_still_matches():
    mlp, moe = _gptoss(3, limit=1.0)
    out_diff, grad_diff, _ = _differences(mlp, moe, *_inputs(3, scale=1.0))
    assert out_diff <= 1e-5 and grad_diff <= 1e-5


def test_copy_gptoss_experts_rejects_mismatched_experts():
    mlp, _ = _gptoss(0)
    with pytest.raises(ValueError, match="experts"):
        copy_gptoss_experts(MixtureOfExperts(D, 3, bias=True, expert=partial(ClampedSwiGLU, **GPT_OSS)).experts,
                            mlp.experts)
    with pytest.raises(ValueError, match="swiglu_clamped"):
        copy_gptoss_experts(MixtureOfExperts(D, E, ffn_num_hiddens=H_FFN, bias=True).experts, mlp.experts)
    with pytest.raises(ValueError, match="swiglu_limit=7.0"):
        other = MixtureOfExperts(D, E, ffn_num_hiddens=H_FFN, bias=True,
                                 expert=partial(ClampedSwiGLU, swiglu_limit=3.0, **GPT_OSS))
        copy_gptoss_experts(other.experts, mlp.experts)
    with pytest.raises(ValueError, match="bias mismatch"):
        unbiased = MixtureOfExperts(D, E, ffn_num_hiddens=H_FFN, expert=partial(ClampedSwiGLU, **GPT_OSS))
        copy_gptoss_experts(unbiased.experts, mlp.experts)
