"""PyTorch's own ``nn.TransformerEncoderLayer`` and ``nn.TransformerDecoderLayer``: the 2017 Transformer, the base.

The reference every other family changes: LayerNorm with bias, post-LN (or pre-LN with
``norm_first``), a packed ``[q; k; v]`` projection, a ReLU or GELU MLP, biases everywhere, no
positions inside the layer (Vaswani et al., 2017). PyTorch layers are not Hugging Face ones, so
these converters take the layer alone and are not in :data:`~d2lmini.reference.base.HF_CONVERTERS`.
"""

from __future__ import annotations

from torch import nn
from torch.nn import functional as F

from ..block import TransformerBlock, TransformerDecoderBlock
from .base import copy_linear, copy_norm, copy_qkv_packed


def _torch_activation(layer) -> str:
    act = layer.activation
    if act is F.relu or isinstance(act, nn.ReLU) or act == "relu":
        return "relu"
    if act is F.gelu or isinstance(act, nn.GELU) or act == "gelu":
        if isinstance(act, nn.GELU) and act.approximate != "none":
            return "gelu_tanh"
        return "gelu"
    raise ValueError(f"unsupported activation {act!r}; supported: relu, gelu")


def from_torch_encoder_layer(layer: nn.TransformerEncoderLayer) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to ``torch.nn.TransformerEncoderLayer``.

    ``norm_first=False`` is post-LN (Vaswani et al., 2017), ``True`` is pre-LN;
    ReLU or exact GELU; LayerNorm with the layer's eps; biases as the layer has them.

    Args:
        layer: a ``batch_first=True`` ``nn.TransformerEncoderLayer``.

    Returns:
        A block on the layer's device and dtype, in the layer's train/eval mode.

    Raises:
        ValueError: for ``batch_first=False`` or an activation other than relu/gelu.
    """
    if not layer.self_attn.batch_first:
        raise ValueError("from_torch_encoder_layer needs batch_first=True (d2lmini tensors are (batch, steps, d))")
    attn = layer.self_attn
    d, h = attn.embed_dim, attn.num_heads
    bias = layer.linear1.bias is not None
    block = TransformerBlock(d, h, norm="layer", act=_torch_activation(layer),
                             placement="pre" if layer.norm_first else "post", bias=bias,
                             ffn_num_hiddens=layer.linear1.out_features, eps=layer.norm1.eps,
                             dropout=layer.dropout.p)
    copy_qkv_packed(block.attention, attn.in_proj_weight, attn.in_proj_bias)
    copy_linear(block.attention.W_o, attn.out_proj.weight, attn.out_proj.bias)
    copy_linear(block.ffn.W_1, layer.linear1.weight, layer.linear1.bias)
    copy_linear(block.ffn.W_2, layer.linear2.weight, layer.linear2.bias)
    slot = "norm_in" if layer.norm_first else "norm_post"
    copy_norm(getattr(block.addnorm1, slot), layer.norm1)
    copy_norm(getattr(block.addnorm2, slot), layer.norm2)
    return block.to(attn.in_proj_weight).train(layer.training)


def from_torch_decoder_layer(layer: nn.TransformerDecoderLayer) -> TransformerDecoderBlock:
    """A :class:`TransformerDecoderBlock` equal to ``torch.nn.TransformerDecoderLayer``.

    Self-attention (causal), cross-attention over the encoder's outputs, FFN; post-LN
    or pre-LN as ``norm_first`` says.

    Args:
        layer: a ``batch_first=True`` ``nn.TransformerDecoderLayer``.

    Returns:
        A decoder block holding the layer's weights (its self-attention is causal:
        call the reference with a causal ``tgt_mask`` to compare).

    Raises:
        ValueError: for ``batch_first=False`` or an activation other than relu/gelu.
    """
    if not layer.self_attn.batch_first:
        raise ValueError("from_torch_decoder_layer needs batch_first=True")
    attn, cross = layer.self_attn, layer.multihead_attn
    d, h = attn.embed_dim, attn.num_heads
    block = TransformerDecoderBlock(d, h, norm="layer", act=_torch_activation(layer),
                                    placement="pre" if layer.norm_first else "post",
                                    bias=layer.linear1.bias is not None,
                                    ffn_num_hiddens=layer.linear1.out_features, eps=layer.norm1.eps,
                                    dropout=layer.dropout.p)
    copy_qkv_packed(block.attention, attn.in_proj_weight, attn.in_proj_bias)
    copy_linear(block.attention.W_o, attn.out_proj.weight, attn.out_proj.bias)
    copy_qkv_packed(block.cross_attention, cross.in_proj_weight, cross.in_proj_bias)
    copy_linear(block.cross_attention.W_o, cross.out_proj.weight, cross.out_proj.bias)
    copy_linear(block.ffn.W_1, layer.linear1.weight, layer.linear1.bias)
    copy_linear(block.ffn.W_2, layer.linear2.weight, layer.linear2.bias)
    slot = "norm_in" if layer.norm_first else "norm_post"
    for addnorm, norm in ((block.addnorm1, layer.norm1), (block.addnorm2, layer.norm2),
                          (block.addnorm3, layer.norm3)):
        copy_norm(getattr(addnorm, slot), norm)
    return block.to(attn.in_proj_weight).train(layer.training)
