r"""DeepSeek-V4's attention and mixture of experts: compressed keys and values, hash routing.

Every DeepSeek-V4 layer is a :class:`~d2lmini.hyper.HyperConnectedBlock` (four
hyper-connected residual streams) around two sublayers reproduced here:

* :class:`CompressedAttention`: multi-query attention (one key/value head, the *same*
  tensor read as key and as value) over a sliding window of the last ``window`` tokens,
  plus -- in the compressed layers -- a short list of *compressed* entries, each a learned
  softmax-pooling of ``ratio`` consecutive tokens (:class:`KVCompressor`). A
  *heavily compressed* layer (HCA, ratio 128 in V4) attends to every compressed entry
  whose window is complete; a *compressed sparse* layer (CSA, ratio 4, overlapping
  windows) attends only to the ``topk`` of them that a :class:`LightningIndexer`
  selects for each query. Queries come through a low-rank projection with an RMSNorm,
  each head is RMS-normalized without a gain, RoPE rotates the *last* ``rope_dim``
  features of each head in interleaved pairs (:func:`rotate_interleaved`), a learned
  per-head *sink* logit takes part in the softmax (as gpt-oss), the values' rotation
  is undone on the output (rotation by minus the query's angle), and the heads are
  projected out through a grouped low-rank projection.
* The MoE: a :class:`~d2lmini.moe.MixtureOfExperts` with ``router='sqrtsoftplus'`` and
  clamped SwiGLU experts (``act='swiglu'``, ``swiglu_limit``), or, in the first layers,
  :class:`HashRoutedMoE`, whose experts are a fixed function of the token id.

Source: Hugging Face ``transformers`` 5.24, ``models/deepseek_v4/modeling_deepseek_v4.py``
(``DeepseekV4Attention``, ``DeepseekV4HCACompressor``, ``DeepseekV4CSACompressor``,
``DeepseekV4Indexer``, ``DeepseekV4GroupedLinear``, ``DeepseekV4SparseMoeBlock``,
``DeepseekV4TopKRouter``, ``DeepseekV4HashRouter``), single forward calls without a
cache. :func:`d2lmini.reference.from_deepseek_v4_layer` converts a whole
``DeepseekV4DecoderLayer``; ``tests/test_deepseek_v4.py`` checks all three layer types.
Shapes use d2l's names: ``(batch, num_steps, num_hiddens)``.
"""

from __future__ import annotations

import torch
from torch import nn

from ._checks import (
    check_choice,
    check_int_at_least,
    check_int_tensor,
    check_last_dim,
    check_positive_float,
    check_positive_int,
    check_sequence_tensor,
)
from .attention import apply_rotary, check_rope_scaling, rotary_cos_sin, valid_lens_mask
from .moe import MixtureOfExperts
from .norms import RMSNorm, unweighted_rms_norm

#: The compressed layer kinds of :class:`CompressedAttention`: heavily compressed (HCA,
#: non-overlapping windows, every complete one visible) and compressed sparse (CSA,
#: overlapping windows, an indexer's top-k visible).
COMPRESSIONS = ("hca", "csa")


def rotate_interleaved(X: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the *last* ``r = cos.shape[-1]`` features of ``X``, in interleaved pairs ``(2l, 2l + 1)``.

    DeepSeek-V4's ``[nope | rope]`` head layout (Hugging Face ``apply_rotary_pos_emb`` in
    ``modeling_deepseek_v4.py``): the leading ``head_dim - r`` features pass unchanged and
    the trailing ``r`` are rotated by :func:`~d2lmini.attention.apply_rotary` with
    ``interleaved=True``, computed in float32 and cast back. With ``-sin`` it undoes the rotation.

    Args:
        X: ``(..., num_steps, head_dim)``.
        cos, sin: ``(num_steps, r)`` from :func:`~d2lmini.attention.rotary_cos_sin` with
            ``interleaved=True``; ``r`` even and ``<= head_dim``.
    """
    r = cos.shape[-1]
    rotated = apply_rotary(X[..., -r:].float(), cos, sin, interleaved=True)
    return torch.cat((X[..., :-r], rotated.to(X.dtype)), dim=-1)


class KVCompressor(nn.Module):
    r"""Pool every ``ratio`` consecutive tokens into one compressed key/value entry (DeepSeek-V4).

    Each token ``x_j`` gives a content ``c_j = W_kv x_j`` and a gate ``z_j = W_z x_j``
    (``head_dim`` features each); window ``w`` (tokens ``w r .. w r + r - 1``) becomes

    .. math:: C_w = \mathrm{RMSNorm}\Big(\sum_{j \in w} \mathrm{softmax}_j(z_j + B_{j - w r}) \odot c_j\Big),

    a softmax over the window's tokens per feature, ``B`` a learned ``(ratio, head_dim)``
    position bias; then RoPE (:func:`rotate_interleaved`, the last ``rope_dim`` features)
    at the window's first position ``w r``. Only complete windows are pooled: ``n`` tokens
    give ``n // ratio`` entries (the rest are dropped, as without a cache).

    With ``overlap=True`` (compressed sparse attention, CSA) every token gives *two*
    contents and gates (``2 head_dim`` features: ``a`` the first half, ``b`` the second) and
    window ``w`` pools ``2 ratio`` slots: the ``a`` halves of window ``w - 1``'s tokens and
    the ``b`` halves of its own (window 0: its own only), so entries overlap by ``ratio``
    tokens. Without it (heavily compressed attention, HCA) windows do not overlap.

    Follows Hugging Face ``transformers`` 5.24 ``DeepseekV4HCACompressor`` (``overlap=False``),
    ``DeepseekV4CSACompressor`` and ``DeepseekV4Indexer``'s compressor (``overlap=True``),
    without a cache. Names: ``W_kv`` = ``kv_proj``, ``W_z`` = ``gate_proj``,
    ``position_bias``, ``norm`` = ``kv_norm``.

    Args:
        num_hiddens: model width ``d``.
        head_dim: features of an entry.
        ratio: tokens per window (V4: 4 for CSA, 128 for HCA).
        overlap: CSA's overlapping windows (see above).
        rope_dim: rotated features (even, ``<= head_dim``).
        rope_theta, rope_scaling: the RoPE base and scaling (V4: ``compress_rope_theta``
            and its YaRN), see :func:`~d2lmini.attention.rope_frequencies`.
        eps: the RMSNorm's epsilon.

    Shape:
        ``(b, n, d)`` in, ``(b, n // ratio, head_dim)`` out.

    Raises:
        ValueError / TypeError: sizes not positive ints, ``rope_dim`` odd or above ``head_dim``,
            a bad RoPE base or scaling; at call time an input that is not ``(b, n, d)``.
    """

    def __init__(self, num_hiddens: int, head_dim: int, ratio: int, *, overlap: bool = False, rope_dim: int,
                 rope_theta: float = 10000.0, rope_scaling: dict | None = None, eps: float = 1e-6):
        super().__init__()
        self.num_hiddens = check_positive_int("num_hiddens", num_hiddens)
        self.head_dim = check_positive_int("head_dim", head_dim)
        self.ratio = check_positive_int("ratio", ratio)
        self.overlap = bool(overlap)
        self.rope_dim = _check_rope_dim(rope_dim, self.head_dim)
        self.rope_theta = check_positive_float("rope_theta", rope_theta)
        self.rope_scaling = None if rope_scaling is None else check_rope_scaling(rope_scaling)
        width = (2 if self.overlap else 1) * self.head_dim
        self.W_kv = nn.Linear(self.num_hiddens, width, bias=False)
        self.W_z = nn.Linear(self.num_hiddens, width, bias=False)
        self.position_bias = nn.Parameter(torch.zeros(self.ratio, width))
        self.norm = RMSNorm(self.head_dim, eps)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """The compressed entries of ``X`` ``(b, n, d)``: ``(b, n // ratio, head_dim)``."""
        check_sequence_tensor("X", X, self.num_hiddens)
        b = X.shape[0]
        m, D, W = self.ratio, self.head_dim, X.shape[1] // self.ratio
        if W == 0:
            return X.new_zeros(b, 0, D)
        c = self.W_kv(X[:, :W * m]).unflatten(1, (W, m))  # (b, W, m, width)
        z = self.W_z(X[:, :W * m]).unflatten(1, (W, m)) + self.position_bias
        if self.overlap:  # slots: window w-1's first halves (none for w = 0), then window w's second halves
            c_prev = torch.cat((c.new_zeros(b, 1, m, D), c[:, :-1, :, :D]), dim=1)
            z_prev = torch.cat((z.new_full((b, 1, m, D), float("-inf")), z[:, :-1, :, :D]), dim=1)
            c, z = torch.cat((c_prev, c[..., D:]), dim=2), torch.cat((z_prev, z[..., D:]), dim=2)
        pooled = (c * z.float().softmax(dim=2).to(c.dtype)).sum(dim=2)  # (b, W, D)
        positions = torch.arange(W, device=X.device) * m
        cos, sin = rotary_cos_sin(positions, self.rope_dim, self.rope_theta, scaling=self.rope_scaling,
                                  interleaved=True)
        return rotate_interleaved(self.norm(pooled), cos, sin)

    def extra_repr(self) -> str:
        return (f"{self.num_hiddens}, head_dim={self.head_dim}, ratio={self.ratio}, overlap={self.overlap}, "
                f"rope_dim={self.rope_dim}")


def _check_rope_dim(rope_dim, head_dim: int) -> int:
    rope_dim = check_positive_int("rope_dim", rope_dim)
    if rope_dim % 2 or rope_dim > head_dim:
        raise ValueError(f"rope_dim must be even and <= head_dim={head_dim}, got {rope_dim}")
    return rope_dim


def visible_entries(num_steps: int, num_entries: int, ratio: int, device=None) -> torch.Tensor:
    """Which compressed entries each query may see: ``(num_steps, num_entries)`` bool.

    Query ``t`` sees entry ``w`` iff ``w < (t + 1) // ratio``, i.e. iff window ``w``'s last
    token ``w ratio + ratio - 1`` is at or before ``t`` (Hugging Face ``DeepseekV4HCACompressor``'s
    ``causal_threshold``; CSA's overlapping entry ``w`` also reads window ``w - 1``, earlier still).
    """
    threshold = (torch.arange(num_steps, device=device) + 1) // ratio
    return torch.arange(num_entries, device=device)[None, :] < threshold[:, None]


class LightningIndexer(nn.Module):
    r"""DeepSeek-V4's lightning indexer: for each query, the ``topk`` compressed entries CSA attends to.

    Its own overlapping :class:`KVCompressor` (``head_dim`` features per entry) gives one
    key ``K_s`` per window; queries come from the attention's query latent ``c_q``:
    ``q = W_q c_q``, ``num_heads`` heads rotated by RoPE at the query positions (the last
    ``rope_dim`` features, interleaved); per-head weights ``w = W_w x * num_heads ** -0.5``.
    The index score of entry ``s`` for query ``t`` is

    .. math:: I_{t,s} = \sum_h w_{t,h}\, \mathrm{ReLU}(q_{t,h} \cdot K_s)\, \mathrm{head\_dim}^{-1/2},

    entries not yet complete at ``t`` (:func:`visible_entries`) score ``-inf``, and the
    ``min(topk, n // ratio)`` best are selected -- those still invisible (a query with fewer
    complete entries than ``topk``) are dropped. Not differentiable (integer selection).

    Follows Hugging Face ``transformers`` 5.24 ``DeepseekV4Indexer`` and
    ``DeepseekV4IndexerScorer`` (without a cache); names: ``compressor`` (``kv_proj``,
    ``gate_proj``, ``position_bias``, ``kv_norm``), ``W_q`` = ``q_b_proj``,
    ``W_w`` = ``scorer.weights_proj``.

    Args:
        num_hiddens: model width ``d``; q_lora_rank: width of ``c_q``.
        num_heads, head_dim: the indexer's heads (V4: ``index_n_heads``, ``index_head_dim``).
        ratio: the compression ratio (CSA's). topk: entries per query (``index_topk``).
        rope_dim, rope_theta, rope_scaling, eps: as :class:`KVCompressor`.

    Shape:
        ``forward(X, c_q)``: ``(b, n, d)`` and ``(b, n, q_lora_rank)``; returns a bool
        ``(b, n, n // ratio)``, ``True`` at the selected, visible entries.

    Raises:
        ValueError / TypeError: as :class:`KVCompressor`, ``topk`` not a positive int; at
            call time inputs of the wrong shapes.
    """

    def __init__(self, num_hiddens: int, q_lora_rank: int, *, num_heads: int, head_dim: int, ratio: int, topk: int,
                 rope_dim: int, rope_theta: float = 10000.0, rope_scaling: dict | None = None, eps: float = 1e-6):
        super().__init__()
        self.num_hiddens = check_positive_int("num_hiddens", num_hiddens)
        self.q_lora_rank = check_positive_int("q_lora_rank", q_lora_rank)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.head_dim = check_positive_int("head_dim", head_dim)
        self.topk = check_positive_int("topk", topk)
        self.compressor = KVCompressor(num_hiddens, head_dim, ratio, overlap=True, rope_dim=rope_dim,
                                       rope_theta=rope_theta, rope_scaling=rope_scaling, eps=eps)
        self.W_q = nn.Linear(self.q_lora_rank, self.num_heads * self.head_dim, bias=False)
        self.W_w = nn.Linear(self.num_hiddens, self.num_heads, bias=False)

    def scores(self, X: torch.Tensor, c_q: torch.Tensor) -> torch.Tensor:
        """The index scores ``I`` ``(b, n, n // ratio)`` in float32, invisible entries ``-inf``."""
        check_sequence_tensor("c_q", c_q, self.q_lora_rank)
        keys = self.compressor(X).float()  # (b, W, D)
        n, comp = X.shape[1], self.compressor
        cos, sin = rotary_cos_sin(n, comp.rope_dim, comp.rope_theta, X.device, scaling=comp.rope_scaling,
                                  interleaved=True)
        q = self.W_q(c_q).unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)  # (b, H, n, D)
        q = rotate_interleaved(q, cos, sin).float()
        per_head = torch.relu(q @ keys[:, None].transpose(-1, -2)) * self.head_dim ** -0.5  # (b, H, n, W)
        weights = self.W_w(X).float() * self.num_heads ** -0.5  # (b, n, H)
        index = torch.einsum("bhnw,bnh->bnw", per_head, weights)
        visible = visible_entries(n, keys.shape[1], comp.ratio, X.device)
        return index.masked_fill(~visible, float("-inf"))

    @torch.no_grad()
    def forward(self, X: torch.Tensor, c_q: torch.Tensor) -> torch.Tensor:
        """The selected entries: bool ``(b, n, n // ratio)`` (see the class)."""
        index = self.scores(X, c_q)
        chosen = index.topk(min(self.topk, index.shape[-1]), dim=-1).indices
        selected = torch.zeros_like(index, dtype=torch.bool).scatter_(-1, chosen, True)
        return selected & (index > float("-inf"))

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, topk={self.topk}"


class CompressedAttention(nn.Module):
    r"""DeepSeek-V4's attention: shared-KV multi-query attention over a sliding window and compressed entries.

    For a token ``x`` (width ``d``), ``h`` heads of ``head_dim`` features:

    * Queries through a low-rank bottleneck: ``c_q = RMSNorm(W_qa x)`` (``q_lora_rank``),
      ``q = W_qb c_q``, each head RMS-normalized *without* a gain.
    * One key/value head: ``kv = RMSNorm(W_kv x)``, used as key *and* as value.
    * RoPE on the last ``rope_dim`` features of each query and of ``kv``, interleaved pairs
      (:func:`rotate_interleaved`; base ``rope_theta`` in sliding layers,
      ``compress_rope_theta`` with ``compress_rope_scaling`` in compressed ones).
    * Logits ``q . k / sqrt(head_dim)`` for the keys of the sliding window (``t - window <
      s <= t``, not padding), and, with ``compress``, for the compressed entries of a
      :class:`KVCompressor` of ratio ``compress_ratio``: ``'hca'``, every complete entry
      (:func:`visible_entries`); ``'csa'``, with overlapping windows, only those a
      :class:`LightningIndexer` selects.
    * A softmax that includes a learned per-head *sink* logit (``sinks``, gpt-oss's
      attention sink), dropped after the softmax; values are the keys.
    * The output of each head rotated back by its query's angle (RoPE with ``-sin``), so
      that what a value contributes depends on its distance to the query only.
    * A grouped output projection: the ``h head_dim`` features in ``o_groups`` groups, each
      projected to ``o_lora_rank`` by its own matrix (``W_oa``, ``(g, o_lora_rank, h head_dim / g)``),
      then ``W_ob`` maps the ``g o_lora_rank`` features to ``d``.

    Follows Hugging Face ``transformers`` 5.24 ``DeepseekV4Attention`` with eager attention,
    no cache; names: ``W_qa`` = ``q_a_proj``, ``q_norm`` = ``q_a_norm``, ``W_qb`` =
    ``q_b_proj``, ``W_kv`` = ``kv_proj``, ``kv_norm``, ``W_oa`` = ``o_a_proj.weight``
    viewed ``(g, o_lora_rank, -1)``, ``W_ob`` = ``o_b_proj``, ``sinks``, ``compressor``
    (with ``compressor.indexer`` there, ``indexer`` here).

    Args:
        num_hiddens: model width ``d``; num_heads: query heads ``h``.
        head_dim: features per head (V4: 512); q_lora_rank: query bottleneck (V4: 1024).
        rope_dim: rotated features per head (V4: 64, ``head_dim * partial_rotary_factor``).
        window: the sliding window (V4: 128), keys ``t - window < s <= t``.
        o_groups, o_lora_rank: the grouped output projection (V4-Flash: 8, 1024);
            ``o_groups`` must divide ``h head_dim``.
        rope_theta: RoPE base of sliding layers (V4: 10,000).
        compress: ``None`` (sliding window only), ``'hca'`` or ``'csa'``.
        compress_ratio: tokens per compressed entry (V4: 128 for HCA, 4 for CSA); only with ``compress``.
        compress_rope_theta, compress_rope_scaling: RoPE of compressed layers (V4: 160,000, YaRN).
        index_heads, index_head_dim, index_topk: the indexer's (``'csa'`` only; V4: 64, 128, 512).
        eps: the RMSNorms' epsilon (V4's ``rms_norm_eps``).

    Shape:
        ``forward(queries, keys, values, valid_lens=None)``: self-attention only (``keys`` and
        ``values`` must be ``queries``; the signature is :class:`~d2lmini.block.TransformerBlock`'s),
        ``(b, n, d)`` and ``valid_lens`` ``None`` or ``(b,)``; returns ``(b, n, d)``.

    Raises:
        ValueError / TypeError: sizes not positive ints, an unknown ``compress``, a
            ``compress_ratio`` or indexer size given without it (or missing with it),
            ``o_groups`` not dividing ``h head_dim``, a bad ``rope_dim``; at call time
            ``keys``/``values`` other than ``queries``, bad shapes or ``valid_lens``.
    """

    def __init__(self, num_hiddens: int, num_heads: int, *, head_dim: int, q_lora_rank: int, rope_dim: int,
                 window: int, o_groups: int, o_lora_rank: int, rope_theta: float = 10000.0,
                 compress: str | None = None, compress_ratio: int | None = None,
                 compress_rope_theta: float = 160000.0, compress_rope_scaling: dict | None = None,
                 index_heads: int | None = None, index_head_dim: int | None = None, index_topk: int | None = None,
                 eps: float = 1e-6):
        super().__init__()
        self.num_hiddens = check_positive_int("num_hiddens", num_hiddens)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.head_dim = check_positive_int("head_dim", head_dim)
        self.q_lora_rank = check_positive_int("q_lora_rank", q_lora_rank)
        self.rope_dim = _check_rope_dim(rope_dim, self.head_dim)
        self.window = check_positive_int("window", window)
        self.o_groups = check_positive_int("o_groups", o_groups)
        self.o_lora_rank = check_positive_int("o_lora_rank", o_lora_rank)
        self.eps = check_positive_float("eps", eps)
        if (self.num_heads * self.head_dim) % self.o_groups:
            raise ValueError(f"o_groups must divide num_heads * head_dim = {self.num_heads * self.head_dim}, "
                             f"got o_groups={o_groups}")
        self.compress = None if compress is None else check_choice("compress", compress, COMPRESSIONS)
        index = {"index_heads": index_heads, "index_head_dim": index_head_dim, "index_topk": index_topk}
        if self.compress is None and compress_ratio is not None:
            raise ValueError(f"compress_ratio applies only with compress in {COMPRESSIONS}, got compress=None")
        if self.compress != "csa" and any(v is not None for v in index.values()):
            raise ValueError(f"index_heads, index_head_dim and index_topk apply only with compress='csa', "
                             f"got compress={compress!r}")
        if self.compress == "csa" and any(v is None for v in index.values()):
            raise ValueError(f"compress='csa' needs index_heads, index_head_dim and index_topk, got {index}")
        if self.compress is None:
            self.rope_theta, self.rope_scaling = check_positive_float("rope_theta", rope_theta), None
        else:
            self.rope_theta = check_positive_float("compress_rope_theta", compress_rope_theta)
            self.rope_scaling = None if compress_rope_scaling is None else check_rope_scaling(compress_rope_scaling)
            if compress_ratio is None:
                raise ValueError(f"compress={compress!r} needs compress_ratio, the tokens per compressed entry")
            check_int_at_least("compress_ratio", compress_ratio, 1)
        if self.compress == "csa" and check_positive_int("index_head_dim", index_head_dim) < self.rope_dim:
            raise ValueError(f"the indexer rotates rope_dim={rope_dim} features, so index_head_dim must be "
                             f">= {rope_dim}, got {index_head_dim}")
        rope = dict(rope_dim=self.rope_dim, rope_theta=self.rope_theta, rope_scaling=self.rope_scaling, eps=eps)
        d, h, D = self.num_hiddens, self.num_heads, self.head_dim
        self.W_qa = nn.Linear(d, self.q_lora_rank, bias=False)
        self.q_norm = RMSNorm(self.q_lora_rank, eps)
        self.W_qb = nn.Linear(self.q_lora_rank, h * D, bias=False)
        self.W_kv = nn.Linear(d, D, bias=False)
        self.kv_norm = RMSNorm(D, eps)
        self.W_oa = nn.Parameter(torch.randn(self.o_groups, self.o_lora_rank, h * D // self.o_groups)
                                 * (h * D // self.o_groups) ** -0.5)
        self.W_ob = nn.Linear(self.o_groups * self.o_lora_rank, d, bias=False)
        self.sinks = nn.Parameter(torch.zeros(h))
        self.compressor = (None if self.compress is None else
                           KVCompressor(d, D, compress_ratio, overlap=self.compress == "csa", **rope))
        self.indexer = (None if self.compress != "csa" else
                        LightningIndexer(d, self.q_lora_rank, num_heads=index_heads, head_dim=index_head_dim,
                                         ratio=compress_ratio, topk=index_topk, **rope))

    def forward(self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                valid_lens: torch.Tensor | None = None) -> torch.Tensor:
        """Attend from every position of ``queries`` ``(b, n, d)`` (self-attention); returns ``(b, n, d)``."""
        X = check_sequence_tensor("queries", queries, self.num_hiddens)
        if keys is not queries or values is not queries:
            raise ValueError("CompressedAttention is self-attention only: keys and values must be queries")
        b, n, _ = X.shape
        h, D = self.num_heads, self.head_dim
        cos, sin = rotary_cos_sin(n, self.rope_dim, self.rope_theta, X.device, scaling=self.rope_scaling,
                                  interleaved=True)
        c_q = self.q_norm(self.W_qa(X))
        q = unweighted_rms_norm(self.W_qb(c_q).unflatten(-1, (h, D)).transpose(1, 2), self.eps)  # (b, h, n, D)
        q = rotate_interleaved(q, cos, sin)
        kv = rotate_interleaved(self.kv_norm(self.W_kv(X))[:, None], cos, sin)  # (b, 1, n, D): keys = values
        steps = torch.arange(n, device=X.device)
        allowed = (steps[None, :] <= steps[:, None]) & (steps[:, None] - steps[None, :] < self.window)
        allowed = allowed.expand(b, n, n)
        if valid_lens is not None:
            allowed = allowed & valid_lens_mask(valid_lens, n)[:, None, :]
        if self.compressor is not None:  # append the compressed entries to the keys and values
            entries = self.compressor(X)[:, None]  # (b, 1, W, D)
            seen = visible_entries(n, entries.shape[2], self.compressor.ratio, X.device).expand(b, -1, -1)
            if self.indexer is not None:
                seen = seen & self.indexer(X, c_q)
            kv = torch.cat((kv, entries), dim=2)
            allowed = torch.cat((allowed, seen), dim=-1)
        logits = (q @ kv.transpose(-1, -2)) * D ** -0.5  # (b, h, n, n + W)
        logits = logits.masked_fill(~allowed[:, None], float("-inf"))
        sinks = self.sinks.to(logits.dtype)[None, :, None, None].expand(b, h, n, 1)
        weights = torch.cat((logits, sinks), dim=-1).softmax(dim=-1)[..., :-1]  # the sink takes its share
        out = rotate_interleaved(weights @ kv, cos, -sin)  # (b, h, n, D): the values' rotation undone
        grouped = out.transpose(1, 2).reshape(b, n, self.o_groups, -1)  # (b, n, g, h D / g)
        return self.W_ob(torch.einsum("bngi,gri->bngr", grouped, self.W_oa).flatten(2))

    def extra_repr(self) -> str:
        compress = "" if self.compress is None else f", compress={self.compress!r}, ratio={self.compressor.ratio}"
        return (f"{self.num_hiddens}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
                f"q_lora_rank={self.q_lora_rank}, rope_dim={self.rope_dim}, window={self.window}, "
                f"o_groups={self.o_groups}, o_lora_rank={self.o_lora_rank}{compress}")


class HashRoutedMoE(MixtureOfExperts):
    r"""DeepSeek-V4's hash-routed mixture of experts: each token's experts are fixed by its id.

    A :class:`~d2lmini.moe.MixtureOfExperts` whose ``top_k`` experts for a token come from a
    fixed table, ``experts = token_experts[input_id]`` (a buffer ``(vocab_size, top_k)``,
    not learned), instead of the router's top-k; the router still weights them: with
    ``router='sqrtsoftplus'`` the weights are ``sqrt(softplus(s_e))`` of the chosen experts,
    renormalized and times ``route_scale``. DeepSeek-V4 routes its first three layers this
    way (Hugging Face ``transformers`` 5.24 ``DeepseekV4HashRouter``, ``tid2eid``;
    ``config.mlp_layer_types == 'hash_moe'``).

    Args:
        num_hiddens, num_experts: as :class:`~d2lmini.moe.MixtureOfExperts`.
        vocab_size: rows of the table.
        **kwargs:
            the other keyword arguments of :class:`~d2lmini.moe.MixtureOfExperts` (``top_k``,
            ``router`` among ``'softmax'``, ``'sigmoid'``, ``'sqrtsoftplus'``, experts, shared expert).

    Attributes:
        token_experts: the buffer ``(vocab_size, top_k)`` of expert indices (zeros until set).

    Shape:
        ``forward(X, input_ids)``: ``X`` ``(*, d)``, ``input_ids`` integer ``(*)``; returns ``(*, d)``.

    Raises:
        ValueError / TypeError: as :class:`~d2lmini.moe.MixtureOfExperts`, a bad ``vocab_size``,
            group-limited routing or ``router='sigmoid_input'``; at call time ``input_ids`` missing, not
            integers, not shaped like ``X`` without its last dimension, or out of ``[0, vocab_size)``.
    """

    def __init__(self, num_hiddens: int, num_experts: int = 8, *, vocab_size: int, **kwargs):
        super().__init__(num_hiddens, num_experts, **kwargs)
        if self.router_kind == "sigmoid_input" or self.topk_groups < self.num_groups:
            raise ValueError("HashRoutedMoE weights the experts of its table: router='sigmoid_input' and "
                             "group-limited routing do not apply")
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.register_buffer("token_experts", torch.zeros(self.vocab_size, self.top_k, dtype=torch.long))

    def forward(self, X: torch.Tensor, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Mix the table's experts for every token of ``X`` ``(*, d)`` with ids ``input_ids`` ``(*)``."""
        check_last_dim("X", X, self.num_hiddens)
        if input_ids is None:
            raise ValueError("HashRoutedMoE selects experts by token id: pass input_ids")
        check_int_tensor("input_ids", input_ids)
        if tuple(input_ids.shape) != tuple(X.shape[:-1]):
            raise ValueError(f"input_ids must have shape {tuple(X.shape[:-1])} (X without its last dimension), "
                             f"got {tuple(input_ids.shape)}")
        if input_ids.numel() and (input_ids.min() < 0 or input_ids.max() >= self.vocab_size):
            raise ValueError(f"input_ids must be in [0, vocab_size={self.vocab_size})")
        tokens = X.reshape(-1, self.num_hiddens)
        experts = self.token_experts[input_ids.reshape(-1)]
        weights = self.mix_weights(self.router_scores(tokens), experts)  # the router's scoring, the table's experts
        return self.combine(tokens, weights, experts).reshape(X.shape)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", vocab_size={self.vocab_size}, routing='hash'"


__all__ = ["COMPRESSIONS", "CompressedAttention", "HashRoutedMoE", "KVCompressor", "LightningIndexer",
           "rotate_interleaved", "visible_entries"]
