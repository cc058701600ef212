"""Invalid calls, as an op's record declares them (``OpSpec.bad_input``).

A valid call is built from a few drawn sizes, then exactly one argument is spoiled (a
non-tensor, an unsupported dtype, a wrong rank, a shape that disagrees with another
argument, a tensor on another device, a scalar outside the contract's domain);
``tests/test_bad_input.py`` requires a ``ValueError`` or ``TypeError`` naming it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

OTHER_DEVICE = torch.device("meta")  # a device no kernel runs on, on every machine
NON_POSITIVE = (0.0, -1.0, math.nan, math.inf, -math.inf)
DIMS = ("b", "h", "n", "m", "d")  # the sizes a valid call is built from: batch, heads, rows/queries, keys, head dim


@dataclass(frozen=True)
class Spoiler:
    """One way to make one argument of a valid call invalid."""

    argument: str
    how: str
    spoil: Callable[[dict[str, Any]], Any]  # valid arguments -> the spoiled value of ``argument``


@dataclass(frozen=True)
class BadInput:
    """``valid(dims, device)``: a small valid call (arguments by contract name) from sizes
    ``dims`` (keys :data:`DIMS`); ``spoilers``: the ways to spoil it."""

    valid: Callable[[dict[str, int], torch.device], dict[str, Any]]
    spoilers: tuple[Spoiler, ...]

    def __post_init__(self):
        if not callable(self.valid) or not self.spoilers:
            raise ValueError("BadInput needs a valid-call builder and at least one spoiler")


def randn(shape, device, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(shape, device=device).to(dtype)


def widen_last(t: torch.Tensor) -> torch.Tensor:
    return torch.cat([t, t[..., :1]], dim=-1)


def tensor_spoilers(name: str, *, fixed_rank: bool, integer: bool = False) -> tuple[Spoiler, ...]:
    """What can go wrong with any tensor argument."""
    out = [
        Spoiler(name, "a list instead of a tensor", lambda a: a[name].tolist()),
        Spoiler(name, "None", lambda a: None),
        Spoiler(name, "on another device", lambda a: torch.empty_like(a[name], device=OTHER_DEVICE)),
    ]
    if integer:
        out.append(Spoiler(name, "a float tensor", lambda a: a[name].float()))
    else:
        out += [Spoiler(name, "an int32 tensor", lambda a: a[name].to(torch.int32)),
                Spoiler(name, "a bool tensor", lambda a: a[name] > 0)]
    if fixed_rank:
        out.append(Spoiler(name, "one dim fewer", lambda a: a[name][0]))
        out.append(Spoiler(name, "one dim more", lambda a: a[name].unsqueeze(0)))
    return tuple(out)


def scalar_spoilers(name: str, values) -> tuple[Spoiler, ...]:
    return tuple(Spoiler(name, f"{name}={v!r}", lambda a, v=v: v) for v in values)
