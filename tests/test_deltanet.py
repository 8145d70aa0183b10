"""Gated DeltaNet (d2lmini.deltanet) against Hugging Face ``Qwen3_5GatedDeltaNet``.

Checked against ``transformers`` 5.24 ``models/qwen3_5/modeling_qwen3_5.py``: the module
(``Qwen3_5GatedDeltaNet.forward``, with ``apply_mask_to_padding_states``, ``causal_conv1d_fn``,
``l2norm``, ``Qwen3_5RMSNormGated``) on its torch path (no ``fla``/``causal_conv1d`` kernels),
and the rule alone against ``torch_recurrent_gated_delta_rule`` and ``torch_chunk_gated_delta_rule``.
Every parameter is randomized (projections, conv weights, ``A_log``, ``dt_bias``, the norm gain).

Tolerances. HF computes the rule, ``exp(A_log)`` and the gated norm in float32 even for float64
inputs (so a float64 comparison is no tighter), and its forward uses the
*chunked* form, whose triangular solves sum in another order than the loop. So: the rule is
compared in float32 to 1e-5 (outputs, final state, input gradients); the module's wiring is
compared to 1e-5 with HF's rule call replaced by our loop; and the real,
unmodified HF module in float32 to 1e-5 on outputs and to ``1e-5 * max|grad|`` on input gradients
(measured: up to 9.0e-5 absolute on gradients of size 21, 4.3e-6 relative -- as large as HF's own
chunked form differs from HF's own loop in the same module, 7.3e-5: float32 summation order, not math).
"""

import inspect

import pytest
import torch

from d2lmini import reference
from d2lmini.attention import MultiHeadAttention
from d2lmini.block import TransformerBlock
from d2lmini.deltanet import GatedDeltaNet, gated_delta_rule, inference_state_bytes, l2_normalize
from d2lmini.reference import from_qwen3_5_gated_deltanet

tf = pytest.importorskip("transformers")
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf_qwen35  # noqa: E402
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig  # noqa: E402

TOL = 1e-5
B, N, D = 3, 70, 32          # 70 > 64: HF's chunked form crosses a chunk boundary
VALID = torch.tensor([70, 41, 5])


def _hf_layer(seed=0, num_k_heads=2, num_v_heads=4, dtype=torch.float32):
    """A tiny HF Qwen3_5GatedDeltaNet with every parameter randomized, in eval mode."""
    cfg = Qwen3_5TextConfig(hidden_size=D, linear_num_key_heads=num_k_heads, linear_num_value_heads=num_v_heads,
                            linear_key_head_dim=8, linear_value_head_dim=6, linear_conv_kernel_dim=4,
                            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                            vocab_size=16)
    torch.manual_seed(seed)
    layer = hf_qwen35.Qwen3_5GatedDeltaNet(cfg, 0)
    reference.randomize_(layer, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # decays of every speed, and conv taps well away from 0
        layer.A_log.copy_(torch.rand(layer.A_log.shape, generator=gen) * 3 - 2)
        layer.dt_bias.copy_(torch.rand(layer.dt_bias.shape, generator=gen) * 2 - 1)
        layer.conv1d.weight.mul_(3)
    return layer.to(dtype).eval()


def _differences(hf, ours, padded: bool, dtype=torch.float32):
    gen = torch.Generator().manual_seed(7)
    X = torch.randn(B, N, D, generator=gen).to(dtype)
    R = torch.randn(B, N, D, generator=gen).to(dtype)
    mask = torch.arange(N) < VALID[:, None]
    keep = mask[..., None] if padded else torch.ones(B, N, 1, dtype=torch.bool)
    runs = [lambda Z: hf(Z, attention_mask=mask.long() if padded else None),
            lambda Z: ours(Z, valid_lens=VALID if padded else None)]
    return reference.output_and_grad_differences(runs, X, R, keep)


def _max_grad(module, dtype=torch.float32):
    gen = torch.Generator().manual_seed(7)
    X = torch.randn(B, N, D, generator=gen).to(dtype).requires_grad_(True)
    R = torch.randn(B, N, D, generator=gen).to(dtype)
    (module(X) * R).sum().backward()
    return float(X.grad.abs().max())


def test_hf_runs_its_torch_fallbacks():
    """The comparison is with HF's torch code, not an fla / causal_conv1d kernel."""
    for fn in (hf_qwen35.torch_chunk_gated_delta_rule, hf_qwen35.torch_recurrent_gated_delta_rule,
               hf_qwen35.causal_conv1d_fn, hf_qwen35.causal_conv1d_update):
        assert inspect.getclosurevars(fn).nonlocals["is_new_implementation"] is False, fn.__name__


# ------------------------------------------------------------------ the rule alone


def _rule_inputs(seed=0, b=2, n=150, hk=2, hv=4, dk=8, dv=6):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(b, n, hk, dk, generator=gen), torch.randn(b, n, hk, dk, generator=gen)
    v = torch.randn(b, n, hv, dv, generator=gen)
    g = -torch.rand(b, n, hv, generator=gen) * 2
    beta = torch.rand(b, n, hv, generator=gen)
    S0 = torch.randn(b, hv, dk, dv, generator=gen)
    return [x.requires_grad_(True) for x in (q, k, v, g, beta)], S0


def _ours_rule(q, k, v, g, beta, S0):
    """Our loop fed as HF's functions feed theirs (l2norm, q scaling and head repetition outside)."""
    r = v.shape[2] // k.shape[2]
    qq = l2_normalize(q).repeat_interleave(r, dim=2) * q.shape[-1] ** -0.5
    kk = l2_normalize(k).repeat_interleave(r, dim=2)
    return gated_delta_rule(qq, kk, v, g, beta, S0)


@pytest.mark.parametrize("hf_rule", ["torch_recurrent_gated_delta_rule", "torch_chunk_gated_delta_rule"])
def test_rule_matches_hf_recurrent_and_chunked(hf_rule):
    """Same outputs, final state and input gradients as HF's loop and chunked (64-token) forms, float32."""
    results = []
    for rule in (lambda *a: getattr(hf_qwen35, hf_rule)(*a[:5], initial_state=a[5], output_final_state=True,
                                                        use_qk_l2norm_in_kernel=True), _ours_rule):
        inputs, S0 = _rule_inputs()
        out, S = rule(*inputs, S0)
        R = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
        ((out * R).sum() + S.sum()).backward()
        results.append((out.detach(), S.detach(), [x.grad for x in inputs]))
    (o1, S1, g1), (o2, S2, g2) = results
    assert (o1 - o2).abs().max() <= TOL
    assert (S1 - S2).abs().max() <= TOL
    for a, b in zip(g1, g2):
        assert (a - b).abs().max() <= TOL


def test_rule_beta_one_overwrites():
    """With a unit key, beta = 1 and no decay, the state returns exactly the value just written."""
    k = l2_normalize(torch.randn(1, 2, 1, 4))
    k[:, 1] = k[:, 0]  # the same key twice, two different values
    v = torch.randn(1, 2, 1, 3)
    out, S = gated_delta_rule(k, k, v, torch.zeros(1, 2, 1), torch.ones(1, 2, 1))
    torch.testing.assert_close(out[:, 1], v[:, 1])
    torch.testing.assert_close(torch.einsum("bhkv,bhk->bhv", S, k[:, 0]), v[:, 1])


# ------------------------------------------------------------------ the module


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("heads", [(2, 4), (2, 2)])
def test_module_matches_hf_float32(padded, heads):
    """The unmodified HF module (chunked rule): outputs to 1e-5, input gradients to 1e-5 relative."""
    hf = _hf_layer(num_k_heads=heads[0], num_v_heads=heads[1])
    ours = from_qwen3_5_gated_deltanet(hf)
    d = _differences(hf, ours, padded)
    assert d["max_abs_diff"] <= TOL, d
    assert d["max_abs_grad_diff"] <= TOL * max(1.0, _max_grad(ours)), d


@pytest.mark.parametrize("padded", [False, True])
def test_module_wiring_matches_hf(padded, monkeypatch):
    """Projections, conv, gates, masking and the gated norm to 1e-5 (outputs and input gradients).

    HF's call of its chunked rule is replaced by our loop (checked against HF's two rules
    above), so only the rest of HF's forward is compared: no summation-order slack needed.
    """
    def our_rule(q, k, v, g, beta, initial_state=None, use_qk_l2norm_in_kernel=True, **kwargs):
        assert use_qk_l2norm_in_kernel
        return _ours_rule(q, k, v, g, beta, initial_state)

    monkeypatch.setattr(hf_qwen35, "torch_chunk_gated_delta_rule", our_rule)
    hf = _hf_layer()
    d = _differences(hf, from_qwen3_5_gated_deltanet(hf), padded)
    assert d["max_abs_diff"] <= TOL and d["max_abs_grad_diff"] <= TOL, d


def test_padding_matches_hf_at_every_position():
    """Padded positions too: their input is zeroed first, as HF's apply_mask_to_padding_states."""
    hf = _hf_layer()
    ours = from_qwen3_5_gated_deltanet(hf)
    X = torch.randn(B, N, D)
    mask = torch.arange(N) < VALID[:, None]
    with torch.no_grad():
        assert (hf(X, attention_mask=mask.long()) - ours(X, valid_lens=VALID)).abs().max() <= TOL
        # and valid positions ignore what the padding holds (causal)
        Y1 = ours(X, valid_lens=VALID)
        Y2 = ours(torch.where(mask[..., None], X, torch.randn(B, N, D)), valid_lens=VALID)
        assert torch.equal(Y1[mask], Y2[mask])


@pytest.mark.parametrize("pieces", [[1] * 12, [5, 1, 6], [3, 9]])
def test_streaming_equals_whole_sequence(pieces):
    """Running a sequence in pieces with the carried (conv, recurrent) state gives the whole-sequence output."""
    ours = from_qwen3_5_gated_deltanet(_hf_layer())
    X = torch.randn(2, sum(pieces), D)
    with torch.no_grad():
        whole, (conv_whole, S_whole) = ours(X, return_state=True)
        outs, state, start = [], None, 0
        for size in pieces:
            Y, state = ours(X[:, start:start + size], state=state, return_state=True)
            outs.append(Y)
            start += size
    assert (torch.cat(outs, dim=1) - whole).abs().max() <= TOL
    assert (state[1] - S_whole).abs().max() <= TOL and (state[0] - conv_whole).abs().max() <= TOL


def test_options_change_the_output():
    """The state, the padding, the decay and the gate all matter (so the tests above can fail)."""
    ours = from_qwen3_5_gated_deltanet(_hf_layer())
    X = torch.randn(B, 10, D)
    with torch.no_grad():
        Y, state = ours(X, return_state=True)
        assert not torch.allclose(ours(X, state=state), Y)
        Y_pad = ours(X, valid_lens=torch.tensor([10, 4, 2]))
        assert torch.equal(Y_pad[0], Y[0]) and not torch.allclose(Y_pad[1], Y[1])
        ours.A_log.add_(1.0)
        assert not torch.allclose(ours(X), Y)


def test_is_a_drop_in_token_mixer_for_the_block():
    """TransformerBlock(attn_factory=...) calls it as attn(X, X, X, valid_lens)."""
    block = TransformerBlock(D, 2, attn_factory=lambda: GatedDeltaNet(
        D, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=6))
    X = torch.randn(2, 7, D)
    Y = block(X, torch.tensor([7, 3]))
    assert Y.shape == X.shape
    # causal: a later token does not change an earlier output
    X2 = X.clone()
    X2[:, -1] += 1
    torch.testing.assert_close(block(X2)[:, :-1], block(X)[:, :-1])


def test_state_bytes_constant_vs_kv_cache_growing():
    with torch.device("meta"):
        gdn = GatedDeltaNet(4096, num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128)
        attn = MultiHeadAttention(4096, 16, num_kv_heads=4, head_dim=256, causal=True)
        local = MultiHeadAttention(4096, 16, num_kv_heads=4, head_dim=256, causal=True, window=1024)
    bf16 = torch.bfloat16
    expected = (32 * 128 * 128 + (2 * 16 * 128 + 32 * 128) * 3) * 2
    assert inference_state_bytes(gdn, 1024, dtype=bf16) == inference_state_bytes(gdn, 262144, dtype=bf16) == expected
    assert inference_state_bytes(attn, 1024, dtype=bf16) == 2 * 4 * 256 * 1024 * 2
    assert inference_state_bytes(attn, 262144, dtype=bf16) == 256 * inference_state_bytes(attn, 1024, dtype=bf16)
    assert inference_state_bytes(local, 262144, dtype=bf16) == inference_state_bytes(attn, 1024, dtype=bf16)
    assert inference_state_bytes(gdn, 5, batch_size=3, dtype=torch.float32) == 3 * 2 * expected


# ------------------------------------------------------------------ bad input


def _small():
    return GatedDeltaNet(D, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=6)


@pytest.mark.parametrize("kwargs, error, name", [
    (dict(num_k_heads=3, num_v_heads=4), ValueError, "num_v_heads"),
    (dict(num_k_heads=0), ValueError, "num_k_heads"),
    (dict(head_k_dim=2.0), TypeError, "head_k_dim"),
    (dict(conv_kernel_size=0), ValueError, "conv_kernel_size"),
    (dict(eps=0.0), ValueError, "eps"),
])
def test_bad_constructor_arguments(kwargs, error, name):
    args = {**dict(num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=6), **kwargs}
    with pytest.raises(error, match=name):
        GatedDeltaNet(D, **args)


def test_bad_call_arguments():
    m, X = _small(), torch.randn(2, 5, D)
    with pytest.raises(ValueError, match="X"):
        m(torch.randn(2, 5, D + 1))
    with pytest.raises(TypeError, match="X"):
        m(X.double())
    with pytest.raises(ValueError, match="keys"):
        m(X, torch.randn(2, 5, D))
    with pytest.raises(TypeError, match="valid_lens"):
        m(X, valid_lens=torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="valid_lens"):
        m(X, valid_lens=torch.tensor([6, 2]))
    with pytest.raises(ValueError, match="valid_lens"):
        m(X, valid_lens=torch.full((2, 5), 3))
    with pytest.raises(ValueError, match="return_state"):
        m(X, valid_lens=torch.tensor([5, 2]), return_state=True)
    with pytest.raises(TypeError, match="return_state"):
        m(X, return_state=1)
    with pytest.raises(TypeError, match="state"):
        m(X, state=torch.zeros(2))
    _, (conv, S) = m(X, return_state=True)
    with pytest.raises(ValueError, match="recurrent_state"):
        m(X, state=(conv, S[:1]))
    with pytest.raises(ValueError, match="conv_state"):
        m(X, state=(conv[..., :1], S))


def test_bad_rule_and_state_bytes_arguments():
    (q, k, v, g, beta), _ = _rule_inputs(n=3)
    with pytest.raises(ValueError, match="beta"):
        gated_delta_rule(q, k, v[:, :, :2], g[:, :, :2], beta)  # heads must agree after repetition
    with pytest.raises(ValueError, match="q"):
        gated_delta_rule(q[..., :4], k, v, g, beta)
    with pytest.raises(TypeError, match="g"):
        gated_delta_rule(q, k, v, [0.0], beta)
    with pytest.raises(TypeError, match="module"):
        inference_state_bytes(torch.nn.Linear(2, 2), 10)
    with pytest.raises(ValueError, match="num_steps"):
        inference_state_bytes(_small(), -1)
    with pytest.raises(TypeError, match="dtype"):
        inference_state_bytes(_small(), 1, dtype="bf16")
    with pytest.raises(TypeError, match="layer"):
        from_qwen3_5_gated_deltanet(torch.nn.Linear(2, 2))


def _print_measurements():  # pragma: no cover - run by hand: python tests/test_deltanet.py
    for heads in [(2, 4), (2, 2)]:
        for padded in (False, True):
            hf = _hf_layer(num_k_heads=heads[0], num_v_heads=heads[1])
            ours = from_qwen3_5_gated_deltanet(hf)
            print("real HF", heads, "padded" if padded else "unpadded", _differences(hf, ours, padded),
                  "max|grad|", _max_grad(ours))


if __name__ == "__main__":
    _print_measurements()
