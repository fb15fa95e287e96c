"""Input validation shared by the algos modules: every failure names the offending argument."""

from __future__ import annotations

import math

import torch


def same_shape(reference_name: str, reference: torch.Tensor, **others: torch.Tensor | None) -> None:
    """Raise ``ValueError`` unless every non-None tensor in ``others`` has ``reference``'s shape."""
    for name, tensor in others.items():
        if tensor is not None and tensor.shape != reference.shape:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)} but {reference_name} has shape {tuple(reference.shape)}"
            )


def finite(name: str, tensor: torch.Tensor) -> None:
    if not bool(torch.isfinite(tensor).all()):
        raise ValueError(f"{name} contains NaN or infinite values")


def ndim(name: str, tensor: torch.Tensor, expected: int) -> None:
    if tensor.dim() != expected:
        raise ValueError(f"{name} must be {expected}-D, got shape {tuple(tensor.shape)}")


def in_closed_unit(name: str, value: float) -> None:
    if not (0.0 <= value <= 1.0):
        raise ValueError(f"{name} must lie in [0, 1], got {value}")


def positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def float_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The dtype results are returned in: the input's if floating point, else the default dtype."""
    return tensor.dtype if tensor.is_floating_point() else torch.get_default_dtype()


def row_values(name: str, value: torch.Tensor | float | None, rows: int, like: torch.Tensor) -> torch.Tensor:
    """A fresh ``[rows]`` tensor (dtype/device of ``like``) from None (zeros), a scalar, or ``[rows]``."""
    if value is None:
        return torch.zeros(rows, dtype=like.dtype, device=like.device)
    out = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    if out.dim() == 0:
        return out.expand(rows).clone()
    if out.shape != (rows,):
        raise ValueError(f"{name} has shape {tuple(out.shape)}, expected ({rows},)")
    return out.clone()
