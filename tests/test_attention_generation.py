"""The experiments of the chapter "Attention for generation" (d2lmini.chapters.ch08_attention_generation)."""

from __future__ import annotations

import pytest
import torch

import d2lmini
from d2lmini.chapters import ch08_attention_generation as gen


def test_kv_cache_rows_at_real_sizes():
    rows = {r["attention"]: r for r in gen.kv_cache_rows(gen.attention_variants(gen.LLAMA3_8B),
                                                            num_layers=32, context=128 * 1024)}
    assert rows["MHA"]["numbers"] == 2 * 32 * 128 and rows["MQA"]["numbers"] == 2 * 128
    assert rows["GQA (8 groups)"]["bytes"] == 2 * 8 * 128 * 2
    assert rows["GQA (8 groups)"]["GiB"] == pytest.approx(16.0)
    deepseek = {r["attention"]: r for r in gen.kv_cache_rows(gen.attention_variants(gen.DEEPSEEK_V3),
                                                                num_layers=61, context=1)}
    assert deepseek["MLA"]["numbers"] == 512 + 64
    assert deepseek["MLA"]["parameters"] < deepseek["MHA"]["parameters"]


def test_attention_variants_refuses_other_sizes():
    with pytest.raises(ValueError, match="LLAMA3_8B"):
        gen.attention_variants(dict(gen.LLAMA3_8B))



@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_decode_step_equals_recomputing_the_prefix(num_kv_heads):
    torch.manual_seed(0)
    attention = d2lmini.MultiHeadAttention(32, 4, num_kv_heads=num_kv_heads, causal=True)
    X = torch.randn(2, 9, 32)
    with torch.no_grad():
        out, (k, v) = gen.decode_step(attention, X)
        torch.testing.assert_close(out, attention(X, X, X))
        assert k.shape == v.shape == (2, num_kv_heads, 9, 8)
        _, cache = gen.decode_step(attention, X[:, :3])
        out, cache = gen.decode_step(attention, X[:, 3:5], cache)  # two new tokens at once
        torch.testing.assert_close(out, attention(X[:, :5], X[:, :5], X[:, :5])[:, 3:])
        for t in range(5, 9):
            out, cache = gen.decode_step(attention, X[:, t:t + 1], cache)
            torch.testing.assert_close(out[:, 0], attention(X[:, :t + 1], X[:, :t + 1], X[:, :t + 1])[:, -1])


def test_decode_step_refuses_what_it_does_not_reproduce():
    with pytest.raises(ValueError, match="rope_theta"):
        gen.decode_step(d2lmini.MultiHeadAttention(32, 4, causal=True, rope_theta=1e4), torch.randn(1, 3, 32))
    with pytest.raises(ValueError, match="causal=False"):
        gen.decode_step(d2lmini.MultiHeadAttention(32, 4), torch.randn(1, 3, 32))
    with pytest.raises(TypeError, match="attention"):
        gen.decode_step(torch.nn.Linear(32, 32), torch.randn(1, 3, 32))
    attention = d2lmini.MultiHeadAttention(32, 4, num_kv_heads=2, causal=True)
    _, cache = gen.decode_step(attention, torch.randn(1, 3, 32))
    with pytest.raises(ValueError, match="cache"):
        gen.decode_step(attention, torch.randn(2, 1, 32), cache)  # another batch size
    with pytest.raises(ValueError, match="cache"):
        gen.decode_step(attention, torch.randn(1, 1, 32), cache[0])


def test_time_next_token_reports_each_prefix():
    rows = gen.time_next_token(d2lmini.MultiHeadAttention(16, 2, causal=True), [1, 4], repeats=1)
    assert [row["prefix"] for row in rows] == [1, 4]
    assert all(row["recompute (ms)"] > 0 and row["cached (ms)"] > 0 for row in rows)
    with pytest.raises(TypeError, match="attention"):
        gen.time_next_token(torch.nn.Linear(4, 4), [1])
    with pytest.raises(ValueError, match="prefix_lens"):
        gen.time_next_token(d2lmini.MultiHeadAttention(16, 2, causal=True), [0])


def test_mla_parameters_by_projection():
    rows = {r["attention"]: r for r in gen.parameters_by_projection(gen.mla_parameter_variants())}
    mha, full, mla = rows["MHA"], rows["MLA, full-rank queries"], rows["MLA"]
    d, h = 7168, 128
    assert mha["keys and values"] == 2 * d * h * 128 and mha["total"] == 4 * d * h * 128
    assert full["queries"] - mha["queries"] == d * h * 64  # the rotary query features
    assert full["keys and values"] == mla["keys and values"] == d * (512 + 64) + 512 + 512 * h * 256
    assert mla["queries"] == d * 1536 + 1536 + 1536 * h * 192
    assert (full["queries"] - mha["queries"]) / mha["total"] == pytest.approx(0.125)
    assert all(r["total"] == r["queries"] + r["keys and values"] + r["output"] for r in rows.values())
