"""The small functions chapter 10 prints: the copied-heads check, the dense mixture, the
decoder block's two effects and the output/gradient comparison."""

from __future__ import annotations

import torch

from d2lmini import MixtureOfExperts, MultiHeadAttention, TransformerDecoderBlock
from d2lmini.chapters.ch10_the_2026_block import copied_heads_difference, decoder_effects, dense_mixture
from d2lmini.reference import output_and_grad_differences


def test_gqa_equals_multi_head_attention_with_copied_heads():
    torch.manual_seed(0)
    X = torch.randn(2, 5, 32)
    for g in (4, 2, 1):
        assert copied_heads_difference(MultiHeadAttention(32, 4, num_kv_heads=g, causal=True), X) < 1e-5


def test_dense_mixture_matches_the_sparse_forward():
    torch.manual_seed(0)
    for router, shared in (("softmax", 0), ("sigmoid", 1)):
        moe = MixtureOfExperts(16, 4, top_k=2, router=router, num_shared_experts=shared)
        tokens = torch.randn(12, 16)
        with torch.no_grad():
            torch.testing.assert_close(dense_mixture(moe, tokens), moe(tokens))


def test_decoder_effects_see_the_mask_and_the_memory():
    torch.manual_seed(0)
    block = TransformerDecoderBlock(16, 2, norm="layer", act="relu", placement="post", bias=True).eval()
    effects = decoder_effects(block, torch.randn(1, 6, 16), torch.randn(1, 4, 16), t=3)
    assert effects["output_shape"] == (1, 6, 16)
    assert effects["future_leak"] == 0.0
    assert effects["future_effect"] > 0 and effects["memory_effect"] > 0
    assert 0 < effects["memory_effect_least"] <= effects["memory_effect"]  # every position reads the memory


def test_output_and_grad_differences():
    X, R = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    keep = torch.ones(2, 3, 1, dtype=torch.bool)
    same = output_and_grad_differences((lambda Z: 2 * Z, lambda Z: (Z + Z,)), X, R, keep)
    assert same["max_abs_diff"] == 0 and same["max_abs_grad_diff"] == 0
    assert same["max_abs_output"] == float((2 * X).abs().max())
    keep[1, 2] = False  # a difference at an ignored position is not reported as output difference
    shifted = output_and_grad_differences((lambda Z: Z, lambda Z: Z + (torch.arange(3) == 2)[None, :, None]),
                                          X, R, keep)
    assert shifted["max_abs_diff"] == 1.0 and shifted["max_abs_grad_diff"] == 0
