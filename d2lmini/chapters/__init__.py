"""Each chapter's experiments, one module per notebook, named after it.

The model parts they measure live one level up (:mod:`d2lmini.norms`,
:mod:`d2lmini.attention`, :mod:`d2lmini.ffn`, :mod:`d2lmini.moe`, :mod:`d2lmini.block`).
"""
