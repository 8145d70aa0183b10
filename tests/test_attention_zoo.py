"""Qwen2's q/k/v-only biases (LlamaVariantAttention(qkv_bias=True)) and Gemma 2's attention logit soft-capping
(GemmaAttention(logit_softcap=)).

Checked against Hugging Face ``transformers`` 5.24: ``models/qwen2/modeling_qwen2.py``
(``Qwen2Attention``: q/k/v_proj ``bias=True``, o_proj ``bias=False``) and
``models/gemma2/modeling_gemma2.py`` (``eager_attention_forward``: scale, then
``tanh(logits / softcap) * softcap``, then the mask and softmax).
"""

import pytest
import torch

from d2lmini import reference
from d2lmini.attention import MultiHeadAttention
from d2lmini.block import TransformerBlock
from d2lmini.reference.gemma import GemmaAttention
from d2lmini.reference.llama import LlamaVariantAttention

tf = pytest.importorskip("transformers")


@pytest.mark.parametrize("bias, error", [("qkv", TypeError), ("QKV", TypeError), (1, TypeError), (None, TypeError)])
def test_bad_bias_is_rejected_naming_it(bias, error):
    with pytest.raises(error, match="bias"):
        MultiHeadAttention(32, 4, bias=bias)
    with pytest.raises(error, match="bias"):
        TransformerBlock(32, 4, bias=bias)
    with pytest.raises(error, match="bias"):
        TransformerBlock(32, 4, bias=bias, attn_factory=lambda: MultiHeadAttention(32, 4))


@pytest.mark.parametrize("cap, error", [(0.0, ValueError), (-1.0, ValueError), (float("inf"), ValueError),
                                        ("50", TypeError), (True, TypeError)])
def test_bad_logit_softcap_is_rejected_naming_it(cap, error):
    with pytest.raises(error, match="logit_softcap"):
        GemmaAttention(32, 4, logit_softcap=cap)


def test_released_models_options_are_not_the_blocks():
    for name, value in (("logit_softcap", 50.0), ("qkv_bias", True)):
        with pytest.raises(TypeError, match=f"unknown argument.*{name}"):
            TransformerBlock(32, 4, **{name: value})


def test_qkv_bias_shapes():
    attn = LlamaVariantAttention(32, 4, num_kv_heads=2, head_dim=16, qkv_bias=True)
    assert attn.W_q.bias.shape == (64,) and attn.W_k.bias.shape == (32,) and attn.W_v.bias.shape == (32,)
    assert attn.W_o.bias is None and "qkv_bias=True" in repr(attn)
    with pytest.raises(ValueError, match="qkv_bias"):
        LlamaVariantAttention(32, 4, qkv_bias=True, bias=True)
    block = TransformerBlock(32, 4, attn_factory=lambda: LlamaVariantAttention(32, 4, qkv_bias=True))
    assert block.attention.W_q.bias is not None and block.attention.W_o.bias is None
    assert all(m.bias is None for m in block.ffn.modules() if isinstance(m, torch.nn.Linear))


def test_huge_cap_equals_uncapped_and_small_cap_differs():
    X = torch.randn(2, 7, 32)
    valid_lens = torch.tensor([7, 4])
    torch.manual_seed(0)
    plain = MultiHeadAttention(32, 4, num_kv_heads=2, causal=True, rope_theta=10000.0).eval()
    capped = GemmaAttention(32, 4, num_kv_heads=2, causal=True, rope_theta=10000.0, logit_softcap=1e6).eval()
    capped.load_state_dict(plain.state_dict())
    for vl in (None, valid_lens):
        assert (capped(X, X, X, vl) - plain(X, X, X, vl)).abs().max() < 1e-6
    capped.logit_softcap = 0.1
    assert (capped(X, X, X) - plain(X, X, X)).abs().max() > 1e-3


def _compare(ours, theirs, X, call_theirs, call_ours):
    Xa, Xb = X.clone().requires_grad_(), X.clone().requires_grad_()
    a, b = call_ours(ours, Xa), call_theirs(theirs, Xb)
    g = torch.randn_like(a)
    (a * g).sum().backward()
    (b * g).sum().backward()
    return (a - b).abs().max().item(), (Xa.grad - Xb.grad).abs().max().item()


def _rotary_kwargs(rotary_cls, config, X):
    position_ids = torch.arange(X.shape[1])[None].expand(X.shape[0], -1)
    return {"position_embeddings": rotary_cls(config)(X, position_ids), "position_ids": position_ids}


def _copy_attention(ours, attn):
    for name, theirs in (("W_q", "q_proj"), ("W_k", "k_proj"), ("W_v", "v_proj"), ("W_o", "o_proj")):
        src, dst = getattr(attn, theirs), getattr(ours, name)
        with torch.no_grad():
            dst.weight.copy_(src.weight)
            assert (src.bias is None) == (dst.bias is None)
            if src.bias is not None:
                dst.bias.copy_(src.bias)


def _qwen2(seed=0):
    torch.manual_seed(seed)
    config = tf.Qwen2Config(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                            num_hidden_layers=1, vocab_size=100)
    config._attn_implementation = "sdpa"
    layer = tf.models.qwen2.modeling_qwen2.Qwen2DecoderLayer(config, layer_idx=0)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.2)
        layer.input_layernorm.weight.uniform_(0.5, 1.5)
        layer.post_attention_layernorm.weight.uniform_(0.5, 1.5)
    return layer.eval(), config


@pytest.mark.parametrize("valid", [False, True])
def test_qwen2_attention_and_layer_match_transformers(valid):
    layer, config = _qwen2()
    X = torch.randn(2, 9, 64)
    valid_lens = torch.tensor([9, 5]) if valid else None
    mask = reference.additive_mask(valid_lens, 9, True, X.dtype, 2)
    theta = float(config.rope_parameters["rope_theta"]) if getattr(config, "rope_parameters", None) else config.rope_theta
    attn = LlamaVariantAttention(64, 4, num_kv_heads=2, causal=True, rope_theta=theta, qkv_bias=True).eval()
    _copy_attention(attn, layer.self_attn)
    rot = tf.models.qwen2.modeling_qwen2.Qwen2RotaryEmbedding
    out, grad = _compare(attn, layer.self_attn, X,
                         lambda m, Y: m(Y, attention_mask=mask, **_rotary_kwargs(rot, config, Y))[0],
                         lambda m, Y: m(Y, Y, Y, valid_lens))
    print("qwen2 attention", out, grad)
    assert out <= 1e-5 and grad <= 1e-5
    block = TransformerBlock(64, 4, norm="rms", act="swiglu", placement="pre", ffn_num_hiddens=96,
                             eps=config.rms_norm_eps, attn_factory=lambda: LlamaVariantAttention(
                                 64, 4, num_kv_heads=2, causal=True, rope_theta=theta, qkv_bias=True)).eval()
    _copy_attention(block.attention, layer.self_attn)
    with torch.no_grad():
        block.ffn.W_g.weight.copy_(layer.mlp.gate_proj.weight)
        block.ffn.W_1.weight.copy_(layer.mlp.up_proj.weight)
        block.ffn.W_2.weight.copy_(layer.mlp.down_proj.weight)
    norms = [m for m in block.modules() if hasattr(m, "weight") and m.weight.dim() == 1]
    with torch.no_grad():
        norms[0].weight.copy_(layer.input_layernorm.weight)
        norms[1].weight.copy_(layer.post_attention_layernorm.weight)
    out, grad = _compare(block, layer, X,
                         lambda m, Y: (lambda o: o[0] if isinstance(o, tuple) else o)(
                             m(Y, attention_mask=mask, **_rotary_kwargs(rot, config, Y))),
                         lambda m, Y: m(Y, valid_lens))
    print("qwen2 layer", out, grad)
    assert out <= 1e-5 and grad <= 1e-5


@pytest.mark.parametrize("valid", [False, True])
def test_gemma2_softcapped_attention_matches_transformers(valid):
    torch.manual_seed(0)
    config = tf.Gemma2Config(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                             head_dim=32, query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                             num_hidden_layers=1, vocab_size=100, layer_types=["full_attention"])
    config._attn_implementation = "eager"
    attn_hf = tf.models.gemma2.modeling_gemma2.Gemma2Attention(config, layer_idx=0).eval()
    with torch.no_grad():
        for p in attn_hf.parameters():
            p.normal_(0, 0.3)
    X = torch.randn(2, 9, 64)
    valid_lens = torch.tensor([9, 5]) if valid else None
    mask = reference.additive_mask(valid_lens, 9, True, X.dtype, 2)
    theta = float(config.rope_parameters["rope_theta"]) if getattr(config, "rope_parameters", None) else config.rope_theta
    ours = GemmaAttention(64, 4, num_kv_heads=2, head_dim=32, causal=True, rope_theta=theta, logit_softcap=2.0).eval()
    ours.scale = 24 ** -0.5
    _copy_attention(ours, attn_hf)
    rot = tf.models.gemma2.modeling_gemma2.Gemma2RotaryEmbedding
    out, grad = _compare(ours, attn_hf, X,
                         lambda m, Y: m(Y, attention_mask=mask, **_rotary_kwargs(rot, config, Y))[0],
                         lambda m, Y: m(Y, Y, Y, valid_lens))
    print("gemma2 attention", out, grad)
    assert out <= 1e-5 and grad <= 1e-5
    ours.logit_softcap = None  # the cap matters here: without it the outputs differ
    assert (ours(X, X, X, valid_lens) - attn_hf(X, attention_mask=mask, **_rotary_kwargs(rot, config, X))[0]).abs().max() > 1e-4


def test_explicit_path_with_a_huge_cap_equals_sdpa():
    torch.manual_seed(1)
    attn = GemmaAttention(32, 4, num_kv_heads=2, causal=True, window=3, rope_theta=10000.0, logit_softcap=1e6).eval()
    X = torch.randn(2, 7, 32)
    for valid_lens in (None, torch.tensor([7, 4]), torch.tensor([[1, 2, 3, 4, 5, 6, 7], [7, 6, 5, 4, 3, 2, 1]])):
        q, k = attn.queries_and_keys(X, X)
        v = attn.value_heads(X)
        mask = attn.mask(valid_lens, 2, 7, 7, X.device)
        explicit = attn.attend(q, k, v, mask)
        fused = MultiHeadAttention.attend(attn, q, k, v, mask)  # the base class's kernel: fused SDPA
        assert (explicit - fused).abs().max() < 1e-6
