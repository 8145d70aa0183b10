"""Argument checks shared by every module of d2lmini.

Each helper raises ``TypeError`` for a value of the wrong kind and ``ValueError``
for a value of the right kind but outside what is allowed, always naming the
argument, the value received and what would have been accepted. They are plain
``if``/``raise`` statements, so they still run under ``python -O``.
"""

from __future__ import annotations

import numbers
from typing import Iterable

import torch


def check_int_at_least(name: str, value, low: int) -> int:
    """Return ``value`` if it is an int (not a bool) >= ``low``, else raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return int(value)


def check_positive_int(name: str, value) -> int:
    """Return ``value`` if it is an int >= 1, else raise naming ``name``."""
    return check_int_at_least(name, value, 1)


def check_nonnegative_int(name: str, value) -> int:
    """Return ``value`` if it is an int >= 0, else raise naming ``name``."""
    return check_int_at_least(name, value, 0)


def check_seed(seed) -> int:
    """Return ``seed`` if it is an int (not a bool), else raise ``TypeError`` naming it."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
    return int(seed)


def check_probability(name: str, value) -> float:
    """Return ``value`` as a float if it lies in [0, 1), else raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float in [0, 1), got {type(value).__name__} {value!r}")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")
    return float(value)


def check_positive_float(name: str, value) -> float:
    """Return ``value`` as a float if it is a finite real number > 0, else raise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive float, got {type(value).__name__} {value!r}")
    if not (value > 0 and value != float("inf")):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return float(value)


def check_choice(name: str, value, allowed: Iterable[str]) -> str:
    """Return ``value`` if it is one of the strings in ``allowed``, else raise listing them."""
    allowed = tuple(allowed)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {allowed}, got {type(value).__name__} {value!r}")
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def check_bool(name: str, value) -> bool:
    """Return ``value`` if it is a bool, else raise naming ``name``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return value


def check_callable(name: str, value):
    """Return ``value`` if it can be called, else raise ``TypeError`` naming ``name``."""
    if not callable(value):
        raise TypeError(f"{name} must be callable, got {type(value).__name__} {value!r}")
    return value


def check_sequence_tensor(name: str, X, num_hiddens: int) -> torch.Tensor:
    """Check that ``X`` is a floating tensor of shape (batch, num_steps, num_hiddens)."""
    if not isinstance(X, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(X).__name__}")
    if not X.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {X.dtype}")
    if X.dim() != 3:
        raise ValueError(
            f"{name} must have shape (batch, num_steps, {num_hiddens}), "
            f"got {X.dim()} dimensions with shape {tuple(X.shape)}"
        )
    if X.shape[-1] != num_hiddens:
        raise ValueError(
            f"{name} must have last dimension num_hiddens={num_hiddens}, got shape {tuple(X.shape)}"
        )
    return X


def check_dtype_matches(name: str, X: torch.Tensor, module: torch.nn.Module) -> None:
    """Raise a clear TypeError when ``X``'s dtype differs from ``module``'s weights (outside autocast)."""
    weight = next(module.parameters(), None)
    if weight is None or X.dtype == weight.dtype or torch.is_autocast_enabled(X.device.type):
        return
    raise TypeError(
        f"{name} has dtype {X.dtype} but the module's weights are {weight.dtype}; "
        f"convert one of them, e.g. module.to({X.dtype}) or {name}.to({weight.dtype})"
    )
