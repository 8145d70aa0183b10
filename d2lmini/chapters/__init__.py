"""Each chapter's experiments, one module per notebook, named after it.

The model parts they measure live one level up (:mod:`d2lmini.norms`,
:mod:`d2lmini.attention`, :mod:`d2lmini.ffn`, :mod:`d2lmini.moe`, :mod:`d2lmini.block`).
"""

#: The chapter modules, loaded on first use as attributes of this package (``d2lmini.chapters.ch04_norm_placement``).
_MODULES = ("ch01_anatomy", "ch02_residual", "ch03_normalization", "ch04_norm_placement", "ch05_rmsnorm",
            "ch06_qk_norm", "ch07_ffn", "ch08_attention_generation", "ch09_the_2026_block", "ch10_hyper_connections",
            "ch11_beyond_softmax", "errors", "zoo")


def __getattr__(name: str):
    """Import the chapter module ``name`` on first use (PEP 562); AttributeError for any other name."""
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return importlib.import_module(f".{name}", __name__)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULES))
