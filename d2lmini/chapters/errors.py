"""A catalogue of common misuses of d2lmini and the error each one gets.

The book's page "Misuse and its errors" runs :func:`misuse_table` at build time,
so the messages it shows are the ones the code really raises; the tests run the
same catalogue, also under ``python -O``.
"""

from __future__ import annotations

import torch

#: ``(what goes wrong, the code that does it)``. The code runs with ``torch``, the
#: public d2lmini names, ``block = TransformerBlock(32, 4)``, ``mha =
#: MultiHeadAttention(32, 4)`` and ``X = torch.randn(2, 5, 32)`` in scope.
MISUSES = (
    ("num_hiddens not divisible by num_heads", "TransformerBlock(30, num_heads=4)"),
    ("num_heads not divisible by num_kv_heads", "MultiHeadAttention(32, 4, num_kv_heads=3)"),
    ("unknown norm name", "TransformerBlock(32, 4, norm='batch')"),
    ("unknown activation name", "TransformerBlock(32, 4, act='tanh')"),
    ("unknown placement name", "TransformerBlock(32, 4, placement='preln')"),
    ("unknown QK-norm name", "MultiHeadAttention(32, 4, qk_norm='after_rope')"),
    ("negative dropout", "TransformerBlock(32, 4, dropout=-0.1)"),
    ("dropout given as a string", "TransformerBlock(32, 4, dropout='0.1')"),
    ("RoPE with an odd head_dim", "MultiHeadAttention(30, 2, rope_theta=10000.0)"),
    ("input without a batch dimension", "block(torch.randn(5, 32))"),
    ("input with the wrong last dimension", "block(torch.randn(2, 5, 16))"),
    ("integer input", "block(torch.ones(2, 5, 32, dtype=torch.long))"),
    ("valid_lens of the wrong shape", "block(X, valid_lens=torch.tensor([5, 5, 5]))"),
    ("valid_lens of a float dtype", "block(X, valid_lens=torch.tensor([5.0, 2.0]))"),
    ("valid_lens longer than the sequence", "block(X, valid_lens=torch.tensor([6, 2]))"),
    ("valid_lens of zero (a query that sees no key)", "block(X, valid_lens=torch.tensor([5, 0]))"),
    ("valid_lens as a Python list", "block(X, valid_lens=[5, 2])"),
    ("float64 input to a float32 block", "block(X.double())"),
    ("keys and values of different shapes", "mha(X, torch.randn(2, 4, 32), torch.randn(2, 6, 32))"),
    ("sublayer_norm_gain on a placement without a sublayer-output norm",
     "TransformerBlock(32, 4, placement='pre', sublayer_norm_gain=0.1)"),
)


def misuse_table() -> list[dict]:
    """Run every entry of :data:`MISUSES` and record what it raises.

    Returns:
        One dict per misuse with keys ``misuse``, ``code``, ``error`` (the
        exception's type name, or ``'no error'``) and ``message``.
    """
    import d2lmini

    rows = []
    for misuse, code in MISUSES:
        scope = {name: getattr(d2lmini, name) for name in d2lmini.__all__}
        scope.update(torch=torch, block=d2lmini.TransformerBlock(32, 4), mha=d2lmini.MultiHeadAttention(32, 4),
                     X=torch.randn(2, 5, 32))
        try:
            eval(code, scope)  # the catalogue's own fixed expressions, never user input
        except Exception as error:  # noqa: BLE001 - recording what is raised is the point
            rows.append(dict(misuse=misuse, code=code, error=type(error).__name__, message=str(error)))
        else:
            rows.append(dict(misuse=misuse, code=code, error="no error", message=""))
    return rows
