"""d2lmini: the code behind *The Transformer Block*, a small d2l-style library.

The package is laid out as the book is:

**The model parts**, each in a module named after what it holds:
:mod:`d2lmini.norms` (every norm: :class:`~d2lmini.norms.RMSNorm`, the per-head RMSNorm of QK-norm,
LayerNorm written by hand, BatchNorm for sequences, and the factory :func:`~d2lmini.norms.make_norm`),
:mod:`d2lmini.attention` (:class:`~d2lmini.attention.MultiHeadAttention` with grouped-query attention,
QK-norm and RoPE, and gated attention), :mod:`d2lmini.mla` (multi-head latent attention of
DeepSeek-V2/V3 and the key/value cache per token), :mod:`d2lmini.deltanet`
(:class:`~d2lmini.deltanet.GatedDeltaNet`, the linear-attention mixer of Qwen3-Next and Qwen3.5),
:mod:`d2lmini.ffn` (:class:`~d2lmini.ffn.FeedForward`),
:mod:`d2lmini.moe` (a mixture of experts), :mod:`d2lmini.hyper` (DeepSeek-V4's manifold-constrained
hyper-connections: ``n`` residual streams), :mod:`d2lmini.deepseek_v4` (DeepSeek-V4's compressed
attention and hash-routed experts) and :mod:`d2lmini.block`
(:class:`~d2lmini.block.TransformerBlock` and the decoder block with cross-attention), :mod:`d2lmini.cache`
(the key/value cache) and :mod:`d2lmini.lm` (:class:`~d2lmini.lm.LanguageModel`, a stack of blocks, and
:func:`~d2lmini.lm.generate`).

Beside them, helpers they may import: :mod:`d2lmini.parameters` (counting a module's parameters,
in total or part by part) and :mod:`d2lmini.seeding` (seeded draws that leave the global random state
alone).

**The released models' layers**, :mod:`d2lmini.reference` (one module per family, real layers as
d2lmini blocks), built on the model parts only.

**The shared machinery**: :mod:`d2lmini.probes` (depth measurements at
initialization), :mod:`d2lmini.data` and :mod:`d2lmini.train` (the character corpus, a
tiny language model and the one training loop), :mod:`d2lmini.plot` (the house style,
every colour and label), :mod:`d2lmini.widgets` (live explorers and their static
twins), :mod:`d2lmini.timing` (the timing harness) and :mod:`d2lmini.webmodel` (a trained
model running in the page).

**Each chapter's experiments**, one module per notebook in ``d2lmini.chapters``:

==============================================================  =================================================
chapter                                                         module
==============================================================  =================================================
1. Anatomy: two sublayers on one residual stream                :mod:`d2lmini.chapters.ch01_anatomy`
2. Residual connections: the gradient highway                   :mod:`d2lmini.chapters.ch02_residual`
3. Normalization: why LayerNorm, not BatchNorm                  :mod:`d2lmini.chapters.ch03_normalization`
4. Where the norm goes: post-LN, pre-LN and after               :mod:`d2lmini.chapters.ch04_norm_placement`
5. RMSNorm: keep the scale, drop the centring                   :mod:`d2lmini.chapters.ch05_rmsnorm`
6. QK-norm: the same discipline inside attention                :mod:`d2lmini.chapters.ch06_qk_norm`
7. The feed-forward network: SwiGLU, then a mixture of experts  :mod:`d2lmini.chapters.ch07_ffn`
8. Attention for generation: the cache, GQA and MLA             :mod:`d2lmini.chapters.ch08_attention_generation`
9. The 2026 block                                               :mod:`d2lmini.chapters.ch09_the_2026_block`
10. Beyond one residual stream: hyper-connections and mHC       :mod:`d2lmini.chapters.ch10_hyper_connections`
11. Beyond softmax attention                                    :mod:`d2lmini.chapters.ch11_beyond_softmax`
Errors and their messages                                       :mod:`d2lmini.chapters.errors`
The block zoo                                                   :mod:`d2lmini.chapters.zoo`
==============================================================  =================================================
"""

from .attention import QK_NORMS, GatedAttention, MultiHeadAttention, apply_rotary, rotary_cos_sin, valid_lens_mask
from .block import PLACEMENTS, AddNorm, TransformerBlock, TransformerDecoderBlock
from .cache import KVCache
from .deltanet import GatedDeltaNet, gated_delta_rule, inference_state_bytes
from .ffn import ACTS, FeedForward, default_ffn_num_hiddens
from .lm import POSITIONS, LanguageModel, generate
from .hyper import HyperConnectedBlock, HyperConnection, HyperHead, expand_streams, sinkhorn_knopp
from .mla import MultiHeadLatentAttention, kv_cache_bytes_per_token
from .moe import MixtureOfExperts
from .norms import NORMS, RMSNorm, make_norm
from .parameters import copy_parameters, num_parameters
from .probes import PROBED_PLACEMENTS, DepthProbe, init_linear_weights_, probe_depth, stream_rms, token_spread
from ._shown import show_code

# Each chapter's experiments (e.g. ``d2lmini.chapters.ch01_anatomy.position_mixing``), the explorers and
# depth experiment re-exported from them, the widgets and the exercises load on first use (PEP 562), so that
# ``import d2lmini`` and ``import d2lmini.norms`` cost the model parts only: no chapter module, no
# ``transformers``, no matplotlib.
_CHAPTER_MODULES = ("ch01_anatomy", "ch02_residual", "ch03_normalization", "ch04_norm_placement", "ch05_rmsnorm",
                    "ch06_qk_norm", "ch07_ffn", "ch08_attention_generation", "ch09_the_2026_block",
                    "ch10_hyper_connections", "ch11_beyond_softmax", "errors", "zoo")
#: The names re-exported from chapter modules -> the module that defines them.
_FROM_CHAPTERS = {"residual_explorer": "ch02_residual", "DepthExplorer": "ch04_norm_placement",
                  "depth_explorer": "ch04_norm_placement", "depth_explorer_static": "ch04_norm_placement",
                  "depth_table": "ch04_norm_placement", "probe_placements": "ch04_norm_placement",
                  "qk_scale_explorer": "ch06_qk_norm"}
#: The names re-exported from the widgets module (which loads matplotlib).
_FROM_WIDGETS = ("FrameExplorer", "StaticTwin")
#: The package's other modules, loaded on first use as attributes (``d2lmini.train.train_step``).
_SUBMODULES = ("chapters", "data", "exercises", "plot", "reference", "timing", "train", "webmodel", "widgets")


def __getattr__(name: str):
    """Load a chapter module, a name re-exported from one, or a submodule on first use (PEP 562).

    Raises:
        AttributeError: for any other name, as a module does.
    """
    import importlib

    if name in _CHAPTER_MODULES:
        value = importlib.import_module(f".chapters.{name}", __name__)
    elif name in _FROM_CHAPTERS:
        value = getattr(importlib.import_module(f".chapters.{_FROM_CHAPTERS[name]}", __name__), name)
    elif name in _FROM_WIDGETS:
        value = getattr(importlib.import_module(".widgets", __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # loaded once: later lookups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_CHAPTER_MODULES) | set(_FROM_CHAPTERS) | set(_FROM_WIDGETS) | set(_SUBMODULES))


__version__ = "0.1.0"

__all__ = [
    "ACTS", "NORMS", "PLACEMENTS", "POSITIONS", "PROBED_PLACEMENTS", "QK_NORMS",
    "AddNorm", "copy_parameters", "DepthExplorer", "DepthProbe", "FeedForward", "FrameExplorer", "GatedAttention", "GatedDeltaNet",
    "HyperConnectedBlock", "HyperConnection", "HyperHead", "KVCache", "LanguageModel",
    "MixtureOfExperts", "MultiHeadAttention", "MultiHeadLatentAttention", "RMSNorm", "StaticTwin", "TransformerBlock",
    "TransformerDecoderBlock", "apply_rotary", "default_ffn_num_hiddens", "depth_explorer",
    "depth_explorer_static", "depth_table", "expand_streams", "gated_delta_rule", "generate", "inference_state_bytes",
    "init_linear_weights_", "kv_cache_bytes_per_token",
    "make_norm", "num_parameters", "probe_depth", "probe_placements", "qk_scale_explorer", "residual_explorer",
    "rotary_cos_sin", "show_code", "sinkhorn_knopp", "stream_rms", "token_spread", "valid_lens_mask",
]
