"""Speed and memory of d2lmini's block against named peers, measured in one process.

Prints one line per measure, ``NAME ratio=R target<=T``, with R = d2lmini / peer:

* ``block_llama_time`` / ``block_llama_memory``: forward + backward of a Llama-shaped
  block (d=512, 8 heads, 2 key/value heads, SwiGLU, RoPE, causal; batch 8 x 256 tokens,
  float32, CPU) against Hugging Face ``LlamaDecoderLayer`` (SDPA) holding the same weights.
* ``block_mistral_window_time``: forward + backward of a Mistral-shaped block with
  sliding-window attention (d=512, 8 heads, 2 key/value heads, window 128; batch 4 x 512
  tokens) against Hugging Face ``MistralDecoderLayer`` (SDPA) holding the same weights,
  given its explicit sliding-window causal mask (key j visible to query i iff
  i - 128 < j <= i, as ``masking_utils.sliding_window_overlay``).
* ``block_encoder_time`` / ``block_encoder_memory``: a LayerNorm/GELU pre-LN block against
  ``torch.nn.TransformerEncoderLayer(norm_first=True, activation='gelu')``, same shape.
* ``rmsnorm_time``: forward + backward of ``d2lmini.RMSNorm`` against ``torch.nn.RMSNorm``
  (same eps) on a (8, 256, 512) float32 tensor.

Time is the median over repeated runs, the two contenders alternating so that both
see the same machine state. Memory is the number of bytes autograd saves for the
backward pass (distinct storages), which is what forward + backward adds on top of
the weights; it is exact and repeatable, unlike the process's resident size.

Run: ``python benchmarks/bench_block.py`` (``--quick`` for fewer repeats).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
from torch import nn

import d2lmini
from d2lmini.reference import (
    additive_mask,
    from_llama_layer,
    from_mistral_layer,
    from_torch_encoder_layer,
)


def saved_bytes(fn) -> int:
    """Bytes of the distinct tensor storages autograd saves while ``fn()`` runs its forward."""
    storages = {}

    def pack(t):
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    out.sum().backward()
    return sum(storages.values())


def median_times(fns: dict, repeats: int, warmup: int = 2) -> dict:
    """Median wall time of each zero-argument callable, run alternately."""
    times = {name: [] for name in fns}
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def forward_backward(module_call, X):
    def run():
        Z = X.detach().requires_grad_(True)
        out = module_call(Z)
        out.sum().backward()
        return out

    return run


def report(name: str, ratio: float, target: str, detail: str) -> None:
    print(f"{name} ratio={ratio:.3f} target{target}   # {detail}", flush=True)


def main(quick: bool = False) -> None:
    torch.manual_seed(0)
    repeats = 5 if quick else 15
    print(f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads, float32 CPU")
    batch, steps, d = 8, 256, 512

    # Llama-shaped block vs LlamaDecoderLayer (SDPA), same weights.
    import transformers as tf

    config = tf.LlamaConfig(hidden_size=d, num_attention_heads=8, num_key_value_heads=2,
                            intermediate_size=1368, num_hidden_layers=1, rope_theta=500000.0)
    config._attn_implementation = "sdpa"
    llama = tf.models.llama.modeling_llama.LlamaDecoderLayer(config, layer_idx=0).train()
    ours = from_llama_layer(llama, config).train()
    rotary = tf.models.llama.modeling_llama.LlamaRotaryEmbedding(config)
    X = torch.randn(batch, steps, d)
    position_ids = torch.arange(steps)[None].expand(batch, -1)
    mask = additive_mask(None, steps, causal=True, batch_size=batch)

    def llama_call(Z):
        # An explicit causal mask, as the model passes whenever a batch has padding; with
        # attention_mask=None SDPA's is_causal kernel runs instead, about 2x slower on this CPU.
        # The model computes RoPE's cos/sin once per forward for all layers; it is counted here.
        return llama(Z, attention_mask=mask, position_embeddings=rotary(Z, position_ids), position_ids=position_ids)

    with torch.no_grad():
        torch.testing.assert_close(ours(X), llama_call(X), atol=1e-4, rtol=1e-4)
    t = median_times({"ours": forward_backward(ours, X), "peer": forward_backward(llama_call, X)}, repeats)
    report("block_llama_time", t["ours"] / t["peer"], "<=1.0",
           f"d2lmini {t['ours'] * 1e3:.1f} ms vs LlamaDecoderLayer {t['peer'] * 1e3:.1f} ms")
    m_ours, m_peer = saved_bytes(lambda: ours(X.requires_grad_(True))), saved_bytes(lambda: llama_call(X))
    report("block_llama_memory", m_ours / m_peer, "<=1.0",
           f"saved for backward: d2lmini {m_ours / 2**20:.1f} MiB vs {m_peer / 2**20:.1f} MiB")

    # Sliding-window (Mistral) block vs MistralDecoderLayer (SDPA), same weights, window 128 of 512 tokens.
    window, win_batch, win_steps = 128, 4, 512
    config = tf.MistralConfig(hidden_size=d, num_attention_heads=8, num_key_value_heads=2, intermediate_size=1368,
                              num_hidden_layers=1, sliding_window=window)
    config._attn_implementation = "sdpa"
    mistral = tf.models.mistral.modeling_mistral.MistralDecoderLayer(config, layer_idx=0).train()
    ours_win = from_mistral_layer(mistral, config).train()
    rotary = tf.models.mistral.modeling_mistral.MistralRotaryEmbedding(config)
    X = torch.randn(win_batch, win_steps, d)
    position_ids = torch.arange(win_steps)[None].expand(win_batch, -1)
    i, j = torch.arange(win_steps)[:, None], torch.arange(win_steps)[None, :]
    band = (j <= i) & (j > i - window)  # the model's sliding_window_overlay, and-ed with causal
    win_mask = torch.zeros(win_steps, win_steps).masked_fill(~band, torch.finfo(torch.float32).min)
    win_mask = win_mask.expand(win_batch, 1, -1, -1)

    def mistral_call(Z):
        return mistral(Z, attention_mask=win_mask, position_embeddings=rotary(Z, position_ids),
                       position_ids=position_ids)

    with torch.no_grad():
        torch.testing.assert_close(ours_win(X), mistral_call(X), atol=1e-4, rtol=1e-4)
    t = median_times({"ours": forward_backward(ours_win, X), "peer": forward_backward(mistral_call, X)}, repeats)
    report("block_mistral_window_time", t["ours"] / t["peer"], "<=1.0",
           f"d2lmini {t['ours'] * 1e3:.1f} ms vs MistralDecoderLayer {t['peer'] * 1e3:.1f} ms (window {window})")

    # LayerNorm/GELU block vs nn.TransformerEncoderLayer (pre-LN), same weights.
    encoder = nn.TransformerEncoderLayer(d, 8, dim_feedforward=4 * d, dropout=0.0, activation="gelu",
                                         batch_first=True, norm_first=True).train()
    ours_enc = from_torch_encoder_layer(encoder).train()
    X = torch.randn(batch, steps, d)
    t = median_times({"ours": forward_backward(ours_enc, X), "peer": forward_backward(encoder, X)}, repeats)
    report("block_encoder_time", t["ours"] / t["peer"], "<=1.0",
           f"d2lmini {t['ours'] * 1e3:.1f} ms vs nn.TransformerEncoderLayer {t['peer'] * 1e3:.1f} ms")
    m_ours, m_peer = saved_bytes(lambda: ours_enc(X.requires_grad_(True))), saved_bytes(lambda: encoder(X))
    report("block_encoder_memory", m_ours / m_peer, "<=1.0",
           f"saved for backward: d2lmini {m_ours / 2**20:.1f} MiB vs {m_peer / 2**20:.1f} MiB")

    # RMSNorm vs torch.nn.RMSNorm.
    ours_norm, peer_norm = d2lmini.RMSNorm(d, eps=1e-6), nn.RMSNorm(d, eps=1e-6)
    X = torch.randn(batch, steps, d)
    t = median_times({"ours": forward_backward(ours_norm, X), "peer": forward_backward(peer_norm, X)},
                     repeats * 4)
    report("rmsnorm_time", t["ours"] / t["peer"], "<=1.1",
           f"d2lmini {t['ours'] * 1e3:.2f} ms vs torch.nn.RMSNorm {t['peer'] * 1e3:.2f} ms (fp32 upcast kept)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    main(parser.parse_args().quick)
