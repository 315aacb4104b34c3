"""GRU: the cell's math and the public step/sequence functions."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from .._layout import LayerWeights
from ._core import CellSpec, SequenceOptions, run_sequence, run_step

__all__ = ["gru_step", "gru_sequence", "GRU_CELL"]


def gru_layer_step(
    gi: torch.Tensor, carry: tuple[torch.Tensor, ...], w: LayerWeights
) -> tuple[torch.Tensor]:
    """One GRU layer, one time step, with the input projection done (``torch.nn.GRU``'s equations).

    gi: ``[N, 3H]`` = ``x @ W_ih^T + b_ih``; carry: ``(h [N, H],)``. Returns ``(h',)``.
    """
    (h,) = carry
    gh = F.linear(h, w.weight_hh, w.bias_hh)
    i_r, i_z, i_n = gi.chunk(3, dim=-1)
    h_r, h_z, h_n = gh.chunk(3, dim=-1)
    r = torch.sigmoid(i_r + h_r)
    z = torch.sigmoid(i_z + h_z)
    n = torch.tanh(i_n + r * h_n)
    return (n + z * (h - n),)


GRU_CELL = CellSpec(name="gru", layer_step=gru_layer_step)


def gru_step(
    x: torch.Tensor,
    state: torch.Tensor | None,
    params: Mapping[str, torch.Tensor],
    *,
    is_init: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One time step of a multi-layer GRU.

    Args:
        x: ``[*B, F]``.
        state: ``h [*B, L, H]``, or ``None`` for zeros.
        params: ``torch.nn.GRU`` state-dict keys (see :mod:`rnn_functional.params`).
        is_init: bool ``[*B]`` (or ``[*B, 1]``); where True the state is reset to zeros first.
        backend: ``"auto"`` (the fused ``triton`` step on CUDA where it applies, ATen's fused
            cell (``"pad"``) in plain eager mode, else ``"reference"``), ``"reference"``,
            ``"pad"`` or ``"triton"``. See :func:`rnn_functional.backends.resolve_step`.

    Returns:
        ``(y [*B, H], h)``.
    """
    y, carry = run_step(GRU_CELL, x, state, params, is_init, backend)
    return y, carry[0]


def gru_sequence(
    x: torch.Tensor,
    state: torch.Tensor | None,
    params: Mapping[str, torch.Tensor],
    *,
    is_init: torch.Tensor | None = None,
    reset_state: torch.Tensor | None = None,
    backend: str = "auto",
    dropout: float = 0.0,
    training: bool = False,
    recompute: str = "none",
    compute_dtype: torch.dtype | None = None,
    matmul_precision: str | None = None,
    return_segment_states: bool = False,
) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A multi-layer GRU over a sequence, with resets.

    Args:
        x: ``[*B, T, F]``.
        state: ``h [*B, L, H]`` before step 0, or ``None`` for zeros.
        params: ``torch.nn.GRU`` state-dict keys.
        is_init: bool ``[*B, T]`` (or ``[*B, T, 1]``); before every step ``t`` where it is True
            the carry is replaced by ``reset_state[..., t, :, :]``, or by zeros.
        reset_state: ``h [*B, T, L, H]`` per-step states to reset to.
        backend: ``"auto"``, ``"reference"``, ``"scan"``, ``"pad"`` or ``"triton"``.
        dropout: dropout probability on the outputs of every layer but the last.
        training: dropout is applied only when True.
        recompute: ``"none"`` or ``"full"``: recompute activations in backward instead of
            saving them (less memory, more compute; ``pad`` cannot).
        compute_dtype: operand dtype of the recurrent matmul (``triton`` only; others ignore it).
        matmul_precision: recurrent matmul precision (``triton`` only; see :mod:`rnn_functional.precision`).
        return_segment_states: also return the per-step states ``[*B, T, L, ·]`` that hold the
            carry after every step that ends a segment (before a reset, and the last step) and
            zeros elsewhere: TorchRL's ``("next", hidden)`` layout in recurrent mode.

    Returns:
        ``(y [*B, T, H], h_T)`` (and the segment states ``[*B, T, L, H]`` last, with
        ``return_segment_states``).
    """
    y, carry, seg = run_sequence(
        GRU_CELL, x, state, params, is_init, reset_state, backend,
        SequenceOptions(dropout, training, recompute, compute_dtype, matmul_precision, return_segment_states),
    )
    if return_segment_states:
        return y, carry[0], seg[0]
    return y, carry[0]
