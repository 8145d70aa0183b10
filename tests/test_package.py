"""d2lmini: shapes, every placement and flag, numerics against torch's layers, bad input."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
import torch
from torch import nn

import d2lmini
from d2lmini import FeedForward, MultiHeadAttention, RMSNorm, TransformerBlock
from d2lmini.block import SEQUENTIAL_PLACEMENTS


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# --------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("placement,norm,act", list(itertools.product(d2lmini.PLACEMENTS, d2lmini.NORMS, d2lmini.ACTS)))
def test_block_keeps_shape_for_every_flag_combination(placement, norm, act):
    block = TransformerBlock(32, 4, norm=norm, act=act, placement=placement)
    X = torch.randn(2, 7, 32)
    Y = block(X, valid_lens=torch.tensor([7, 3]))
    assert Y.shape == X.shape
    assert torch.isfinite(Y).all()


def test_block_is_differentiable_and_trains_in_train_mode_with_dropout():
    block = TransformerBlock(16, 2, dropout=0.1, bias=True, causal=True)
    block.train()
    X = torch.randn(3, 5, 16, requires_grad=True)
    block(X).pow(2).mean().backward()
    assert X.grad is not None and torch.isfinite(X.grad).all()
    assert all(p.grad is not None for p in block.parameters())


def test_placements_put_the_norms_where_the_literature_says():
    X = torch.randn(2, 6, 16)
    branch = nn.Linear(16, 16)
    for placement in SEQUENTIAL_PLACEMENTS:
        add = d2lmini.AddNorm(16, placement, norm="layer")
        ln = nn.LayerNorm(16)
        expected = {
            "post": ln(X + branch(X)),
            "pre": X + branch(ln(X)),
            "post_sublayer": X + ln(branch(X)),
            "sandwich": X + ln(branch(ln(X))),
        }[placement]
        torch.testing.assert_close(add(X, branch), expected)


def test_sublayer_norm_gain_scales_the_branch_output():
    add = d2lmini.AddNorm(16, "sandwich", norm="rms", sublayer_norm_gain=0.25)
    torch.testing.assert_close(add.norm_out.weight, torch.full((16,), 0.25))
    assert torch.equal(add.norm_in.weight, torch.ones(16))


def test_ffn_widths_and_gated_parameter_budget():
    d = 96
    assert FeedForward(d, act="gelu").ffn_num_hiddens == 4 * d
    assert FeedForward(d, act="swiglu").ffn_num_hiddens == 256  # round(8 * 96 / 3)
    assert FeedForward(d, ffn_num_hiddens=100, act="swiglu").ffn_num_hiddens == 100
    plain = sum(p.numel() for p in FeedForward(d, act="gelu").parameters())
    gated = sum(p.numel() for p in FeedForward(d, act="swiglu").parameters())
    assert abs(gated - plain) / plain < 1e-3


def test_ffn_acts_compute_their_formulas():
    X = torch.randn(4, 8)
    relu = FeedForward(8, act="relu")
    torch.testing.assert_close(relu(X), relu.W_2(torch.relu(relu.W_1(X))))
    swiglu = FeedForward(8, act="swiglu")
    torch.testing.assert_close(swiglu(X), swiglu.W_2(nn.functional.silu(swiglu.W_g(X)) * swiglu.W_1(X)))


# --------------------------------------------------------------------------- numerics


def test_rmsnorm_matches_torch_rmsnorm_at_equal_eps():
    X = torch.randn(4, 9, 64)
    ours, ref = RMSNorm(64, eps=1e-6), nn.RMSNorm(64, eps=1e-6)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        ref.weight.copy_(ours.weight)
    torch.testing.assert_close(ours(X), ref(X), atol=1e-6, rtol=1e-6)


def test_rmsnorm_upcasts_half_precision_inputs():
    X = (torch.randn(2, 4096) * 300).to(torch.float16)  # squares overflow float16's 65504
    Y = RMSNorm(4096).half()(X)
    assert Y.dtype == torch.float16
    assert torch.isfinite(Y).all()
    expected = X.float() * torch.rsqrt(X.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(Y.float(), expected, atol=2e-3, rtol=2e-3)


def test_attention_matches_torch_multihead_attention():
    d, h = 32, 4
    ours = MultiHeadAttention(d, h, bias=True)
    ref = nn.MultiheadAttention(d, h, bias=True, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.W_q.weight, ours.W_k.weight, ours.W_v.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.W_q.bias, ours.W_k.bias, ours.W_v.bias]))
        ref.out_proj.weight.copy_(ours.W_o.weight)
        ref.out_proj.bias.copy_(ours.W_o.bias)
    Q, K = torch.randn(2, 5, d), torch.randn(2, 8, d)
    valid_lens = torch.tensor([8, 3])
    padding = torch.arange(8)[None, :] >= valid_lens[:, None]
    expected, _ = ref(Q, K, K, key_padding_mask=padding, need_weights=False)
    torch.testing.assert_close(ours(Q, K, K, valid_lens), expected, atol=1e-5, rtol=1e-5)


def test_padding_keys_do_not_change_the_output():
    mha = MultiHeadAttention(16, 2)
    X = torch.randn(1, 6, 16)
    Y1 = mha(X, X, X, torch.tensor([4]))
    X2 = X.clone()
    X2[:, 4:] = torch.randn(1, 2, 16) * 100  # change only the padded positions
    Y2 = mha(X2, X2, X2, torch.tensor([4]))
    torch.testing.assert_close(Y1[:, :4], Y2[:, :4])


def test_per_query_valid_lens_and_causal_mask_agree():
    mha = MultiHeadAttention(16, 4)
    X = torch.randn(2, 5, 16)
    per_query = torch.arange(1, 6).repeat(2, 1)  # query i sees keys 0..i
    causal = MultiHeadAttention(16, 4, causal=True)
    causal.load_state_dict(mha.state_dict())
    torch.testing.assert_close(mha(X, X, X, per_query), causal(X, X, X))


def test_grouped_query_attention_reads_shared_key_value_heads():
    gqa = MultiHeadAttention(32, 4, num_kv_heads=2)
    assert gqa.W_k.out_features == gqa.W_v.out_features == 16
    mha = MultiHeadAttention(32, 4)
    with torch.no_grad():
        mha.W_q.weight.copy_(gqa.W_q.weight)
        mha.W_o.weight.copy_(gqa.W_o.weight)
        # head i of the full model reads kv head i // 2 of the grouped one
        for W_full, W_grouped in ((mha.W_k, gqa.W_k), (mha.W_v, gqa.W_v)):
            heads = W_grouped.weight.view(2, 8, 32)
            W_full.weight.copy_(heads.repeat_interleave(2, dim=0).reshape(32, 32))
    X = torch.randn(2, 5, 32)
    torch.testing.assert_close(gqa(X, X, X), mha(X, X, X))


def test_post_ln_block_matches_torch_encoder_layer():
    d, h = 32, 4
    ours = TransformerBlock(d, h, norm="layer", act="relu", placement="post", bias=True)
    ref = nn.TransformerEncoderLayer(d, h, dim_feedforward=4 * d, dropout=0.0, batch_first=True)
    with torch.no_grad():
        a = ours.attention
        ref.self_attn.in_proj_weight.copy_(torch.cat([a.W_q.weight, a.W_k.weight, a.W_v.weight]))
        ref.self_attn.in_proj_bias.copy_(torch.cat([a.W_q.bias, a.W_k.bias, a.W_v.bias]))
        ref.self_attn.out_proj.load_state_dict(a.W_o.state_dict())
        ref.linear1.load_state_dict(ours.ffn.W_1.state_dict())
        ref.linear2.load_state_dict(ours.ffn.W_2.state_dict())
        ref.norm1.load_state_dict(ours.addnorm1.norm_post.state_dict())
        ref.norm2.load_state_dict(ours.addnorm2.norm_post.state_dict())
    ours.eval(), ref.eval()
    X = torch.randn(2, 16, d, requires_grad=True)
    valid_lens = torch.tensor([16, 11])
    padding = torch.arange(16)[None, :] >= valid_lens[:, None]
    expected = ref(X, src_key_padding_mask=padding)  # X requires grad: no fused fast path
    torch.testing.assert_close(ours(X, valid_lens), expected, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- depth probe


@pytest.fixture(scope="module")
def probes():
    return {p: d2lmini.probe_depth(p, norm="layer", depth=32, seed=0) for p in ("post", "pre")}


def test_post_ln_stream_rms_is_one_at_every_depth(probes):
    post = probes["post"]
    assert len(post.stream_rms) == 33
    for k, rms in enumerate(post.stream_rms[1:], start=1):
        assert abs(rms - 1.0) < 1e-5, (k, rms)


def test_pre_ln_keeps_tokens_apart_and_post_ln_collapses(probes):
    assert probes["pre"].token_spread[32] > 100 * probes["post"].token_spread[32]
    assert probes["pre"].stream_rms[32] > probes["pre"].stream_rms[8] > 1.5


def test_post_ln_starves_queries_and_keys_of_gradient(probes):
    assert probes["post"].qk_vo_ratio(32) < 1e-4
    assert probes["pre"].qk_vo_ratio(32) > 1e-3
    assert set(probes["pre"].grad_norms) == {"W_q", "W_k", "W_v", "W_o", "W_1", "W_2"}
    assert all(len(v) == 32 for v in probes["pre"].grad_norms.values())


def test_probe_is_deterministic_and_seed_dependent():
    a = d2lmini.probe_depth("pre", depth=4, num_hiddens=16, num_heads=2, num_steps=8, seed=3)
    b = d2lmini.probe_depth("pre", depth=4, num_hiddens=16, num_heads=2, num_steps=8, seed=3)
    c = d2lmini.probe_depth("pre", depth=4, num_hiddens=16, num_heads=2, num_steps=8, seed=4)
    assert a == b
    assert a.token_spread != c.token_spread


def test_probe_does_not_disturb_the_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    d2lmini.probe_depth("post", depth=2, num_hiddens=16, num_heads=2, num_steps=4)
    assert torch.equal(torch.rand(3), expected)


def test_depth_table_has_one_row_per_placement_and_depth(probes):
    table = d2lmini.depth_table(probes.values(), ks=(8, 16, 32))
    assert table.shape == (6, 5)
    assert table.loc[("post", 32), "stream RMS"] == pytest.approx(1.0, abs=1e-5)


def test_token_spread_of_identical_tokens_is_zero():
    assert d2lmini.token_spread(torch.ones(5, 3)) == 0.0
    X = torch.randn(6, 4)
    assert d2lmini.token_spread(X - X.mean(0)) == pytest.approx(1.0)


# --------------------------------------------------------------------------- bad input

BAD_CALLS = {
    "num_hiddens not divisible by num_heads": (lambda: TransformerBlock(30, 4), ValueError, "divisible by num_heads"),
    "num_heads not divisible by num_kv_heads": (lambda: MultiHeadAttention(32, 4, num_kv_heads=3), ValueError, "num_kv_heads"),
    "unknown norm": (lambda: TransformerBlock(32, 4, norm="batch"), ValueError, str(d2lmini.NORMS)),
    "unknown act": (lambda: TransformerBlock(32, 4, act="tanh"), ValueError, "swiglu"),
    "unknown placement": (lambda: TransformerBlock(32, 4, placement="middle"), ValueError, "post_sublayer"),
    "negative dropout": (lambda: TransformerBlock(32, 4, dropout=-0.1), ValueError, "dropout"),
    "dropout of type str": (lambda: TransformerBlock(32, 4, dropout="0.1"), TypeError, "dropout"),
    "num_heads zero": (lambda: MultiHeadAttention(32, 0), ValueError, "num_heads"),
    "gain on pre-LN": (lambda: TransformerBlock(32, 4, placement="pre", sublayer_norm_gain=0.1), ValueError, "sublayer_norm_gain"),
    "eps zero": (lambda: RMSNorm(8, eps=0.0), ValueError, "eps"),
    "unknown init": (lambda: d2lmini.probe_depth(init="he"), ValueError, "xavier_uniform"),
    "depth zero": (lambda: d2lmini.probe_depth(depth=0), ValueError, "depth"),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_arguments_raise_clear_errors(case):
    make, error, fragment = BAD_CALLS[case]
    with pytest.raises(error, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        make()


BAD_INPUTS = {
    "rank 2 input": (lambda b: b(torch.randn(5, 32)), ValueError, "num_steps"),
    "wrong last dimension": (lambda b: b(torch.randn(2, 5, 16)), ValueError, "num_hiddens=32"),
    "integer input": (lambda b: b(torch.ones(2, 5, 32, dtype=torch.long)), TypeError, "floating"),
    "valid_lens wrong shape": (lambda b: b(torch.randn(2, 5, 32), torch.tensor([5, 5, 5])), ValueError, "valid_lens must have shape"),
    "valid_lens float": (lambda b: b(torch.randn(2, 5, 32), torch.tensor([5.0, 2.0])), TypeError, "integer dtype"),
    "valid_lens too long": (lambda b: b(torch.randn(2, 5, 32), torch.tensor([6, 2])), ValueError, r"\[1, 5\]"),
    "valid_lens zero": (lambda b: b(torch.randn(2, 5, 32), torch.tensor([0, 2])), ValueError, r"\[1, 5\]"),
    "valid_lens list": (lambda b: b(torch.randn(2, 5, 32), [5, 2]), TypeError, "valid_lens"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_inputs_raise_clear_errors(case):
    call, error, pattern = BAD_INPUTS[case]
    with pytest.raises(error, match=pattern):
        call(TransformerBlock(32, 4))


def test_mismatched_keys_and_values_are_rejected():
    mha = MultiHeadAttention(16, 2)
    with pytest.raises(ValueError, match="keys and values must have the same shape"):
        mha(torch.randn(1, 3, 16), torch.randn(1, 4, 16), torch.randn(1, 5, 16))


@pytest.fixture(scope="module")
def under_dash_O():
    """What one ``python -O`` process (assert statements stripped) prints: a bad block's error,
    then the error types of every catalogued misuse. One process for both tests: each start
    imports torch again."""
    code = (
        "import d2lmini\n"
        "try:\n"
        "    d2lmini.TransformerBlock(30, 4)\n"
        "except ValueError as e:\n"
        "    print('raised:', e)\n"
        "from d2lmini.chapters.errors import misuse_table\n"
        "print(sorted({row['error'] for row in misuse_table()}))\n"
    )
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()


def test_errors_survive_python_dash_O(under_dash_O):
    assert under_dash_O[0].startswith("raised: num_hiddens=30 must be divisible by num_heads=4")


# --------------------------------------------------------------------------- QK-norm, RoPE, head_dim, scale


def test_qk_norm_variants_normalize_where_the_models_do(sdpa_inputs):
    X = torch.randn(2, 6, 32) * 3
    for variant in d2lmini.QK_NORMS:
        mha = MultiHeadAttention(32, 4, num_kv_heads=2, qk_norm=variant)
        for heads in sdpa_inputs(mha, X):  # queries, then keys, as the forward feeds them to SDPA
            if variant == "projection":  # RMS 1 over all heads' features of a token
                rms = heads.transpose(1, 2).flatten(-2).pow(2).mean(-1).sqrt()
            else:  # RMS 1 within every head
                rms = heads.pow(2).mean(-1).sqrt()
            torch.testing.assert_close(rms, torch.ones_like(rms), atol=1e-4, rtol=0)
    plain_q, plain_k = sdpa_inputs(MultiHeadAttention(32, 4, num_kv_heads=2), X)
    assert (plain_q.pow(2).mean(-1).sqrt() - 1).abs().max() > 0.1  # without QK-norm: not RMS 1
    distinct = MultiHeadAttention(32, 4, num_kv_heads=2, qk_norm="per_head_distinct")
    assert distinct.q_norm.weight.shape == (4, 8) and distinct.k_norm.weight.shape == (2, 8)
    shared = MultiHeadAttention(32, 4, qk_norm="per_head")
    assert shared.q_norm.weight.shape == (8,)


def test_qk_norm_makes_attention_invariant_to_the_scale_of_w_q_and_w_k():
    mha = MultiHeadAttention(32, 4, qk_norm="per_head")
    X = torch.randn(2, 6, 32)
    before = mha(X, X, X)
    with torch.no_grad():
        mha.W_q.weight.mul_(50.0)
        mha.W_k.weight.mul_(50.0)
    torch.testing.assert_close(mha(X, X, X), before, atol=1e-4, rtol=1e-4)


def test_rope_scores_depend_only_on_relative_position():
    cos, sin = d2lmini.rotary_cos_sin(12, 8, theta=100.0)
    q, k = torch.randn(8), torch.randn(8)
    Q = d2lmini.apply_rotary(q.expand(1, 1, 12, 8), cos, sin)[0, 0]
    K = d2lmini.apply_rotary(k.expand(1, 1, 12, 8), cos, sin)[0, 0]
    scores = Q @ K.T  # scores[i, j] = <R_i q, R_j k> depends only on j - i
    for offset in (-3, 0, 2):
        diagonal = torch.diagonal(scores, offset)
        torch.testing.assert_close(diagonal, diagonal[0].expand_as(diagonal), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(Q.norm(dim=-1), q.norm().expand(12))  # a rotation keeps lengths


def test_rope_is_applied_after_qk_norm(sdpa_inputs):
    """QK-norm after RoPE would normalize rotated pairs -- a known bug class."""
    mha = MultiHeadAttention(32, 2, qk_norm="per_head", rope_theta=10000.0)
    with torch.no_grad():  # unequal gains: only then does the order show
        mha.q_norm.weight.uniform_(0.5, 2.0)
        mha.k_norm.weight.uniform_(0.5, 2.0)
    X = torch.randn(1, 5, 32)
    cos, sin = d2lmini.rotary_cos_sin(5, 16, 10000.0)

    def heads(W):  # (b, n, d) -> (b, n, heads, head_dim)
        return W(X).unflatten(-1, (2, 16))

    def norm_then_rotate(W, norm):
        return d2lmini.apply_rotary(norm(heads(W)).transpose(1, 2), cos, sin)

    def rotate_then_norm(W, norm):
        return norm(d2lmini.apply_rotary(heads(W).transpose(1, 2), cos, sin).transpose(1, 2)).transpose(1, 2)

    q, k = sdpa_inputs(mha, X)  # what the forward really attends with
    with torch.no_grad():
        torch.testing.assert_close(q, norm_then_rotate(mha.W_q, mha.q_norm), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(k, norm_then_rotate(mha.W_k, mha.k_norm), atol=1e-5, rtol=1e-5)
        assert not torch.allclose(q, rotate_then_norm(mha.W_q, mha.q_norm), atol=1e-3)


def test_head_dim_and_scale_override():
    mha = MultiHeadAttention(48, 4, head_dim=16)  # 4 * 16 != 48 is allowed
    mha.scale = 0.05  # the logit scale, a hook an instance may set
    assert mha.W_q.out_features == 64 and mha.W_o.in_features == 64
    X = torch.randn(1, 3, 48)
    q = mha.W_q(X).unflatten(-1, (4, 16)).transpose(1, 2)
    k = mha.W_k(X).unflatten(-1, (4, 16)).transpose(1, 2)
    v = mha.W_v(X).unflatten(-1, (4, 16)).transpose(1, 2)
    weights = torch.softmax(0.05 * q @ k.transpose(-1, -2), dim=-1)
    expected = mha.W_o((weights @ v).transpose(1, 2).flatten(-2))
    torch.testing.assert_close(mha(X, X, X), expected, atol=1e-6, rtol=1e-5)


def test_bad_qk_norm_and_rope_arguments():
    with pytest.raises(ValueError, match="per_head"):
        MultiHeadAttention(32, 4, qk_norm="after_rope")
    with pytest.raises(ValueError, match="even head_dim"):
        MultiHeadAttention(30, 2, rope_theta=10000.0)
    with pytest.raises(ValueError, match="as many queries as keys"):
        MultiHeadAttention(32, 4, rope_theta=10000.0)(torch.randn(1, 3, 32), torch.randn(1, 5, 32), torch.randn(1, 5, 32))


def test_every_catalogued_misuse_raises_a_clear_error():
    from d2lmini.chapters.errors import MISUSES, misuse_table

    rows = misuse_table()
    assert len(rows) == len(MISUSES) >= 10  # a catalogue, not an empty loop
    for row in rows:
        assert row["error"] in ("ValueError", "TypeError"), row
        assert len(row["message"]) > 20, row


def test_catalogued_misuses_raise_under_python_dash_O(under_dash_O):
    assert under_dash_O[-1] == "['TypeError', 'ValueError']"


# --------------------------------------------------------------------------- one way to do each thing


def _random_gains_(mha: MultiHeadAttention) -> MultiHeadAttention:
    with torch.no_grad():  # gains that are not all one, so the place of every norm matters
        for norm in (mha.q_norm, mha.k_norm):
            if norm is not None:
                norm.weight.uniform_(0.5, 1.5)
    return mha


@pytest.mark.parametrize("qk_norm", (None,) + d2lmini.QK_NORMS)
@pytest.mark.parametrize("rope_theta", (None, 100.0))
@pytest.mark.parametrize("num_kv_heads", (4, 2))
def test_queries_and_keys_are_what_the_kernel_sees(qk_norm, rope_theta, num_kv_heads):
    # Fails if forward feeds the kernel anything but queries_and_keys' output (e.g. its own q/k path
    # without the QK-norm), or if queries_and_keys rotates before normalizing, skips a step, or
    # returns key heads already repeated for grouped-query attention.
    mha = _random_gains_(MultiHeadAttention(32, 4, num_kv_heads=num_kv_heads, qk_norm=qk_norm,
                                            rope_theta=rope_theta, causal=True, bias=True))
    X, valid_lens = torch.randn(2, 6, 32), torch.tensor([6, 4])
    q, k = mha.queries_and_keys(X, X)
    assert q.shape == (2, 4, 6, 8) and k.shape == (2, num_kv_heads, 6, 8)

    # the same by hand: project, QK-norm (whole projection, or per head), split, rotate
    q_hand, k_hand = mha.W_q(X), mha.W_k(X)
    if qk_norm == "projection":
        q_hand, k_hand = mha.q_norm(q_hand), mha.k_norm(k_hand)
    q_hand, k_hand = q_hand.view(2, 6, 4, 8), k_hand.view(2, 6, num_kv_heads, 8)
    if qk_norm in ("per_head", "per_head_distinct"):
        q_hand, k_hand = mha.q_norm(q_hand), mha.k_norm(k_hand)
    q_hand, k_hand = q_hand.transpose(1, 2), k_hand.transpose(1, 2)
    if rope_theta is not None:
        cos, sin = d2lmini.rotary_cos_sin(6, 8, rope_theta)
        q_hand, k_hand = d2lmini.apply_rotary(q_hand, cos, sin), d2lmini.apply_rotary(k_hand, cos, sin)
    torch.testing.assert_close(q, q_hand, atol=0, rtol=0)
    torch.testing.assert_close(k, k_hand, atol=0, rtol=0)

    # forward's output rebuilt from them with the kernel and the output projection
    group = 4 // num_kv_heads
    v = mha.W_v(X).unflatten(-1, (num_kv_heads, 8)).transpose(1, 2)
    mask = (torch.arange(6) < valid_lens[:, None])[:, None, None] & torch.ones(6, 6, dtype=torch.bool).tril()
    heads = nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(group, dim=1),
                                                       v.repeat_interleave(group, dim=1), attn_mask=mask)
    expected = mha.W_o(heads.transpose(1, 2).flatten(-2))
    torch.testing.assert_close(mha(X, X, X, valid_lens), expected, atol=1e-6, rtol=1e-5)


def test_queries_and_keys_checks_its_inputs():
    # Fails if the checks move back into forward only (the public method would accept bad input).
    roped = MultiHeadAttention(16, 2, rope_theta=100.0)
    with pytest.raises(ValueError, match="as many queries as keys"):
        roped.queries_and_keys(torch.randn(1, 3, 16), torch.randn(1, 4, 16))
    with pytest.raises(ValueError, match="same batch size"):
        roped.queries_and_keys(torch.randn(1, 3, 16), torch.randn(2, 3, 16))
    with pytest.raises(ValueError, match="num_hiddens=16"):
        roped.queries_and_keys(torch.randn(1, 3, 8), torch.randn(1, 3, 16))
    with pytest.raises(TypeError, match="dtype"):
        roped.queries_and_keys(torch.randn(1, 3, 16, dtype=torch.float64), torch.randn(1, 3, 16))
    assert MultiHeadAttention(16, 2).logit_scale == 8 ** -0.5
    scaled = MultiHeadAttention(16, 2)
    scaled.scale = 0.3
    assert scaled.logit_scale == 0.3 and MultiHeadAttention.scale is None


KEYWORD_ONLY = {
    "MultiHeadAttention": (MultiHeadAttention, (16, 2, 0.1)),
    "GatedAttention": (d2lmini.GatedAttention, (16, 2, 0.1)),
    "TransformerBlock": (TransformerBlock, (16, 2, 0.1)),
    "TransformerDecoderBlock": (d2lmini.TransformerDecoderBlock, (16, 2, True)),
    "AddNorm": (d2lmini.AddNorm, (16, "pre", "layer")),
    "RMSNorm": (RMSNorm, (8, 1e-6, 1.0)),
    "HeadwiseRMSNorm": (d2lmini.norms.HeadwiseRMSNorm, (2, 4, 1e-6)),
    "SequenceBatchNorm": (d2lmini.norms.SequenceBatchNorm, (8, 1e-5, 0.1)),
    "FeedForward": (FeedForward, (16, 64, "gelu")),
    "MixtureOfExperts": (d2lmini.MixtureOfExperts, (16, 4, 2)),
    "TinyLM": (d2lmini.train.TinyLM, (20, 16, 2)),
    "PlainBlock": (d2lmini.ch02_residual.PlainBlock, (16, 2, "relu")),
    "DepthExplorer": (d2lmini.DepthExplorer, (4, 2, "pre")),
    "DepthProbe": (d2lmini.DepthProbe, ({}, [1.0], [1.0])),
    "CharCorpus": (d2lmini.data.CharCorpus, ("ab", ["a", "b"], torch.zeros(1))),
    "StaticTwin": (d2lmini.StaticTwin, ([], [], {})),
    "FrameExplorer": (d2lmini.FrameExplorer, ([], [], {})),
}


@pytest.mark.parametrize("name", sorted(KEYWORD_ONLY))
def test_arguments_after_the_first_two_are_keyword_only(name):
    # Fails if the `*` is dropped from the constructor's signature.
    cls, positional = KEYWORD_ONLY[name]
    with pytest.raises(TypeError, match="positional argument"):
        cls(*positional)
    import inspect

    params = list(inspect.signature(cls.__init__).parameters.values())[3:]  # after self and the first two
    assert all(p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD) for p in params), name


def test_the_block_and_its_attention_take_what_a_reader_can_hold():
    # Fails if TransformerBlock grows past what a reader can hold, counting what reaches the attention through
    # **attention_kwargs: options only a released model needs come through attn_factory (d2lmini.reference).
    import inspect

    params = inspect.signature(TransformerBlock).parameters
    named = [name for name, p in params.items() if p.kind is not p.VAR_KEYWORD]
    assert [p.name for p in params.values() if p.kind is p.VAR_KEYWORD] == ["attention_kwargs"]
    assert set(named) & set(d2lmini.block.ATTENTION_OPTIONS) == {"dropout", "bias"}  # the block's own
    reaching = named + [name for name in d2lmini.block.ATTENTION_OPTIONS if name not in named]
    assert len(named) <= 13 and len(reaching) <= 21, reaching
    assert len(inspect.signature(MultiHeadAttention).parameters) <= 12
    assert len(inspect.getsourcelines(MultiHeadAttention)[0]) <= 250  # docstrings included


def test_attention_options_reach_the_attention_in_one_place():
    # Fails if an attention option is dropped or renamed on its way from the block to MultiHeadAttention.
    options = dict(num_kv_heads=1, causal=True, head_dim=4, qk_norm="per_head", rope_theta=1e4, window=3,
                   rope_scaling={"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}, sinks=True)
    torch.manual_seed(0)
    block = TransformerBlock(16, 2, **options)
    torch.manual_seed(0)
    alone = MultiHeadAttention(16, 2, **options)
    assert block.attention.extra_repr() == alone.extra_repr()
    assert all(torch.equal(a, b) for a, b in zip(block.attention.state_dict().values(), alone.state_dict().values()))
    with pytest.raises(TypeError, match="unknown argument.*'windw'.*MultiHeadAttention"):
        TransformerBlock(16, 2, windw=3)


ATTENTION_ONLY = dict(num_kv_heads=1, causal=True, head_dim=4, qk_norm="per_head", rope_theta=1e4, window=2)


@pytest.mark.parametrize("argument", sorted(ATTENTION_ONLY))
def test_attention_arguments_with_an_attn_factory_raise(argument):
    # Fails if TransformerBlock stops checking an argument that attn_factory makes meaningless.
    value = ATTENTION_ONLY[argument]
    with pytest.raises(ValueError, match=rf"{argument}={value!r} would be ignored: attn_factory"):
        TransformerBlock(16, 2, attn_factory=lambda: MultiHeadAttention(16, 2), **{argument: value})


@pytest.mark.parametrize("argument, value", [("act", "relu"), ("ffn_num_hiddens", 32)])
def test_ffn_arguments_with_an_ffn_factory_raise(argument, value):
    # Fails if TransformerBlock stops checking an argument that ffn_factory makes meaningless.
    with pytest.raises(ValueError, match=rf"{argument}={value!r} would be ignored: ffn_factory"):
        TransformerBlock(16, 2, ffn_factory=lambda: FeedForward(16), **{argument: value})


def test_factories_keep_the_arguments_they_do_not_replace():
    # Fails if a factory check is too broad (rejects what still applies) or num_heads is not checked.
    block = TransformerBlock(16, 2, attn_factory=lambda: d2lmini.GatedAttention(16, 2, causal=True),
                             act="relu", ffn_num_hiddens=24, bias=True, norm="layer", dropout=0.1)
    assert block.attention.causal and block.ffn.act == "relu" and block.ffn.W_1.out_features == 24
    block = TransformerBlock(16, 2, ffn_factory=lambda: FeedForward(16), causal=True, qk_norm="per_head")
    assert block.attention.causal and block.attention.qk_norm == "per_head"
    with pytest.raises(ValueError, match="num_heads=4 differs from the num_heads=2"):
        TransformerBlock(16, 4, attn_factory=lambda: MultiHeadAttention(16, 2))
    headless = TransformerBlock(16, 3, attn_factory=lambda: nn.Identity())  # no num_heads to check against
    assert isinstance(headless.attention, nn.Identity)


def test_decoder_block_with_an_attn_factory():
    # Fails if the decoder forwards causal/num_kv_heads to a factory-built self-attention (the block
    # would raise), drops them from its cross-attention, or lets causal=False pass silently.
    factory = lambda: MultiHeadAttention(16, 4, causal=True)  # noqa: E731
    block = d2lmini.TransformerDecoderBlock(16, 4, num_kv_heads=2, attn_factory=factory)
    assert block.attention.num_kv_heads == 4 and block.cross_attention.num_kv_heads == 2
    with pytest.raises(ValueError, match="causal=False would be ignored: attn_factory"):
        d2lmini.TransformerDecoderBlock(16, 4, causal=False, attn_factory=factory)
    with pytest.raises(ValueError, match="qk_norm='per_head' would be ignored"):
        d2lmini.TransformerDecoderBlock(16, 4, qk_norm="per_head", attn_factory=factory)


def test_decoder_block_settings_reach_all_three_sublayers():
    # Fails if the third residual connection or the cross-attention ignores a setting, or if the
    # third connection shares its norms with the second (addnorm3 = addnorm2).
    block = d2lmini.TransformerDecoderBlock(24, 4, num_kv_heads=2, head_dim=4, bias=True, dropout=0.1,
                                            norm="layer", placement="sandwich", eps=1e-3,
                                            sublayer_norm_gain=0.5, residual=False)
    cross = block.cross_attention
    assert (cross.num_kv_heads, cross.head_dim, cross.dropout, cross.causal) == (2, 4, 0.1, False)
    assert cross.W_q.bias is not None and block.attention.causal
    for add in (block.addnorm1, block.addnorm2, block.addnorm3):
        assert add.placement == "sandwich" and add.residual is False and add.dropout.p == 0.1
        assert isinstance(add.norm_in, nn.LayerNorm) and add.norm_in.eps == 1e-3
        torch.testing.assert_close(add.norm_out.weight, torch.full((24,), 0.5))
    shared = {id(p) for p in block.addnorm2.parameters()} & {id(p) for p in block.addnorm3.parameters()}
    assert not shared


def test_valid_lens_mask_is_position_below_length():
    # Fails if the comparison becomes <= (one padded position leaks in) or the bounds checks go.
    valid_lens = torch.tensor([3, 0, 5])
    expected = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(d2lmini.valid_lens_mask(valid_lens, 5), expected)
    per_query = torch.tensor([[1, 2], [2, 2]])
    assert d2lmini.valid_lens_mask(per_query, 3).shape == (2, 2, 3)
    assert torch.equal(d2lmini.valid_lens_mask(per_query, 3)[0], torch.tensor([[1, 0, 0], [1, 1, 0]], dtype=torch.bool))
    assert d2lmini.valid_lens_mask(None, 5) is None
    with pytest.raises(ValueError, match=r"\[1, 5\], got min 0"):
        d2lmini.valid_lens_mask(valid_lens, 5, min_len=1)
    with pytest.raises(ValueError, match=r"\[0, 4\]"):
        d2lmini.valid_lens_mask(valid_lens, 4)
    with pytest.raises(TypeError, match="integer dtype"):
        d2lmini.valid_lens_mask(valid_lens.float(), 5)


def test_additive_mask_is_the_boolean_mask_made_additive():
    # Fails if additive_mask builds its own padding rule that disagrees with valid_lens_mask.
    from d2lmini.reference import additive_mask

    valid_lens = torch.tensor([4, 2])
    mask = additive_mask(valid_lens, 4, causal=True)
    allowed = d2lmini.valid_lens_mask(valid_lens, 4)[:, None, :] & torch.ones(4, 4, dtype=torch.bool).tril()
    assert mask.shape == (2, 1, 4, 4)
    assert torch.equal(mask[:, 0] == 0, allowed)
    assert torch.equal(mask[:, 0][~allowed], torch.full(((~allowed).sum().item(),), torch.finfo(torch.float32).min))
    assert torch.equal(additive_mask(None, 3, causal=False, batch_size=2), torch.zeros(2, 1, 3, 3))


def test_a_module_passed_as_its_own_factory_raises_a_clear_error():
    """A module is callable, so attn_factory=module would run its forward with no input; the
    message says to pass the class or a function returning the module."""
    from torch import nn

    from d2lmini import TransformerBlock

    for name, module in (("attn_factory", MultiHeadAttention(16, 2)), ("ffn_factory", nn.Identity())):
        with pytest.raises(TypeError, match=rf"{name} must build the module, not be it"):
            TransformerBlock(16, 2, **{name: module})
