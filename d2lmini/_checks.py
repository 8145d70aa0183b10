"""Argument checks shared by every module of d2lmini.

Each helper raises ``TypeError`` for a value of the wrong kind and ``ValueError``
for a value of the right kind but outside what is allowed, always naming the
argument, the value received and what would have been accepted. They are plain
``if``/``raise`` statements, so they still run under ``python -O``.
"""

from __future__ import annotations

import inspect
import math
import numbers
from typing import Callable, Iterable

import torch


def check_int_at_least(name: str, value, minimum: int, why: str = "") -> int:
    """Return ``value`` if it is an int (not a bool) >= ``minimum``, else raise naming ``name``.

    ``why``, if given, is added to the message in parentheses (e.g. ``"token spread
    compares tokens"``).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}{f' ({why})' if why else ''}, got {value}")
    return int(value)


def check_positive_int(name: str, value) -> int:
    """Return ``value`` if it is an int >= 1, else raise naming ``name``."""
    return check_int_at_least(name, value, 1)


def check_nonnegative_int(name: str, value) -> int:
    """Return ``value`` if it is an int >= 0, else raise naming ``name``."""
    return check_int_at_least(name, value, 0)


def check_int_in(name: str, value, low: int, high: int) -> int:
    """Return ``value`` if it is an int in ``[low, high]`` (both included), else raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int in [{low}, {high}], got {type(value).__name__} {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return int(value)


def check_seed(seed) -> int:
    """Return ``seed`` if it is an int (not a bool), else raise ``TypeError`` naming it."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
    return int(seed)


def check_real(name: str, value) -> float:
    """Return ``value`` as a float if it is a real number (not a bool), else raise ``TypeError``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    return float(value)


def check_finite_float(name: str, value) -> float:
    """Return ``value`` as a float if it is a finite real number, else raise naming ``name``."""
    value = check_real(name, value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    return value


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


def check_choice(name: str, value, allowed: Iterable[str], *, or_none: bool = False) -> str:
    """Return ``value`` if it is one of the strings in ``allowed``, else raise listing them (and None, which
    the caller accepts, when ``or_none``)."""
    allowed = tuple(allowed)
    what = f"{name} must be {'None or ' if or_none else ''}one of {allowed}"
    if not isinstance(value, str):
        raise TypeError(f"{what}, got {type(value).__name__} {value!r}")
    if value not in allowed:
        raise ValueError(f"{what}, got {value!r}")
    return value


def check_optional_choice(name: str, value, allowed: Iterable[str]) -> str | None:
    """Return ``value`` if it is ``None`` or one of the strings in ``allowed``, else raise listing them."""
    return None if value is None else check_choice(name, value, allowed, or_none=True)


def check_bool(name: str, value) -> bool:
    """Return ``value`` if it is a bool, else raise naming ``name``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return value


def check_instance(name: str, value, kind: type, what: str | None = None):
    """Return ``value`` if it is an instance of ``kind``, else raise ``TypeError`` naming ``name``.

    ``what`` names the expected kind in the message (default: ``kind``'s name), e.g.
    ``"a d2lmini TransformerBlock"``.
    """
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be {what or 'a ' + kind.__name__}, got {type(value).__name__}")
    return value


def check_sequence(name: str, values, check_item, what: str) -> list:
    """Check every entry of the non-empty sequence ``values`` with ``check_item(label, entry)``.

    Args:
        name: the argument's name; entries are named ``name[i]`` in messages.
        values: any iterable except a string (a single value is refused).
        check_item: a checker of this module, called as ``check_item(f"{name}[{i}]", entry)``.
        what: what an entry is, for the message (e.g. ``"positive ints"``).

    Returns:
        The checked entries, as a list.

    Raises:
        TypeError: if ``values`` is a string or not iterable, or an entry is of the wrong kind.
        ValueError: if ``values`` is empty or an entry is out of range.
    """
    if isinstance(values, (str, bytes, torch.dtype)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a sequence of {what}, got {type(values).__name__} {values!r}")
    checked = [check_item(f"{name}[{i}]", v) for i, v in enumerate(values)]
    if not checked:
        raise ValueError(f"{name} must hold at least one of {what}, got an empty sequence")
    return checked


def check_pair(name: str, value) -> tuple:
    """Return ``value`` if it is a 2-tuple, else raise ``TypeError`` naming ``name``."""
    if not isinstance(value, tuple) or len(value) != 2:
        raise TypeError(f"{name} must be a pair (a 2-tuple), got {type(value).__name__} {value!r}")
    return value


def check_int_sequence(name: str, values, minimum: int = 1, increasing: bool = False,
                       distinct: bool = False) -> list[int]:
    """A non-empty sequence of ints >= ``minimum``, optionally strictly increasing or distinct.

    Returns:
        The ints, as a list.

    Raises:
        TypeError / ValueError: as :func:`check_sequence`; ValueError if the order or
            distinctness asked for does not hold.
    """
    ints = check_sequence(name, values, lambda label, v: check_int_at_least(label, v, minimum),
                          f"ints >= {minimum}")
    if increasing and any(b <= a for a, b in zip(ints, ints[1:])):
        raise ValueError(f"{name} must be strictly increasing, got {ints}")
    if distinct and len(set(ints)) != len(ints):
        raise ValueError(f"{name} must be distinct, got {ints}")
    return ints


def check_seeds(seeds) -> list[int]:
    """A non-empty sequence of distinct seeds, ints >= 0 (one model each)."""
    return check_int_sequence("seeds", seeds, minimum=0, distinct=True)


def check_positive_floats(name: str, values) -> list[float]:
    """A non-empty sequence of finite numbers > 0, returned as a list of floats."""
    return check_sequence(name, values, check_positive_float, "positive floats")


def check_dtype_name(name: str, value, allowed: dict) -> str:
    """Return the name (a key of ``allowed``) of the dtype ``value``, given by name or as a ``torch.dtype``.

    Raises:
        TypeError: if ``value`` is neither a string nor a ``torch.dtype``.
        ValueError: if it is not one of ``allowed`` (the message lists them).
    """
    if isinstance(value, torch.dtype):
        value = next((k for k, v in allowed.items() if v == value), str(value))
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {tuple(allowed)} (or the torch dtypes), "
                        f"got {type(value).__name__} {value!r}")
    if value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)} (or the torch dtypes), got {value!r}")
    return value


def check_float_dtype(name: str, dtype, allowed: Iterable[torch.dtype] | None = None) -> torch.dtype:
    """Return ``dtype`` if it is a floating ``torch.dtype`` (one of ``allowed``, if given), else raise ``TypeError``."""
    allowed = None if allowed is None else tuple(allowed)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point or (allowed and dtype not in allowed):
        kinds = "a floating torch.dtype" if allowed is None else " or ".join(map(str, allowed))
        raise TypeError(f"{name} must be {kinds}, got {dtype!r}")
    return dtype


def check_float_tensor(name: str, X, min_dim: int = 1) -> torch.Tensor:
    """Check that ``X`` is a floating-point tensor with at least ``min_dim`` dimensions ``(..., num_hiddens)``."""
    if not isinstance(X, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(X).__name__}")
    if not X.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {X.dtype}")
    if X.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimension{'s' if min_dim > 1 else ''} "
                         f"(..., num_hiddens), got shape {tuple(X.shape)}")
    return X


def check_int_tensor(name: str, X) -> torch.Tensor:
    """Check that ``X`` is a tensor of an integer dtype (not bool), e.g. token ids."""
    if not isinstance(X, torch.Tensor):
        raise TypeError(f"{name} must be an integer torch.Tensor, got {type(X).__name__}")
    if X.is_floating_point() or X.is_complex() or X.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer torch.Tensor, got dtype {X.dtype}")
    return X


def check_last_dim(name: str, X, size: int) -> torch.Tensor:
    """Check that ``X`` is a tensor of shape ``(*, size)``: at least one dimension, the last ``size``."""
    if not isinstance(X, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(X).__name__}")
    if X.dim() == 0 or X.shape[-1] != size:
        raise ValueError(f"{name} must have shape (*, {size}), i.e. last dimension {size}, "
                         f"got shape {tuple(X.shape)}")
    return X


def check_vector(name: str, value, size: int) -> torch.Tensor | None:
    """Return ``value`` if it is ``None`` or a tensor of shape ``(size,)`` (a gain or a bias), else raise."""
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be None or a torch.Tensor of shape ({size},), got {type(value).__name__}")
    if tuple(value.shape) != (size,):
        raise ValueError(f"{name} must be None or a tensor of shape ({size},), got {tuple(value.shape)}")
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


def check_left_at_default(reason: str, function: Callable, **values) -> None:
    """Raise ``ValueError`` if any of ``values`` differs from its default in ``function``'s signature.

    For arguments that another argument makes meaningless (e.g. ``qk_norm`` when
    ``attn_factory`` builds the attention): setting one is then an error, not
    silently ignored. The message names each such argument, its value and its
    default, and says why (``reason``).
    """
    params = inspect.signature(function).parameters
    changed = {name: value for name, value in values.items() if value != params[name].default}
    if changed:
        given = ", ".join(f"{name}={value!r}" for name, value in changed.items())
        defaults = ", ".join(f"{name}={params[name].default!r}" for name in changed)
        raise ValueError(f"{given} would be ignored: {reason}; leave the default ({defaults})")
