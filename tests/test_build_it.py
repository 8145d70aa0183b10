"""Build it from the text: each chapter's check of the part the reader writes passes the chapter's
own part and fails a plausible wrong one with a hint that names what differs.

Each case runs the chapter's code cells up to its check (the timed training cells left out), with
the "Build it" cell changed by one plausible mistake, and reads the check's ``AssertionError``."""

from __future__ import annotations

import matplotlib
import nbformat
import pytest
import torch
from torch import nn

from conftest import ROOT
from d2lmini.exercises import check_build

matplotlib.use("Agg")

#: (chapter, a string of the Build-it cell, a string of its check cell, the mistake as (old, new)
#: replacements in the Build-it cell, a string the hint must hold); mistake None: the right part.
CASES = {
    "01 norms swapped": ("01_anatomy", "class MiniBlock", "check_build",
                         [("self.attention(self.norm1(X))", "self.attention(self.norm2(X))"),
                          ("self.ffn(self.norm2(X))", "self.ffn(self.norm1(X))")], "`norm1` and `norm2`"),
    "01 post-LN": ("01_anatomy", "class MiniBlock", "check_build",
                   [("X = X + self.attention(self.norm1(X))", "X = self.norm1(X + self.attention(X))"),
                    ("X + self.ffn(self.norm2(X))", "self.norm2(X + self.ffn(X))")], "this is post-LN"),
    "01 stream normalized": ("01_anatomy", "class MiniBlock", "check_build",
                             [("X = X + self.attention(self.norm1(X))", "X = self.norm1(X)\n        X = X + self.attention(X)"),
                              ("return X + self.ffn(self.norm2(X))", "X = self.norm2(X)\n        return X + self.ffn(X)")],
                             "the stream is never normalized"),
    "01 norm1 twice": ("01_anatomy", "class MiniBlock", "check_build",
                       [("self.ffn(self.norm2(X))", "self.ffn(self.norm1(X))")], "uses norm1 twice"),
    "01 FFN skip dropped": ("01_anatomy", "class MiniBlock", "check_build",
                            [("return X + self.ffn(self.norm2(X))", "return self.ffn(self.norm2(X))")],
                            "the FFN's output is added to the stream X'"),
    "01 attention reads the stream": ("01_anatomy", "class MiniBlock", "check_build",
                                      [("X = X + self.attention(self.norm1(X))", "X = X + self.attention(X)")],
                                      "attention reads norm1(X)"),
    "01 heads merged by a reshape": ("01_anatomy", "class MiniBlock", "check_build",
                                     [("self.W_o((A @ V).transpose(1, 2).flatten(-2))",
                                       "self.W_o((A @ V).reshape(X.shape[0], X.shape[1], -1))")],
                                     "bring the heads back beside each other"),
    "01 heads split by a reshape": ("01_anatomy", "class MiniBlock", "check_build",
                                    [("T.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)",
                                      "T.reshape(T.shape[0], self.num_heads, T.shape[1], -1)")],
                                    "then transpose(1, 2) to (b, num_heads, n, d_h)"),
    "01 one head": ("01_anatomy", "class MiniBlock", "check_build",
                    [("T.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)", "T.unsqueeze(1)")],
                    "not one head over all"),
    "02 keys and values from the stream": ("02_residual", "class MiniBlock", "check_build",
                                           [("self.attention(H, H, H)", "self.attention(H, X, X)")],
                                           "all come from norm1(X)"),
    "01 FFN added to the block's input": ("01_anatomy", "class MiniBlock", "check_build",
                                          [("X = X + self.attention(self.norm1(X))  # sublayer 1 adds to the stream\n"
                                            "        return X + self.ffn(self.norm2(X))",
                                            "X1 = X + self.attention(self.norm1(X))\n"
                                            "        return X + self.ffn(self.norm2(X1))")],
                                          "not to the block's input X"),
    "01 LayerNorm eps": ("01_anatomy", "class MiniBlock", "check_build",
                         [("self.norm1 = nn.LayerNorm(num_hiddens)", "self.norm1 = nn.LayerNorm(num_hiddens, eps=1e-6)")],
                         "`norm1` is built with eps=1e-06, d2lmini's `addnorm1.norm_in` with eps=1e-05"),
    "02 LayerNorm eps": ("02_residual", "class MiniBlock", "check_build",
                         [("self.norm2 = nn.LayerNorm(num_hiddens)", "self.norm2 = nn.LayerNorm(num_hiddens, eps=1e-6)")],
                         "`norm2` is built with eps=1e-06"),
    "04 LayerNorm eps": ("04_norm_placement", "class MiniBlock", "check_build",
                         [("nn.LayerNorm(num_hiddens), nn.LayerNorm(num_hiddens)",
                           "nn.LayerNorm(num_hiddens, eps=1e-6), nn.LayerNorm(num_hiddens)")],
                         "`norm1` is built with eps=1e-06"),
    "01 W_o left out": ("01_anatomy", "class MiniBlock", "check_build",
                        [("return self.W_o((A @ V).transpose(1, 2).flatten(-2))",
                          "return (A @ V).transpose(1, 2).flatten(-2)")], "pass through the output projection W_o"),
    "05 squares summed": ("05_rmsnorm", "class MyRMSNorm", "check_build",
                          [("X32.pow(2).mean(dim=-1, keepdim=True)", "X32.pow(2).sum(dim=-1, keepdim=True)")],
                          "not their sum"),
    "06 theta ignored": ("06_qk_norm", "class MyAttention", "check_build",
                         [("rotate(q, positions, self.theta), rotate(k, positions, self.theta)",
                           "rotate(q, positions), rotate(k, positions)")], "rotate with the theta it is given"),
    "06 heads interleaved": ("06_qk_norm", "class MyAttention", "check_build",
                             [("W(X).view(b, n, self.num_heads, self.head_dim)",
                               "W(X).view(b, n, self.head_dim, self.num_heads).transpose(-1, -2)")],
                             "head i: columns i d_h to (i + 1) d_h - 1"),
    "06 query norm's eps": ("06_qk_norm", "class MyAttention", "check_build",
                            [("self.q_norm = nn.RMSNorm(self.head_dim, eps=1e-6)",
                              "self.q_norm = nn.RMSNorm(self.head_dim, eps=1e-5)")],
                            "`q_norm` alone differs from d2lmini's `q_norm`: d2lmini's eps is 1e-06, yours 1e-05"),
    "02 GELU for ReLU": ("02_residual", "class MiniBlock", "check_build",
                         [("torch.relu(self.W_1(", "nn.functional.gelu(self.W_1(")], "the FFN's activation is relu"),
    "05 mean subtracted": ("05_rmsnorm", "class MyRMSNorm", "check_build",
                           [("Y = X32 * torch.rsqrt(mean_square + self.eps)",
                             "Y = (X32 - X32.mean(-1, keepdim=True)) * torch.rsqrt(mean_square + self.eps)")],
                           "RMSNorm subtracts no mean"),
    "07 expert_bias a parameter": ("07_ffn", "class MyMoE", "expert_bias.normal_",
                                   [("self.register_buffer(\"expert_bias\", torch.zeros(num_experts))",
                                     "self.expert_bias = nn.Parameter(torch.zeros(num_experts))")],
                                   "`expert_bias` is a parameter in yours, a buffer in d2lmini's"),
    "06 nn.RMSNorm's default eps": ("06_qk_norm", "class MyAttention", "check_build",
                                    [("self.k_norm = nn.RMSNorm(self.head_dim, eps=1e-6)",
                                      "self.k_norm = nn.RMSNorm(self.head_dim)")], "the default (eps=None) of nn.RMSNorm"),
    "04 a norm on each branch": ("04_norm_placement", "class MiniBlock", "check_build",
                                 [("return norm(X + F(X))", "return X + norm(F(X))")], "a norm on each branch"),
    "01 logits divided by d_h": ("01_anatomy", "class MiniBlock", "check_build",
                                 [("/ math.sqrt(Q.shape[-1])", "/ Q.shape[-1]")], "not by d_h"),
    "01 a norm on each branch": ("01_anatomy", "class MiniBlock", "check_build",
                                 [("X = X + self.attention(self.norm1(X))", "X = X + self.norm1(self.attention(X))"),
                                  ("return X + self.ffn(self.norm2(X))", "return X + self.norm2(self.ffn(X))")],
                                 "a norm on each branch"),
    "09 valid_lens dropped": ("09_the_2026_block", "class Block2026", "check_build",
                              [("self.attention(Y, Y, Y, valid_lens)", "self.attention(Y, Y, Y)")],
                              "hand valid_lens on to the attention"),
    "02 attention's skip kept without residual": ("02_residual", "class MiniBlock", "check_build",
                                                  [("X = self.skip(X, self.attention(H, H, H))",
                                                    "X = X + self.attention(H, H, H)")],
                                                  "yours still adds X to attention's output"),
    "01 heads split and merged by reshapes": ("01_anatomy", "class MiniBlock", "check_build",
                                              [("T.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)",
                                                "T.reshape(T.shape[0], self.num_heads, T.shape[1], -1)"),
                                               ("self.W_o((A @ V).transpose(1, 2).flatten(-2))",
                                                "self.W_o((A @ V).reshape(X.shape[0], X.shape[1], -1))")],
                                              "a reshape alone, both ways"),
    "01 logits not scaled": ("01_anatomy", "class MiniBlock", "check_build",
                             [("Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])", "Q @ K.transpose(-2, -1)")],
                             "divide each head's logits by sqrt(d_h)"),
    "01 parallel sublayers": ("01_anatomy", "class MiniBlock", "check_build",
                              [("X = X + self.attention(self.norm1(X))  # sublayer 1 adds to the stream\n"
                                "        return X + self.ffn(self.norm2(X))",
                                "return X + self.attention(self.norm1(X)) + self.ffn(self.norm2(X))")],
                              "not the block's input X"),
    "01 GELU": ("01_anatomy", "class MiniBlock", "check_build", [("nn.ReLU()", "nn.GELU()")], "`ffn` alone"),
    "01 scaled by sqrt(d)": ("01_anatomy", "class MiniBlock", "check_build",
                             [("math.sqrt(Q.shape[-1])", "math.sqrt(X.shape[-1])")], "sqrt(d_h)"),
    "01 heads interleaved": ("01_anatomy", "class MiniBlock", "check_build",
                             [("T.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)",
                               "T.unflatten(-1, (-1, self.num_heads)).permute(0, 3, 1, 2)")],
                             "(i+1)*d_h - 1"),
    "01 softmax over the queries": ("01_anatomy", "class MiniBlock", "check_build",
                                    [("                          dim=-1)", "                          dim=-2)")],
                                    "the softmax runs over the keys"),
    "02 norms swapped": ("02_residual", "class MiniBlock", "check_build",
                         [("H = self.norm1(X)", "H = self.norm2(X)"),
                          ("self.W_1(self.norm2(X))", "self.W_1(self.norm1(X))")], "`norm1` and `norm2`"),
    "02 skip kept without residual": ("02_residual", "class MiniBlock", "check_build",
                                      [("X + Y if self.residual else Y", "X + Y")], "residual=False"),
    "02 causal attention": ("02_residual", "class MiniBlock", "check_build",
                            [("d2lmini.MultiHeadAttention(num_hiddens, num_heads)",
                              "d2lmini.MultiHeadAttention(num_hiddens, num_heads, causal=True)")],
                            "`attention` is built with causal=True, d2lmini's `attention` with causal=False"),
    "03 unbiased variance": ("03_normalization", "class MyLayerNorm", "check_build",
                             [("var = ((X - mu) ** 2).mean(dim=-1, keepdim=True)", "var = X.var(dim=-1, keepdim=True)")],
                             "biased variance"),
    "03 mean kept": ("03_normalization", "class MyLayerNorm", "check_build",
                     [("return self.gamma * (X - mu)", "return self.gamma * X")], "subtract each token's mean"),
    "03 no eps": ("03_normalization", "class MyLayerNorm", "check_build",
                  [("torch.sqrt(var + self.eps)", "torch.sqrt(var)")], "add eps, the module's own, inside the square root"),
    "03 no centring": ("03_normalization", "class MyLayerNorm", "check_build",
                       [("return self.gamma * (X - mu)", "return self.gamma * X"),
                        ("var = ((X - mu) ** 2)", "var = (X ** 2)")], "in the variance and in the numerator"),
    "03 eps of RMSNorm": ("03_normalization", "class MyLayerNorm", "check_build",
                          [("def __init__(self, num_hiddens, eps=1e-5)", "def __init__(self, num_hiddens, eps=1e-6)")],
                          "nn.LayerNorm's eps is 1e-05, yours 1e-06"),
    "03 variance not centred": ("03_normalization", "class MyLayerNorm", "check_build",
                                [("var = ((X - mu) ** 2)", "var = (X ** 2)")], "squares of the centred token"),
    "03 statistics over the positions": ("03_normalization", "class MyLayerNorm", "check_build",
                                         [("mu = X.mean(dim=-1, keepdim=True)", "mu = X.mean(dim=1, keepdim=True)"),
                                          ("var = ((X - mu) ** 2).mean(dim=-1, keepdim=True)",
                                           "var = ((X - mu) ** 2).mean(dim=1, keepdim=True)")],
                                         "not over the positions"),
    "03 no gain": ("03_normalization", "class MyLayerNorm", "check_build",
                   [("return self.gamma * (X - mu)", "return (X - mu)")], "multiply by the gain"),
    "05 variance as the statistic": ("05_rmsnorm", "class MyRMSNorm", "check_build",
                                     [("X32.pow(2).mean(dim=-1, keepdim=True)", "X32.var(dim=-1, keepdim=True, unbiased=False)")],
                                     "not its variance"),
    "06 heads merged without the transpose": ("06_qk_norm", "class MyAttention", "check_build",
                                              [("(weights @ v).transpose(1, 2).reshape(b, n, -1)",
                                                "(weights @ v).reshape(b, n, -1)")], "bring the heads back"),
    "04 post-LN as pre-LN": ("04_norm_placement", "class MiniBlock", "check_build",
                             [("return norm(X + F(X))", "return X + F(norm(X))")], "this is pre-LN"),
    "04 norm1 twice": ("04_norm_placement", "class MiniBlock", "check_build",
                       [("self.ffn, self.norm2)", "self.ffn, self.norm1)")], "uses norm1 twice"),
    "04 norms swapped": ("04_norm_placement", "class MiniBlock", "check_build",
                         [("self.attention(Y, Y, Y), self.norm1)", "self.attention(Y, Y, Y), self.norm2)"),
                          ("self.ffn, self.norm2)", "self.ffn, self.norm1)")], "`norm1` and `norm2`"),
    "05 no upcast": ("05_rmsnorm", "class MyRMSNorm", "check_build", [("X32 = X.float()", "X32 = X")],
                     "upcast first"),
    "05 eps of LayerNorm": ("05_rmsnorm", "class MyRMSNorm", "check_build",
                            [("def __init__(self, num_hiddens, eps=1e-6)", "def __init__(self, num_hiddens, eps=1e-5)")],
                            "d2lmini's eps is 1e-06, yours 1e-05"),
    "05 no eps": ("05_rmsnorm", "class MyRMSNorm", "check_build",
                  [("torch.rsqrt(mean_square + self.eps)", "torch.rsqrt(mean_square)")], "the module's own, inside the square root"),
    "05 not rounded back": ("05_rmsnorm", "class MyRMSNorm", "check_build",
                            [("return Y.to(X.dtype) * self.gamma", "return Y * self.gamma")], "Y.to(X.dtype)"),
    "05 gain before rounding": ("05_rmsnorm", "class MyRMSNorm", "check_build",
                                [("return Y.to(X.dtype) * self.gamma", "return (Y * self.gamma).to(X.dtype)")],
                                "round back to the input's dtype first"),
    "06 pairs (2i, 2i+1)": ("06_qk_norm", "def rotate", "check_build",
                            [("x1, x2 = x[..., : d_h // 2], x[..., d_h // 2 :]", "x1, x2 = x[..., 0::2], x[..., 1::2]"),
                             ("torch.cat((-x2, x1), dim=-1)", "torch.stack((-x2, x1), dim=-1).flatten(-2)"),
                             (".repeat(1, 2)", ".repeat_interleave(2, dim=-1)")], "pairs i, i + d_h/2"),
    "06 QK-norm after RoPE": ("06_qk_norm", "class MyAttention", "check_build",
                              [("            q, k = self.q_norm(q), self.k_norm(k)\n", "            pass\n"),
                               ("q, k = rotate(q, positions, self.theta), rotate(k, positions, self.theta)",
                                "q, k = rotate(q, positions, self.theta), rotate(k, positions, self.theta)\n"
                                "        if self.qk_norm:\n            q, k = self.q_norm(q), self.k_norm(k)")],
                              "before RoPE"),
    "06 q_norm and k_norm swapped": ("06_qk_norm", "class MyAttention", "check_build",
                                     [("self.q_norm(q), self.k_norm(k)", "self.k_norm(q), self.q_norm(k)")],
                                     "`q_norm` and `k_norm`"),
    "07 gate swapped": ("07_ffn", "class MySwiGLU", "MySwiGLU(48, 128)",
                        [("F.silu(self.W_g(X)) * self.W_1(X)", "F.silu(self.W_1(X)) * self.W_g(X)")],
                        "`W_g` and `W_1`"),
    "07 gate through the wrong layer": ("07_ffn", "class MySwiGLU", "MySwiGLU(48, 128)",
                                        [("F.silu(self.W_g(X)) * self.W_1(X)", "self.W_g(X) * F.silu(self.W_1(X))")],
                                        "passes through an"),
    "07 GELU gate": ("07_ffn", "class MySwiGLU", "MySwiGLU(48, 128)", [("F.silu(", "F.gelu(")],
                     "SiLU (F.silu)"),
    "07 expert_bias in the weights": ("07_ffn", "class MyMoE", "expert_bias.normal_",
                                      [("w = p.gather(-1, chosen)", "w = (p + self.expert_bias).gather(-1, chosen)")],
                                      "expert_bias is added to p only to choose"),
    "07 weights from topk's values": ("07_ffn", "class MyMoE", "expert_bias.normal_",
                                      [("chosen = (p + self.expert_bias).topk(self.top_k, dim=-1).indices\n"
                                        "        w = p.gather(-1, chosen)",
                                        "w, chosen = (p + self.expert_bias).topk(self.top_k, dim=-1)")],
                                      "topk's values carry it"),
    "08 cache of repeated heads": ("08_attention_generation", "class MyGQA", "check_build",
                                   [("        if cache is not None:  # the earlier",
                                     "        k = k.repeat_interleave(self.h // self.g, dim=1)\n"
                                     "        v = v.repeat_interleave(self.h // self.g, dim=1)\n"
                                     "        if cache is not None:  # the earlier"),
                                    ("K, V = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)",
                                     "K, V = k, v")],
                                   "repeat them only inside the attention"),
    "08 cache repeated after the concatenation": ("08_attention_generation", "class MyGQA", "check_build",
                                                  [("(weights @ V).transpose(1, 2).reshape(b, n, -1)), (k, v)",
                                                    "(weights @ V).transpose(1, 2).reshape(b, n, -1)), (K, V)")],
                                                  "with their g heads"),
    "08 scores not scaled": ("08_attention_generation", "class MyGQA", "check_build",
                             [("scores = q @ K.transpose(-1, -2) / self.d_h ** 0.5",
                               "scores = q @ K.transpose(-1, -2)")], "sqrt(d_h)"),
    "05 statistic without keepdim": ("05_rmsnorm", "class MyRMSNorm", "check_build",
                                     [("keepdim=True", "keepdim=False")], "needs keepdim=True"),
    "03 mean without keepdim": ("03_normalization", "class MyLayerNorm", "check_build",
                                [("mu = X.mean(dim=-1, keepdim=True)", "mu = X.mean(dim=-1)"),
                                 ("((X - mu) ** 2).mean(dim=-1, keepdim=True)",
                                  "((X - mu[..., None]) ** 2).mean(dim=-1)")], "needs keepdim=True"),
    "08 math not imported": ("08_attention_generation", "class MyGQA", "check_build",
                             [("/ self.d_h ** 0.5", "/ math.sqrt(self.d_h)")], "Import that name"),
    "08 cache of tokens before heads": ("08_attention_generation", "class MyGQA", "check_build",
                                        [("k, v = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)",
                                          "k, v = torch.cat((cache[0], k.transpose(1, 2)), dim=1).transpose(1, 2), "
                                          "torch.cat((cache[1], v.transpose(1, 2)), dim=1).transpose(1, 2)"),
                                         (".reshape(b, n, -1)), (k, v)",
                                          ".reshape(b, n, -1)), (k.transpose(1, 2), v.transpose(1, 2))")],
                                        "heads before tokens"),
    "08 no mask with a cache": ("08_attention_generation", "class MyGQA", "check_build",
                                [("mask = torch.ones(n, past + n, dtype=torch.bool).tril(diagonal=past)",
                                  "mask = torch.ones(n, past + n, dtype=torch.bool).tril(diagonal=past) "
                                  "if past == 0 else torch.ones(n, past + n, dtype=torch.bool)")],
                                "sees keys 0 to past + i"),
    "08 new keys appended on the heads axis": ("08_attention_generation", "class MyGQA", "check_build",
                                               [("torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)",
                                                 "torch.cat((cache[0], k), dim=1), torch.cat((cache[1], v), dim=1)")],
                                               "dim 2 of (b, g, tokens, d_h)"),
    "08 mask for the new tokens only": ("08_attention_generation", "class MyGQA", "check_build",
                                        [("mask = torch.ones(n, past + n, dtype=torch.bool).tril(diagonal=past)",
                                          "mask = torch.ones(n, n, dtype=torch.bool).tril()")],
                                        "mask n queries against past + n keys"),
    "08 only the new keys returned": ("08_attention_generation", "class MyGQA", "check_build",
                                      [(".reshape(b, n, -1)), (k, v)", ".reshape(b, n, -1)), (k[:, :, past:], v[:, :, past:])")],
                                      "the cache of every token so far"),
    "08 softmax over the queries": ("08_attention_generation", "class MyGQA", "check_build",
                                    [("float(\"-inf\")), dim=-1)", "float(\"-inf\")), dim=-2)")],
                                    "the softmax runs over the keys"),
    "08 keys and values swapped": ("08_attention_generation", "class MyGQA", "check_build",
                                   [("k = self.W_k(X)", "k = self.W_v(X)"), ("v = self.W_v(X)", "v = self.W_k(X)")],
                                   "`W_k` and `W_v`"),
    "09 not causal": ("09_the_2026_block", "class Block2026", "check_build",
                      [("causal=True)", "causal=False)")], "`attention` is built with causal=False"),
    "09 rope_theta ignored": ("09_the_2026_block", "class Block2026", "check_build",
                              [("rope_theta=rope_theta,", "rope_theta=1e4,")],
                              "`attention` is built with rope_theta=10000.0, d2lmini's `attention` with "
                              "rope_theta=500000.0"),
    "09 norm1 for the FFN": ("09_the_2026_block", "class Block2026", "check_build",
                             [("self.ffn(self.norm2(X))", "self.ffn(self.norm1(X))")], "uses norm1 twice"),
    "09 norms swapped": ("09_the_2026_block", "class Block2026", "check_build",
                         [("Y = self.norm1(X)", "Y = self.norm2(X)"), ("self.ffn(self.norm2(X))", "self.ffn(self.norm1(X))")],
                         "`norm1` and `norm2`"),
    "03 eps of BERT": ("03_normalization", "class MyLayerNorm", "check_build",
                       [("def __init__(self, num_hiddens, eps=1e-5)", "def __init__(self, num_hiddens, eps=1e-12)")],
                       "nn.LayerNorm's eps is 1e-05, yours 1e-12"),
    "05 eps too small": ("05_rmsnorm", "class MyRMSNorm", "check_build",
                         [("def __init__(self, num_hiddens, eps=1e-6)", "def __init__(self, num_hiddens, eps=1e-10)")],
                         "d2lmini's eps is 1e-06, yours 1e-10"),
    "08 forward returns the output only": ("08_attention_generation", "class MyGQA", "check_build",
                                           [("reshape(b, n, -1)), (k, v)", "reshape(b, n, -1))")],
                                           "forward returns a pair"),
    "08 cache as (v, k)": ("08_attention_generation", "class MyGQA", "check_build",
                           [("reshape(b, n, -1)), (k, v)", "reshape(b, n, -1)), (v, k)")], "keys first"),
    "08 heads repeated along the tokens": ("08_attention_generation", "class MyGQA", "check_build",
                                           [("k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)",
                                             "k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)")],
                                           "query head i reads key/value head i // group"),
    "01 scores K Q^T": ("01_anatomy", "class MiniBlock", "check_build",
                        [("torch.softmax(Q @ K.transpose(-2, -1)", "torch.softmax(K @ Q.transpose(-2, -1)")],
                        "Q K^T, not K Q^T"),
    "01 causal mask": ("01_anatomy", "class MiniBlock", "check_build",
                       [("torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]),",
                         "torch.softmax((Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])).masked_fill("
                         "torch.ones(X.shape[1], X.shape[1], dtype=torch.bool).triu(1), float('-inf')),")],
                       "no mask"),
    "01 X @ W_q.weight": ("01_anatomy", "class MiniBlock", "check_build",
                          [("split(self.W_q(X))", "split(X @ self.W_q.weight)")], "not T @ W_q.weight"),
    "01 O @ W_o.weight": ("01_anatomy", "class MiniBlock", "check_build",
                          [("self.W_o((A @ V).transpose(1, 2).flatten(-2))",
                            "(A @ V).transpose(1, 2).flatten(-2) @ self.W_o.weight")], "not T @ W_o.weight"),
    "06 no scale with QK-norm": ("06_qk_norm", "class MyAttention", "check_build",
                                 [("logits = q @ k.transpose(-1, -2) / self.head_dim ** 0.5",
                                   "logits = q @ k.transpose(-1, -2) / (1.0 if self.qk_norm else self.head_dim ** 0.5)")],
                                 "divide each head's logits by sqrt(d_h)"),
    "03 eps hard-coded": ("03_normalization", "class MyLayerNorm", "check_build",
                          [("self.eps = eps", "self.eps = 1e-5")], "nn.LayerNorm's eps is 0.001, yours 1e-05"),
    "09 default theta 5e5": ("09_the_2026_block", "class Block2026", "theirs, msg=lambda",
                             [("                 rope_theta=1e4):", "                 rope_theta=5e5):")],
                             "Block2026's default rope_theta"),
    "02 default without skips": ("02_residual", "class MiniBlock", "check_build",
                                 [("def __init__(self, num_hiddens, num_heads, residual=True)",
                                   "def __init__(self, num_hiddens, num_heads, residual=False)")],
                                 "both skips are missing"),
    "04 post-LN without skips": ("04_norm_placement", "class MiniBlock", "check_build",
                                 [("return norm(X + F(X))", "return norm(F(X))")],
                                 "both skips are missing: each step adds its input, norm(X + F(X))"),
    "05 normalized in bfloat16": ("05_rmsnorm", "class MyRMSNorm", "check_build",
                                  [("Y = X32 * torch.rsqrt(mean_square + self.eps)",
                                    "Y = X * torch.rsqrt(mean_square + self.eps).to(X.dtype)")],
                                  "normalize in float32 too"),
    "07 top_k fixed at 2": ("07_ffn", "class MyMoE", "expert_bias.normal_",
                            [("        self.top_k = top_k\n", "        self.top_k = 2\n")], "not a fixed two"),
    "08 scale sqrt(d)": ("08_attention_generation", "class MyGQA", "check_build",
                         [("/ self.d_h ** 0.5", "/ (self.h * self.d_h) ** 0.5")], "not by sqrt(num_hiddens)"),
    "08 no mask": ("08_attention_generation", "class MyGQA", "check_build",
                   [('scores.masked_fill(~mask, float("-inf"))', "scores")], "this attention is causal"),
    "08 mask reversed": ("08_attention_generation", "class MyGQA", "check_build",
                         [(".tril(diagonal=past)", ".triu(diagonal=past)")], "not those before it"),
    "08 heads tiled": ("08_attention_generation", "class MyGQA", "check_build",
                       [("K, V = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)",
                         "K, V = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)")], "giving i % 2"),
    "08 heads merged without the transpose": ("08_attention_generation", "class MyGQA", "check_build",
                                              [("(weights @ V).transpose(1, 2).reshape(b, n, -1)",
                                                "(weights @ V).reshape(b, n, -1)")], "bring the heads back"),
    "06 values rotated": ("06_qk_norm", "class MyAttention", "check_build",
                          [("q, k = rotate(q, positions, self.theta), rotate(k, positions, self.theta)",
                            "q, k, v = (rotate(x, positions, self.theta) for x in (q, k, v))")],
                          "the values are not rotated"),
    "06 no mask": ("06_qk_norm", "class MyAttention", "check_build",
                   [('logits.masked_fill(future, float("-inf"))', "logits")], "this attention is causal"),
    "06 scale sqrt(d)": ("06_qk_norm", "class MyAttention", "check_build",
                         [("/ self.head_dim ** 0.5", "/ (self.num_heads * self.head_dim) ** 0.5")],
                         "not by sqrt(num_hiddens)"),
    "03 eps typed in": ("03_normalization", "class MyLayerNorm", "check_build",
                        [("torch.sqrt(var + self.eps)", "torch.sqrt(var + 1e-5)")],
                        "nn.LayerNorm's eps is 0.001; yours computes as with 1e-05: compute with the eps given"),
    "05 eps typed in": ("05_rmsnorm", "class MyRMSNorm", "check_build",
                        [("torch.rsqrt(mean_square + self.eps)", "torch.rsqrt(mean_square + 1e-6)")],
                        "d2lmini's eps is 0.001; yours computes as with 1e-06: compute with the eps given"),
    "03 bias inside the gain": ("03_normalization", "class MyLayerNorm", "check_build",
                                [("self.gamma * (X - mu) / torch.sqrt(var + self.eps) + self.beta",
                                  "self.gamma * ((X - mu) / torch.sqrt(var + self.eps) + self.beta)")],
                                "not gamma * (x_hat + beta)"),
    "05 eps hard-coded": ("05_rmsnorm", "class MyRMSNorm", "check_build",
                          [("self.eps = eps", "self.eps = 1e-6")], "d2lmini's eps is 0.001, yours 1e-06"),
    "05 eps squared": ("05_rmsnorm", "class MyRMSNorm", "check_build",
                       [("torch.rsqrt(mean_square + self.eps)", "torch.rsqrt(mean_square + self.eps ** 2)")],
                       "or with a much smaller one"),
    "03 gain a buffer": ("03_normalization", "class MyLayerNorm", "check_build",
                         [("self.gamma = nn.Parameter(torch.ones(num_hiddens))",
                           "self.register_buffer('gamma', torch.ones(num_hiddens))")],
                         "`gamma` is a buffer in yours, a parameter in d2lmini's"),
    "05 output in float32": ("05_rmsnorm", "class MyRMSNorm", "check_build",
                             [("return Y.to(X.dtype) * self.gamma", "return (Y.to(X.dtype) * self.gamma).float()")],
                             "your module returns torch.float32, d2lmini's torch.bfloat16"),
    "09 LayerNorm for RMSNorm": ("09_the_2026_block", "class Block2026", "check_build",
                                 [("self.norm1 = d2lmini.RMSNorm(num_hiddens)", "self.norm1 = nn.LayerNorm(num_hiddens, bias=False)")],
                                 "it is a LayerNorm, d2lmini's is an RMSNorm: RMSNorm subtracts no mean"),
    "01 dropout in the FFN": ("01_anatomy", "class MiniBlock", "check_build",
                              [("nn.ReLU(), nn.Linear(4 * num_hiddens, num_hiddens, bias=False))",
                                "nn.ReLU(), nn.Linear(4 * num_hiddens, num_hiddens, bias=False), nn.Dropout(0.1))")],
                              "is a dropout still in training mode"),
    "01 V from W_q": ("01_anatomy", "class MiniBlock", "check_build",
                      [("split(self.W_v(X))", "split(self.W_q(X))")], "your forward never calls `W_v`"),
    "01 W_o in float64": ("01_anatomy", "class MiniBlock", "check_build",
                          [("self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=False)",
                            "self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=False, dtype=torch.float64)")],
                          "`W_o.weight` is torch.float64"),
    "03 bias in float64": ("03_normalization", "class MyLayerNorm", "check_build",
                           [("self.beta = nn.Parameter(torch.zeros(num_hiddens))",
                             "self.beta = nn.Parameter(torch.zeros(num_hiddens, dtype=torch.float64))")],
                           "`beta` is torch.float64"),
    "05 rounded to bfloat16": ("05_rmsnorm", "class MyRMSNorm", "check_build",
                               [("return Y.to(X.dtype) * self.gamma", "return Y.bfloat16() * self.gamma")],
                               "not to torch.bfloat16"),
    "06 causal mask hides the diagonal": ("06_qk_norm", "class MyAttention", "check_build",
                                          [("torch.ones(n, n, dtype=torch.bool).triu(1)",
                                            "torch.ones(n, n, dtype=torch.bool).triu(0)")], "holds NaN"),
    "01 heads not transposed": ("01_anatomy", "class MiniBlock", "check_build",
                                [("return T.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)",
                                  "return T.unflatten(-1, (self.num_heads, -1))"),
                                 ("self.W_o((A @ V).transpose(1, 2).flatten(-2))", "self.W_o((A @ V).flatten(-2))")],
                                "each token's heads attend to one another"),
    "01 softmax over the heads": ("01_anatomy", "class MiniBlock", "check_build",
                                  [("dim=-1)  # (b, h, n, n)", "dim=1)  # (b, h, n, n)")], "not over the heads"),
    "01 scale multiplied": ("01_anatomy", "class MiniBlock", "check_build",
                            [("/ math.sqrt(Q.shape[-1])", "* math.sqrt(Q.shape[-1])")], "do not multiply"),
    "09 stream normalized before attention": ("09_the_2026_block", "class Block2026", "check_build",
                                              [("X = X + self.attention(Y, Y, Y, valid_lens)",
                                                "X = Y + self.attention(Y, Y, Y, valid_lens)")],
                                              "the stream is never normalized"),
    "03 gain of random values": ("03_normalization", "class MyLayerNorm", "check_build",
                                 [("self.gamma = nn.Parameter(torch.ones(num_hiddens))",
                                   "self.gamma = nn.Parameter(torch.randn(num_hiddens))")], "build gamma as ones"),
    "05 gain of zeros": ("05_rmsnorm", "class MyRMSNorm", "check_build",
                         [("self.gamma = nn.Parameter(torch.ones(num_hiddens))",
                           "self.gamma = nn.Parameter(torch.zeros(num_hiddens))")], "build gamma as ones"),
    "03 divided by the variance": ("03_normalization", "class MyLayerNorm", "check_build",
                                   [("torch.sqrt(var + self.eps)", "(var + self.eps)")], "not by the variance itself"),
    "05 upcast over X": ("05_rmsnorm", "class MyRMSNorm", "check_build",
                         [("X32 = X.float()", "X = X32 = X.float()")], "not X = X.float()"),
    "08 no cache from the first call": ("08_attention_generation", "class MyGQA", "check_build",
                                        [("reshape(b, n, -1)), (k, v)",
                                          "reshape(b, n, -1)), (None if cache is None else (k, v))")],
                                        "returns the new cache (k, v) too"),
    "08 keys cached scaled": ("08_attention_generation", "class MyGQA", "check_build",
                              [("        if cache is not None:  # the earlier",
                                "        k = k / self.d_h ** 0.5\n        if cache is not None:  # the earlier"),
                               ("scores = q @ K.transpose(-1, -2) / self.d_h ** 0.5", "scores = q @ K.transpose(-1, -2)")],
                              "unscaled and not yet repeated"),
}
RIGHT = sorted({(chapter, build, check) for chapter, build, check, _, _ in CASES.values()})


def run_to_check(chapter: str, build: str, check: str, mistake=None) -> str | None:
    """Run the chapter's code cells up to the check; return the check's AssertionError message, or
    None when it passes."""
    cells = nbformat.read(ROOT / "chapters" / f"{chapter}.ipynb", as_version=4).cells
    builds = [c for c in cells if c.cell_type == "code" and build in c.source]
    assert len(builds) == 1, f"{chapter}: one cell holds {build!r}"
    namespace = {}
    for cell in cells:
        tags = set(cell.metadata.get("tags", []))
        if cell.cell_type != "code" or tags & {"skip-execution", "timing", "clock"} or "show_code" in cell.source \
                or cell.source.lstrip().startswith("#@title Run to fill in the numbers"):
            continue
        source = cell.source
        if cell is builds[0]:
            for old, new in mistake or []:
                assert old in source, f"{chapter}: the Build-it cell no longer holds {old!r}"
                source = source.replace(old, new)
        is_check = check in source and cell is not builds[0]
        try:
            exec(compile(source, chapter, "exec"), namespace)
        except AssertionError as error:
            if is_check:
                return str(error)
        except Exception:
            if is_check or cell is builds[0]:
                raise
        if is_check:
            return None
    raise AssertionError(f"{chapter}: no check cell holds {check!r}")


@pytest.mark.parametrize("chapter, build, check", RIGHT, ids=[f"{c}:{b.split()[-1]}" for c, b, _ in RIGHT])
def test_each_build_it_check_passes_the_chapters_own_part(chapter, build, check):
    assert run_to_check(chapter, build, check) is None


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_build_it_check_fails_a_plausible_mistake_with_a_hint_naming_it(case):
    chapter, build, check, mistake, hint = CASES[case]
    message = run_to_check(chapter, build, check, mistake)
    assert message is not None, f"{case}: the check passed the wrong part"
    assert "Hint:" in message and hint in message, f"{case}: {message}"


def test_check_build_says_where_a_block_differs():
    class Block(nn.Module):
        def __init__(self, swap=False, act=nn.ReLU):
            super().__init__()
            self.swap = swap
            self.norm1, self.norm2 = nn.LayerNorm(8), nn.LayerNorm(8)
            self.ffn = nn.Sequential(nn.Linear(8, 16), act(), nn.Linear(16, 8))

        def forward(self, X):
            a, b = (self.norm2, self.norm1) if self.swap else (self.norm1, self.norm2)
            return X + self.ffn(a(X)) + b(X)

    torch.manual_seed(0)
    ref = Block()
    for p in (*ref.norm1.parameters(), *ref.norm2.parameters()):
        nn.init.normal_(p)
    X = torch.randn(2, 3, 8)
    for mine, words in ((Block(swap=True), "`norm1` where `norm2` belongs"), (Block(act=nn.GELU), "`ffn` alone")):
        mine.load_state_dict(ref.state_dict())
        with pytest.raises(AssertionError, match="Hint:") as error:
            check_build(mine, ref, X)
        assert words in str(error.value)
    mine = Block()
    with pytest.raises(AssertionError, match=r"`norm1` holds other weights .*copy_parameters\(ref, mine, rename\)"):
        check_build(mine, ref, X)  # a correct block whose weights were never copied
    mine.load_state_dict(ref.state_dict())
    assert check_build(mine, ref, X).shape == X.shape
    with pytest.raises(TypeError, match="nn.Module"):
        check_build(lambda X: X, ref, X)


class _Attention(nn.Module):
    """A one-head attention with ``forward(queries, keys, values, valid_lens=None)``, as d2lmini's;
    ``mask=False`` ignores ``valid_lens`` (the slip the check must find alone)."""

    def __init__(self, d, mask=True):
        super().__init__()
        self.mask = mask
        self.W_q, self.W_k, self.W_v = (nn.Linear(d, d, bias=False) for _ in range(3))

    def forward(self, queries, keys, values, valid_lens=None):
        scores = self.W_q(queries) @ self.W_k(keys).transpose(1, 2) / queries.shape[-1] ** 0.5
        if self.mask and valid_lens is not None:
            positions = torch.arange(keys.shape[1])
            scores = scores.masked_fill(positions[None, None, :] >= valid_lens[:, None, None], -1e9)
        return torch.softmax(scores, dim=-1) @ self.W_v(values)


class _AttentionBlock(nn.Module):
    def __init__(self, d=8, mask=True, order=("norm1", "norm2")):
        super().__init__()
        self.order = order
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attention = _Attention(d, mask)
        self.ffn = nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, d))

    def forward(self, X, valid_lens=None):
        a, b = (getattr(self, name) for name in self.order)
        H = a(X)
        X = X + self.attention(H, H, H, valid_lens)
        return X + self.ffn(b(X))


def test_check_build_runs_an_attention_part_alone_with_and_without_valid_lens():
    torch.manual_seed(0)
    ref = _AttentionBlock()
    for p in (*ref.norm1.parameters(), *ref.norm2.parameters()):
        nn.init.normal_(p)
    X, valid_lens = torch.randn(2, 5, 8), torch.tensor([5, 3])
    cases = ((_AttentionBlock(mask=False), "`attention` alone", "valid_lens=["),
             (_AttentionBlock(order=("norm2", "norm1")), "`norm1` where `norm2` belongs", None))
    for mine, words, call in cases:
        mine.load_state_dict(ref.state_dict())
        with pytest.raises(AssertionError, match="Hint:") as error:
            check_build(mine, ref, X, valid_lens)
        message = str(error.value)
        assert words in message and "could not be run alone" not in message, message
        assert call is None or call in message, message
    # an attention part that agrees alone is named among the parts that agree
    mine = _AttentionBlock()
    mine.load_state_dict(ref.state_dict())
    mine.ffn[1] = nn.Identity()  # no ReLU: ffn differs alone
    with pytest.raises(AssertionError, match="`ffn` alone"):
        check_build(mine, ref, X, valid_lens)
    mine = _AttentionBlock()
    mine.load_state_dict(ref.state_dict())
    mine.forward = lambda X, valid_lens=None: X + mine.attention(X, X, X, valid_lens)  # noqa: E731
    with pytest.raises(AssertionError, match="Hint:") as error:
        check_build(mine, ref, X, valid_lens)
    assert "your forward never calls `norm1`" in str(error.value)  # nor norm2 and ffn: the first is named
