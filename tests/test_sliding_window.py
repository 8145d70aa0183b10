"""Sliding-window attention: MultiHeadAttention(window=...) and TransformerBlock(window=...).

Convention checked against Hugging Face ``transformers`` (masking_utils.sliding_window_overlay:
``kv_idx > q_idx - sliding_window``, and-ed with causal): query i sees keys i - window < j <= i.
"""

import pytest
import torch

from d2lmini import reference
from d2lmini.attention import GatedAttention, MultiHeadAttention
from d2lmini.block import TransformerBlock, TransformerDecoderBlock


def _attention(window, seed=0, **kwargs):
    torch.manual_seed(seed)
    return MultiHeadAttention(32, 4, num_kv_heads=2, causal=True, rope_theta=10000.0, window=window, **kwargs).eval()


@pytest.mark.parametrize("window, error", [(0, ValueError), (-3, ValueError), (2.0, TypeError),
                                           (True, TypeError), ("4", TypeError)])
def test_bad_window_is_rejected_naming_it(window, error):
    with pytest.raises(error, match="window"):
        MultiHeadAttention(32, 4, causal=True, window=window)
    with pytest.raises(error, match="window"):
        TransformerBlock(32, 4, causal=True, window=window)


def test_window_needs_causal_attention():
    with pytest.raises(ValueError, match="window=4 needs causal=True"):
        MultiHeadAttention(32, 4, window=4)
    with pytest.raises(ValueError, match="window=4 needs causal=True"):
        TransformerBlock(32, 4, window=4)


def test_window_is_keyword_only_and_refused_with_a_factory():
    with pytest.raises(TypeError):
        MultiHeadAttention(32, 4, 0.0, False, None, True, None, None, None, None, None, 4)
    with pytest.raises(ValueError, match="window=4 would be ignored"):
        TransformerBlock(32, 4, window=4, attn_factory=lambda: MultiHeadAttention(32, 4, causal=True))


def test_window_at_least_the_length_is_plain_causal_attention():
    X = torch.randn(2, 7, 32)
    valid_lens = torch.tensor([7, 4])
    full = _attention(None)
    for window in (7, 8, 100):
        local = _attention(window)
        assert torch.equal(local(X, X, X), full(X, X, X))
        assert torch.equal(local(X, X, X, valid_lens), full(X, X, X, valid_lens))


@pytest.mark.parametrize("window", [1, 2, 3])
def test_a_small_window_blocks_exactly_the_keys_outside_it(window):
    n, t = 8, 2  # perturb token t: query i sees it iff i - window < t <= i
    attn = _attention(window)
    X = torch.randn(1, n, 32)
    Y = X.clone()
    Y[:, t] += torch.randn(32)
    changed = (attn(X, X, X) - attn(Y, Y, Y)).abs().amax(-1)[0] > 0
    expected = torch.tensor([i - window < t <= i for i in range(n)])
    assert torch.equal(changed, expected)


def test_window_mask_matches_the_band_with_padding():
    n, window = 6, 3
    attn = _attention(window)
    valid_lens = torch.tensor([6, 3])
    mask = attn.mask(valid_lens, 2, n, n, "cpu")[:, 0]  # (b, q, k)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None]
    band = (j <= i) & (j > i - window)
    assert torch.equal(mask[0], band)
    real = band & (j < 3)
    assert torch.equal(mask[1, :3], real[:3])  # real queries: band and real keys
    # padded queries 3..5: band & real keys, or (if that is empty: query 5) the query itself
    assert torch.equal(mask[1, 3:5], real[3:5])
    assert torch.equal(mask[1, 5], torch.arange(n) == 5)


def test_window_with_valid_lens_ignores_padding_and_stays_finite():
    n, window = 9, 3
    attn = _attention(window)
    X = torch.randn(2, n, 32)
    valid_lens = torch.tensor([9, 4])
    out = attn(X, X, X, valid_lens)
    assert torch.isfinite(out).all()
    Y = X.clone()
    Y[1, 4:] = torch.randn(n - 4, 32)  # change only the padding of sequence 1
    assert torch.equal(attn(Y, Y, Y, valid_lens)[1, :4], out[1, :4])
    # per-query lengths (b, q) work too
    per_query = valid_lens[:, None].expand(2, n)
    assert torch.equal(attn(X, X, X, per_query)[:, :4], out[:, :4])


def test_block_gated_and_decoder_pass_the_window_to_self_attention():
    assert TransformerBlock(32, 4, causal=True, window=5).attention.window == 5
    assert GatedAttention(32, 4, causal=True, window=5).window == 5
    decoder = TransformerDecoderBlock(32, 4, window=5)
    assert decoder.attention.window == 5 and decoder.cross_attention.window is None
    assert "window=5" in repr(decoder.attention)


def _mistral(sliding_window, seed=0):
    tf = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    config = tf.MistralConfig(**reference.TINY, num_hidden_layers=1, sliding_window=sliding_window,
                              rope_theta=10000.0)
    config._attn_implementation = "sdpa"
    layer = tf.models.mistral.modeling_mistral.MistralDecoderLayer(config, layer_idx=0)
    return reference.randomize_(layer, seed).eval(), config  # every weight, norm gains too


@pytest.mark.parametrize("sliding_window", [1, 3, 5])
@pytest.mark.parametrize("padded", [False, True])
def test_equals_hugging_face_mistral_decoder_layer(sliding_window, padded):
    import transformers as tf
    from transformers.masking_utils import create_sliding_window_causal_mask

    layer, config = _mistral(sliding_window)
    block = reference.from_mistral_layer(layer, config)
    assert block.attention.window == sliding_window
    b, n = 2, 12  # longer than every window
    gen = torch.Generator().manual_seed(1)
    X = torch.randn(b, n, config.hidden_size, generator=gen)
    R = torch.randn(b, n, config.hidden_size, generator=gen)
    valid_lens = torch.tensor([n, 7]) if padded else None
    position_ids = torch.arange(n)[None].expand(b, -1)
    rotary = tf.models.mistral.modeling_mistral.MistralRotaryEmbedding(config)
    padding = None if valid_lens is None else (torch.arange(n) < valid_lens[:, None]).long()

    def theirs(Z):
        mask = create_sliding_window_causal_mask(config=config, inputs_embeds=Z, attention_mask=padding,
                                                 cache=None, position_ids=position_ids,
                                                 allow_is_causal_skip=False)
        return layer(Z, attention_mask=mask, position_ids=position_ids,
                     position_embeddings=rotary(Z, position_ids))

    keep = torch.ones(b, n, 1, dtype=torch.bool) if valid_lens is None else padding.bool()[..., None]
    diffs = reference.output_and_grad_differences((theirs, lambda Z: block(Z, valid_lens)), X, R, keep)
    assert diffs["max_abs_diff"] <= 1e-5, diffs
    assert diffs["max_abs_grad_diff"] <= 1e-5, diffs
    # the window matters here: without it the outputs differ
    full = reference.from_llama_layer(layer, config)
    assert not torch.allclose(full(X, valid_lens), block(X, valid_lens), atol=1e-3)
