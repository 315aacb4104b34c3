"""Small pieces shared by the ``scan`` backend's layers (:mod:`.scan`, :mod:`.ensemble_scan`)."""

from __future__ import annotations

import torch
from torch._higher_order_ops import scan

__all__ = ["contiguous_copy", "outer_sum", "scan", "sum_rows"]


def contiguous_copy(t: torch.Tensor) -> torch.Tensor:
    """A fresh contiguous tensor: what a scanned step returns (scan forbids outputs aliasing its inputs)."""
    return t.clone(memory_format=torch.contiguous_format)


def sum_rows(t: torch.Tensor) -> torch.Tensor:
    """``[T, N, G] -> [G]``."""
    return t.sum(dim=(0, 1))


def outer_sum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``sum_{t, n} a[t, n]^T b[t, n]``: ``[T, N, G], [T, N, K] -> [G, K]`` (one GEMM)."""
    return a.flatten(0, 1).transpose(0, 1) @ b.flatten(0, 1)
