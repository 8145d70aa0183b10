"""Counting parameters: how many numbers a module learns, in total or part by part.

Introduced in the chapter "Anatomy: two sublayers on one residual stream", which splits
a block into attention, FFN and norms; the chapters on RMSNorm, on the feed-forward
network and on the 2026 block count norms, FFNs, experts and whole models with the same
function.
"""

from __future__ import annotations

from torch import nn

from ._checks import check_instance
from ._shown import shown_in

#: How :func:`num_parameters` splits a :class:`~d2lmini.block.TransformerBlock` (or a
#: decoder block): part -> the prefixes of the parameter names that belong to it. The
#: QK-norm gains and a decoder block's cross-attention count as attention; the norms
#: of the residual connections (``addnorm1``, ``addnorm2``, ...) as norms.
BLOCK_PARTS = {"attention": ("attention.", "cross_attention."), "ffn": ("ffn.",), "norms": ("addnorm",)}


@shown_in("ch01")
def num_parameters(
    module: nn.Module, parts: dict | None = None
) -> int | dict[str, int]:
    """Count the parameters of ``module``, in total or per part.

    Every parameter tensor is counted once, even if the module holds it twice (tied
    weights), as ``module.parameters()`` lists it. Only shapes are read, so it works on
    the ``meta`` device: an 8-billion-parameter model costs no memory to count.

    Introduced in the chapter "Anatomy: two sublayers on one residual stream".

    Args:
        module: any ``nn.Module``.
        parts: ``None`` for the total alone, or ``{part: prefixes}``: a parameter
            belongs to the first part one of whose prefixes (a string or a tuple of
            strings) starts its name in ``module.named_parameters()``. E.g.
            :data:`BLOCK_PARTS`.

    Returns:
        The number of parameters (an int) when ``parts`` is ``None``; otherwise a dict
        with one count per part, in the order of ``parts``, and ``'total'``, which is
        their sum.

    Raises:
        TypeError: if ``module`` is not an ``nn.Module``.
        ValueError: if a parameter belongs to none of ``parts`` (the message names it).
    """
    check_instance("module", module, nn.Module, "an nn.Module")
    total = sum(p.numel() for p in module.parameters())
    if parts is None:
        return total
    counts = dict.fromkeys(parts, 0)
    for name, p in module.named_parameters():
        part = next(
            (part for part, prefixes in parts.items() if name.startswith(prefixes)),
            None,
        )
        if part is None:
            raise ValueError(
                f"parameter {name!r} belongs to none of the parts {list(parts)}"
            )
        counts[part] += p.numel()
    return {**counts, "total": total}


__all__ = ["BLOCK_PARTS", "num_parameters"]


def copy_parameters(source: nn.Module, target: nn.Module, rename: dict | None = None) -> nn.Module:
    """Copy every parameter and buffer of ``source`` into ``target``, renaming prefixes.

    The chapters use it to check the part a reader writes against ``d2lmini``'s: build
    both, copy ``d2lmini``'s random weights into the reader's module, and compare the two
    outputs with :func:`torch.testing.assert_close`. Names are those of
    ``state_dict()``; ``rename`` maps a prefix of ``source``'s names to the prefix
    ``target`` uses for the same tensor, e.g. ``{"addnorm1.norm_in": "norm1"}``.

    Args:
        source: the module whose tensors are copied (not modified).
        target: the module that receives them; it must hold exactly the renamed
            names, with the same shapes.
        rename: ``{source prefix: target prefix}``; a name takes the longest prefix
            that matches it (up to a ``.`` or the name's end). ``None``: same names.

    Returns:
        ``target``, with its tensors overwritten in place.

    Raises:
        TypeError: if ``source`` or ``target`` is not an ``nn.Module``, or ``rename``
            not a dict of strings.
        ValueError: if a name is missing from ``target`` or a parameter is left over in it
            (a buffer only the target holds, such as a mask, keeps its value), or two tensors
            of the same name differ in shape (the message lists them).
    """
    import torch

    check_instance("source", source, nn.Module, "an nn.Module")
    check_instance("target", target, nn.Module, "an nn.Module")
    rename = {} if rename is None else rename
    if not isinstance(rename, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                               for k, v in rename.items()):
        raise TypeError(f"rename must be a dict of str -> str prefixes, got {rename!r}")

    def renamed(name: str) -> str:
        matches = [p for p in rename if name == p or name.startswith(p + ".")]
        if not matches:
            return name
        prefix = max(matches, key=len)
        return rename[prefix] + name[len(prefix):]

    state = {renamed(name): tensor for name, tensor in source.state_dict().items()}
    wanted = target.state_dict()
    own = {name for name, _ in target.named_buffers()} - set(state)  # the target's own state (a mask, say): kept
    state.update({name: wanted[name] for name in own if name in wanted})
    missing, extra = sorted(set(wanted) - set(state)), sorted(set(state) - set(wanted))
    if missing or extra:
        problems = ([f"the source has {extra}, which the target lacks"] if extra else []) + \
                   ([f"the target has {missing}, which the source lacks"] if missing else [])
        buffers = {renamed(name) for name, _ in source.named_buffers()}
        transient = [name for name in extra if _non_persistent(target, name)]
        plain = [name for name in extra if isinstance(_attribute(target, name), torch.Tensor)
                 and name not in transient]
        for names, fix in (([n for n in plain if n not in buffers], "make them nn.Parameter"),
                           ([n for n in plain if n in buffers], "register them with self.register_buffer, "
                                                                 "as the source's are buffers")):
            if names:  # a tensor not registered as a parameter or a buffer: state_dict() skips it
                problems.append(f"the target's {names} are plain tensors: {fix}")
        if transient:
            problems.append(f"the target's {transient} are buffers registered with persistent=False, which "
                            f"keeps them out of state_dict(): leave persistent out")
        listed = sorted({name.split(".")[0] for name in extra if "." in name
                         and isinstance(getattr(target, name.split(".")[0], None), (list, tuple))})
        if listed:
            problems.append(f"the target's {listed} are plain Python lists, whose modules PyTorch does not see: "
                            f"make them nn.ModuleList")
        raise ValueError(f"target's tensors do not match source's (after rename): {'; '.join(problems)}")
    shapes = [f"{n}: {tuple(state[n].shape)} vs {tuple(wanted[n].shape)}" for n in state
              if state[n].shape != wanted[n].shape]
    if shapes:
        raise ValueError(f"shapes differ between source and target: {shapes}")
    shared = _shared_in_target_only(source, target, renamed)
    if shared:
        raise ValueError(f"the target's {shared} are one tensor, the source's are not: each copy would "
                         f"overwrite the other; build each part as a module of its own (one assignment "
                         f"per part, not self.a = self.b = module)")
    with torch.no_grad():
        target.load_state_dict(state)
    return target


def _shared_in_target_only(source, target, renamed) -> list[str]:
    """The names of the first tensor that ``target`` holds under several names (one module assigned to two
    attributes) where ``source`` holds separate tensors; empty when there is none."""
    source_ids = {renamed(name): id(p) for name, p in source.named_parameters(remove_duplicate=False)}
    names_of = {}
    for name, p in target.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(name)
    for names in names_of.values():
        if len(names) > 1 and len({source_ids.get(n) for n in names}) > 1:
            return names
    return []


def _non_persistent(module, name: str) -> bool:
    """Whether ``name`` is a buffer of ``module`` registered with ``persistent=False``."""
    *path, last = name.split(".")
    try:
        owner = module.get_submodule(".".join(path))
    except AttributeError:
        return False
    return last in owner._non_persistent_buffers_set


def _attribute(module, name: str):
    """``module``'s attribute at the dotted ``name``, or None where there is none."""
    *path, last = name.split(".")
    try:
        return getattr(module.get_submodule(".".join(path)), last, None)
    except AttributeError:
        return None
