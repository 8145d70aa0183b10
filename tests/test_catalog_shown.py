"""Small functions the chapters and the zoo print: the dense mixture and the output/gradient comparison."""

from __future__ import annotations

import pytest
import torch

from d2lmini import MixtureOfExperts
from d2lmini.chapters.ch07_ffn import dense_mixture
from d2lmini.reference import output_and_grad_differences


def test_dense_mixture_matches_the_sparse_forward():
    torch.manual_seed(0)
    for router, shared in (("softmax", 0), ("sigmoid", 1)):
        moe = MixtureOfExperts(16, 4, top_k=2, router=router, num_shared_experts=shared)
        tokens = torch.randn(12, 16)
        with torch.no_grad():
            torch.testing.assert_close(dense_mixture(moe, tokens), moe(tokens))


def test_output_and_grad_differences():
    X, R = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    keep = torch.ones(2, 3, 1, dtype=torch.bool)
    same = output_and_grad_differences((lambda Z: 2 * Z, lambda Z: (Z + Z,)), X, R, keep)
    assert same["max_abs_diff"] == 0 and same["max_abs_grad_diff"] == 0
    assert same["max_abs_output"] == float((2 * X).abs().max())
    keep[1, 2] = False  # a difference at an ignored position is not reported as output difference
    shifted = output_and_grad_differences((lambda Z: Z, lambda Z: Z + (torch.arange(3) == 2)[None, :, None]),
                                          X, R, keep)
    # (Z + 1) - Z is 1 up to float32 rounding of Z + 1
    assert shifted["max_abs_diff"] == pytest.approx(1.0, abs=1e-6) and shifted["max_abs_grad_diff"] == 0
