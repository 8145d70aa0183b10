"""The block zoo's 2026 table and 2026 block (d2lmini.chapters.zoo, chapters/zoo.ipynb)."""

from __future__ import annotations

import pytest
import torch

from d2lmini.chapters import zoo

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def rows():
    return zoo.table_2026(seed=0)


def test_every_model_is_there_in_release_order(rows):
    assert [r["model"] for r in rows] == [row.model for row in zoo.ROWS_2026]
    assert {r["model"] for r in rows} == set(zoo.MODELING)
    assert [r["year"] for r in rows] == sorted(r["year"] for r in rows)


def test_rows_with_a_check_are_verified_and_the_others_say_what_is_missing(rows):
    for r in rows:
        if r["check"] is None:
            assert r["status"] == "not reproduced here" and r["missing"], r["model"]
        else:
            assert r["status"] == "verified", r
            assert max(r["max_abs_diff"], r["max_abs_grad_diff"]) <= zoo.TOLERANCE
    assert sum(r["status"] == "verified" for r in rows) == 10


def test_columns_are_read_from_the_configuration_classes(rows):
    by = {r["model"]: r for r in rows}
    assert by["Qwen3.5"]["mixer"].endswith("(3:1)") and "output gate" in by["Qwen3.5"]["attention"]
    assert by["DeepSeek-V4"]["residual"] == "4 streams (mHC)" and "MQA" in by["DeepSeek-V4"]["attention"]
    assert "local:global 1:1" in by["gpt-oss"]["attention"] and "YaRN" not in by["gpt-oss"]["positions"]
    assert "clamped SwiGLU" in by["gpt-oss"]["ffn"] and "CSA" in by["DeepSeek-V4"]["attention"]
    assert "class default" in by["Kimi K2.5"]["positions"] and "class default" in by["Qwen3.5"]["positions"]
    # V4-Flash's shape and RoPE base are DeepseekV4Config's defaults, marked as such; its default
    # pattern has only CSA and HCA layers, whose RoPE is "compress": the sliding-only "main" is not its
    assert by["DeepSeek-V4"]["shape"].startswith("43 layers, d = 4096 (class defaults")
    assert by["DeepSeek-V4"]["positions"].startswith("RoPE θ = 160,000 (class default) on 0.125")
    assert "sliding" not in by["DeepSeek-V4"]["positions"]
    assert by["gpt-oss"]["size"] == "gpt-oss-120b" and by["Gemma 4"]["size"] is None
    assert "NoPE in 12 of 48 layers" in by["Llama 4"]["positions"]
    assert by["Kimi K2.5"]["ffn"].startswith("MoE, 384 SwiGLU experts, 8 active + 1 shared")
    assert by["DeepSeek-V3"]["ffn"].startswith("MoE, 256 SwiGLU experts")  # Kimi's report values stay on its row
    assert "DSA" in by["GLM-5"]["attention"] and by["Gemma 4"]["ffn"].startswith("dense GeGLU")
    assert by["OLMo 3"]["local_global"] == "3:1" and by["DeepSeek-V3"]["local_global"] is None
    assert by["Llama 4"]["local_global"] is None  # chunks are not a sliding window
    assert "class defaults" in zoo.frame_2026(rows).index[[r["model"] for r in rows].index("Gemma 4")]


def test_kimi_is_deepseek_v3s_layer_class():
    kimi = next(row for row in zoo.ROWS_2026 if row.model == "Kimi K2.5")
    assert type(zoo.config_2026(kimi)).__name__ == "DeepseekV3Config"
    assert zoo.config_2026(kimi).n_routed_experts == 384


def test_feature_counts(rows):
    counts = zoo.feature_counts(rows)
    released = sum(r["size"] is not None for r in rows)
    assert released == 8 and counts.loc["RMSNorm", "rows"] == counts.loc["RoPE (by inspection)", "rows"] == released
    assert "Gemma 4" not in counts.loc["RMSNorm", "models"]  # class defaults are not counted
    assert "DeepSeek-V3" in counts.loc["partial RoPE (incl. MLA's rotary slice)", "models"]
    assert counts.loc["softmax layers without positions (NoPE)", "models"] == "Llama 4"  # not Qwen3.5's DeltaNet
    assert counts.loc["hyper-connections", "models"] == "DeepSeek-V4"
    assert counts.loc["linear attention (hybrid)", "models"] == "Qwen3.5"
    assert list(counts["rows"]) == sorted(counts["rows"], reverse=True)


def test_a_class_this_transformers_lacks_is_reported(monkeypatch):
    def missing(*args):
        raise ModuleNotFoundError("no module", name="transformers.models.gemma4")

    monkeypatch.setattr(zoo, "config_2026", missing)
    monkeypatch.setitem(zoo.CHECKS, "gpt-oss", missing)
    rows = zoo.table_2026()
    assert all(r["status"].startswith("not in this transformers") for r in rows)
    gpt_oss = next(row for row in zoo.ROWS_2026 if row.model == "gpt-oss")
    assert zoo.verify_2026(gpt_oss)["status"].startswith("not in this transformers")


def test_other_failures_and_mismatches_are_not_hidden(monkeypatch):
    gpt_oss = next(row for row in zoo.ROWS_2026 if row.model == "gpt-oss")
    monkeypatch.setitem(zoo.CHECKS, "gpt-oss", lambda seed: [{"max_abs_diff": 0.0, "max_abs_grad_diff": 1.0}])
    assert zoo.verify_2026(gpt_oss)["status"] == "MISMATCH"

    def broken(seed):
        raise AttributeError("a real bug")

    monkeypatch.setitem(zoo.CHECKS, "gpt-oss", broken)
    with pytest.raises(AttributeError, match="real bug"):
        zoo.verify_2026(gpt_oss)


def test_deepseek_v4_wiring_check_matches_and_depends_on_the_streams():
    result = zoo.deepseek_v4_wiring_check(seed=0)
    assert max(result["max_abs_diff"], result["max_abs_grad_diff"]) <= zoo.TOLERANCE
    assert result["max_abs_output"] > 0.1
    assert zoo.deepseek_v4_wiring_check(seed=0, num_streams=2)["max_abs_diff"] <= zoo.TOLERANCE


def test_the_2026_block_stack():
    stack = zoo.the_2026_block(64, 4, num_layers=8, num_kv_heads=2, window=5, local_global="3:1",
                                   num_experts=4, top_k=2, expert_hiddens=32)
    assert [b.attention.window for b in stack] == [5, 5, 5, None] * 2
    b = stack[0]
    assert (b.norm, b.placement, b.attention.num_kv_heads, b.attention.qk_norm) == ("rms", "pre", 2, None)
    assert b.ffn.router_kind == "sigmoid" and b.ffn.num_shared_experts == 1
    X = torch.randn(2, 12, 64)
    for block in stack:
        X = block(X)
    assert X.shape == (2, 12, 64) and torch.isfinite(X).all()
    stack = zoo.the_2026_block(64, 4, num_layers=2, qk_norm="per_head", num_experts=4, expert_hiddens=32)
    assert [b.attention.window for b in stack] == [None, None] and stack[0].attention.qk_norm == "per_head"
    with pytest.raises(ValueError, match="local_global"):
        zoo.the_2026_block(64, 4, local_global="3-1")
