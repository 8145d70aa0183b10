"""TransformerBlock(...).set_scales(residual_multiplier=m): x + m * F(Norm(x)), checked against IBM Granite."""

import pytest
import torch

from d2lmini.block import AddNorm, TransformerBlock
from d2lmini.reference import Reference, additive_mask, compare_with_reference, randomize_
from d2lmini.reference.base import copy_norm
from d2lmini.reference.llama import gated_decoder


@pytest.mark.parametrize("value, error", [
    ("0.5", TypeError), (True, TypeError), (None, TypeError),
    (0.0, ValueError), (-0.22, ValueError), (float("inf"), ValueError), (float("nan"), ValueError),
])
def test_bad_residual_multiplier(value, error):
    with pytest.raises(error, match="residual_multiplier"):
        TransformerBlock(16, 2).set_scales(residual_multiplier=value)


def test_addnorm_takes_the_multiplier_from_set_scales_only():
    with pytest.raises(TypeError, match="residual_multiplier"):
        AddNorm(16, residual_multiplier=0.5)
    assert AddNorm(16).residual_multiplier == 1.0


@pytest.mark.parametrize("kwargs", [dict(placement="post"), dict(placement="post_sublayer"),
                                    dict(placement="sandwich"), dict(residual=False)])
def test_residual_multiplier_only_for_pre_ln(kwargs):
    with pytest.raises(ValueError, match="residual_multiplier"):
        TransformerBlock(16, 2, **kwargs).set_scales(residual_multiplier=0.5)
    TransformerBlock(16, 2, **kwargs).set_scales(residual_multiplier=1.0)  # the default stays allowed everywhere


def test_residual_multiplier_is_keyword_only():
    with pytest.raises(TypeError):
        AddNorm(16, "pre", "rms")
    with pytest.raises(TypeError):
        TransformerBlock(16, 2).set_scales(0.5)


def test_the_block_constructor_points_to_set_scales():
    for name in ("residual_multiplier", "layer_scalar"):
        with pytest.raises(TypeError, match=rf"{name} -> call block.set_scales\({name}="):
            TransformerBlock(16, 2, **{name: 0.5})
    with pytest.raises(TypeError, match=r"attn_scale -> pass scale="):
        TransformerBlock(16, 2, attn_scale=0.5)


def test_multiplier_one_is_the_current_block_exactly():
    torch.manual_seed(0)
    plain = TransformerBlock(32, 4, causal=True, rope_theta=10000.0).eval()
    scaled = TransformerBlock(32, 4, causal=True, rope_theta=10000.0).set_scales(residual_multiplier=1.0).eval()
    scaled.load_state_dict(plain.state_dict())
    X = torch.randn(2, 7, 32)
    assert torch.equal(plain(X), scaled(X))


def test_multiplier_scales_each_branch():
    torch.manual_seed(0)
    m = 0.22
    block = TransformerBlock(32, 4, causal=True).set_scales(residual_multiplier=m).eval()
    X = torch.randn(2, 5, 32)
    Y = block.attention(*(block.addnorm1.norm_in(X),) * 3, None)
    H = X + m * Y
    expected = H + m * block.ffn(block.addnorm2.norm_in(H))
    torch.testing.assert_close(block(X), expected, rtol=0, atol=1e-6)


def _granite_reference():
    tf = pytest.importorskip("transformers")
    from transformers.models.granite import modeling_granite as mg

    def make(seed):
        torch.manual_seed(seed)
        config = tf.GraniteConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                  intermediate_size=160, num_hidden_layers=1, residual_multiplier=0.22,
                                  attention_multiplier=0.0078, rms_norm_eps=1e-6)
        config._attn_implementation = "sdpa"
        layer = mg.GraniteDecoderLayer(config, layer_idx=0)
        return randomize_(layer, seed).eval(), config

    def convert(layer, config):
        block = gated_decoder(layer, config, "pre", None, attn_scale=config.attention_multiplier,
                              residual_multiplier=config.residual_multiplier)
        copy_norm(block.addnorm1.norm_in, layer.input_layernorm)
        copy_norm(block.addnorm2.norm_in, layer.post_attention_layernorm)
        return block

    def call(layer, config, X, valid_lens):
        batch_size, num_steps, _ = X.shape
        mask = additive_mask(valid_lens, num_steps, True, X.dtype, batch_size)  # HF's explicit causal mask
        position_ids = torch.arange(num_steps)[None].expand(batch_size, -1)
        rotary = mg.GraniteRotaryEmbedding(config)  # HF's own rotary tables
        out = layer(X, attention_mask=mask, position_ids=position_ids,
                    position_embeddings=rotary(X, position_ids))
        return out[0] if isinstance(out, tuple) else out

    return Reference("GraniteDecoderLayer", "IBM Granite", make, convert, call, causal=True)


@pytest.mark.parametrize("seed", [0, 1])
def test_matches_granite_decoder_layer(seed):
    ref = _granite_reference()
    layer, _ = ref.make(seed)
    gains = [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
    assert all(not torch.allclose(g, torch.ones_like(g)) for g in gains)  # norm gains are randomized too
    result = compare_with_reference(ref, seed=seed)
    print(f"Granite seed={seed}: max|dY|={result['max_abs_diff']:.2e} "
          f"max|dgrad|={result['max_abs_grad_diff']:.2e} scale={result['max_abs_output']:.2f}")
    assert result["max_abs_diff"] <= 1e-5
    assert result["max_abs_grad_diff"] <= 1e-5
    block = result["block"]
    assert block.addnorm1.residual_multiplier == block.addnorm2.residual_multiplier == 0.22
    assert block.attention.scale == pytest.approx(0.0078)
