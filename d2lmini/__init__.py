"""d2lmini: the code behind *The Transformer Block*, a small d2l-style library.

Every chapter of the book imports from here: the block and its parts
(:class:`RMSNorm`, :class:`MultiHeadAttention`, :class:`FeedForward`,
:class:`TransformerBlock`) and the functions that run each chapter's experiment.
"""

from .attention import QK_NORMS, MultiHeadAttention, apply_rotary, rotary_cos_sin, valid_lens_mask
from .block import PLACEMENTS, AddNorm, TransformerBlock, TransformerDecoderBlock
from .ffn import ACTS, FeedForward, default_ffn_num_hiddens
from .norms import NORMS, RMSNorm, make_norm
from .notebook import glue
from .probes import (PROBED_PLACEMENTS, DepthProbe, depth_table, init_linear_weights_, probe_depth, probe_placements,
                     stream_rms, token_spread)
from .widgets import (DepthExplorer, FrameExplorer, StaticTwin, depth_explorer, depth_explorer_static,
                      qk_scale_explorer, residual_explorer)

# The chapters' experiment modules, e.g. ``d2lmini.anatomy.position_mixing``.
from . import (anatomy, catalog, ffn_experiments, normalization, probes, qknorm, reference,  # noqa: E402
               residual, rmsnorm)

__version__ = "0.1.0"

__all__ = [
    "ACTS", "NORMS", "PLACEMENTS", "PROBED_PLACEMENTS", "QK_NORMS",
    "AddNorm", "DepthExplorer", "DepthProbe", "FrameExplorer", "StaticTwin", "FeedForward", "MultiHeadAttention", "RMSNorm", "TransformerBlock", "TransformerDecoderBlock", "apply_rotary", "rotary_cos_sin",
    "default_ffn_num_hiddens", "depth_explorer", "depth_explorer_static", "depth_table", "qk_scale_explorer", "residual_explorer", "glue", "init_linear_weights_", "make_norm", "probe_depth", "probe_placements",
    "stream_rms", "token_spread", "valid_lens_mask",
]
