"""The two LayerNorm variants of make_norm: 'layer_no_bias' (Cohere Command R) and
'layer_nonparametric' (OLMo 1), checked against the pinned Hugging Face ``transformers``."""

import pytest
import torch

from d2lmini import NORMS, TransformerBlock, make_norm
from d2lmini.norms import DEFAULT_EPS

cohere = pytest.importorskip("transformers.models.cohere.modeling_cohere")
olmo = pytest.importorskip("transformers.models.olmo.modeling_olmo")
from transformers import CohereConfig  # noqa: E402

D = 96


def test_names_and_default_eps_match_the_pinned_configs():
    assert {"layer_no_bias", "layer_nonparametric"} <= set(NORMS)
    assert DEFAULT_EPS["layer_no_bias"] == CohereConfig().layer_norm_eps == 1e-5
    assert DEFAULT_EPS["layer_nonparametric"] == 1e-5  # hard-coded in OlmoLayerNorm.forward


@pytest.mark.parametrize("norm", ["layer_no_bias", "layer_nonparametric"])
def test_bad_arguments_raise_naming_them(norm):
    with pytest.raises(TypeError, match="num_hiddens"):
        make_norm(norm, 8.0)
    with pytest.raises(ValueError, match="num_hiddens"):
        make_norm(norm, 0)
    with pytest.raises(ValueError, match="eps"):
        make_norm(norm, 8, eps=0.0)
    with pytest.raises(TypeError, match="gain"):
        make_norm(norm, 8, gain="one")
    with pytest.raises(ValueError, match="norm"):
        make_norm(norm + "_x", 8)


def test_nonparametric_norm_rejects_a_gain():
    with pytest.raises(ValueError, match="gain must be 1.0 for norm='layer_nonparametric'"):
        make_norm("layer_nonparametric", 8, gain=0.5)
    with pytest.raises(ValueError, match="gain"):
        TransformerBlock(16, 2, norm="layer_nonparametric", placement="sandwich", sublayer_norm_gain=0.5)
    assert make_norm("layer_no_bias", 8, gain=0.5).weight.eq(0.5).all()


def _inputs(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(4, 16, D, generator=g) * 3 + 0.5).to(dtype)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 0.0)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_layer_no_bias_equals_cohere_layer_norm(dtype, tol, seed):
    ours = make_norm("layer_no_bias", D)
    ref = cohere.CohereLayerNorm(D, eps=CohereConfig().layer_norm_eps)
    assert [n for n, _ in ours.named_parameters()] == ["weight"]
    with torch.no_grad():
        ours.weight.copy_(torch.rand(D, generator=torch.Generator().manual_seed(100 + seed)) + 0.5)
        ref.weight.copy_(ours.weight)
    ours, ref = ours.to(dtype), ref.to(dtype)
    X = _inputs(dtype, seed)
    Y, Y_ref = ours(X), ref(X)
    assert Y.dtype == Y_ref.dtype == dtype
    assert (Y.float() - Y_ref.float()).abs().max().item() <= tol


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 0.0)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_layer_nonparametric_equals_olmo_layer_norm(dtype, tol, seed):
    ours, ref = make_norm("layer_nonparametric", D), olmo.OlmoLayerNorm(D)
    assert list(ours.parameters()) == []
    X = _inputs(dtype, seed)
    Y, Y_ref = ours(X), ref(X)
    assert Y.dtype == Y_ref.dtype == dtype
    assert (Y.float() - Y_ref.float()).abs().max().item() <= tol


@pytest.mark.parametrize("norm,params_per_norm", [("layer", 2 * 16), ("rms", 16),
                                                   ("layer_no_bias", 16), ("layer_nonparametric", 0)])
def test_block_builds_runs_and_counts_parameters(norm, params_per_norm):
    torch.manual_seed(0)
    block = TransformerBlock(16, 2, norm=norm, placement="pre")
    norm_params = {name: p.numel() for name, p in block.named_parameters()
                   if not name.startswith(("attention.", "ffn."))}
    assert sum(norm_params.values()) == 2 * params_per_norm  # the two pre-norms
    if norm != "layer":
        assert not any(name.endswith("bias") for name in norm_params)
    X = torch.randn(2, 5, 16, requires_grad=True)
    Y = block(X)
    assert Y.shape == X.shape and torch.isfinite(Y).all()
    Y.pow(2).mean().backward()
    assert X.grad is not None and torch.isfinite(X.grad).all()
    assert all(p.grad is not None for p in block.parameters())


@pytest.mark.parametrize("norm", ["layer_no_bias", "layer_nonparametric"])
def test_float64_input_stays_float64(norm):
    layer = make_norm(norm, D).double()
    X = _inputs(torch.float64, 0)
    assert layer(X).dtype == torch.float64
    assert torch.allclose(layer(X), torch.nn.functional.layer_norm(X, (D,), eps=1e-5), atol=1e-12)
