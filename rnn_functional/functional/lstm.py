"""LSTM: the cell's math and the public step/sequence functions."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from .._layout import LayerWeights
from ._core import CellSpec, SequenceOptions, run_sequence, run_step

LSTMState = tuple[torch.Tensor, torch.Tensor]

__all__ = ["lstm_step", "lstm_sequence", "LSTM_CELL"]


def lstm_layer_step(
    gi: torch.Tensor, carry: tuple[torch.Tensor, ...], w: LayerWeights
) -> tuple[torch.Tensor, torch.Tensor]:
    """One LSTM layer, one time step, with the input projection done.

    gi: ``[N, 4H]`` = ``x @ W_ih^T + b_ih``; carry: ``(h [N, P], c [N, H])``.
    Returns ``(h', c')``; ``h'`` is also the layer's output.
    """
    h, c = carry
    gates = gi + F.linear(h, w.weight_hh, w.bias_hh)
    i, f, g, o = gates.chunk(4, dim=-1)
    c_next = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h_next = torch.sigmoid(o) * torch.tanh(c_next)
    if w.weight_hr is not None:
        h_next = F.linear(h_next, w.weight_hr)
    return h_next, c_next


LSTM_CELL = CellSpec(name="lstm", layer_step=lstm_layer_step)


def lstm_step(
    x: torch.Tensor,
    state: LSTMState | None,
    params: Mapping[str, torch.Tensor],
    *,
    is_init: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, LSTMState]:
    """One time step of a multi-layer LSTM.

    Args:
        x: ``[*B, F]``.
        state: ``(h [*B, L, P], c [*B, L, H])``, or ``None`` for zeros.
        params: ``torch.nn.LSTM`` state-dict keys (see :mod:`rnn_functional.params`).
        is_init: bool ``[*B]`` (or ``[*B, 1]``); where True the state is reset to zeros first.
        backend: ``"auto"`` (the fused ``triton`` step on CUDA where it applies, ATen's fused
            cell (``"pad"``) in plain eager mode, else ``"reference"``), ``"reference"``,
            ``"pad"`` or ``"triton"``. See :func:`rnn_functional.backends.resolve_step`.

    Returns:
        ``(y [*B, P], (h, c))`` where ``y`` is the top layer's output.
    """
    y, carry = run_step(LSTM_CELL, x, state, params, is_init, backend)
    return y, (carry[0], carry[1])


def lstm_sequence(
    x: torch.Tensor,
    state: LSTMState | None,
    params: Mapping[str, torch.Tensor],
    *,
    is_init: torch.Tensor | None = None,
    reset_state: LSTMState | None = None,
    backend: str = "auto",
    dropout: float = 0.0,
    training: bool = False,
    recompute: str = "none",
    compute_dtype: torch.dtype | None = None,
    matmul_precision: str | None = None,
    return_segment_states: bool = False,
) -> tuple[torch.Tensor, LSTMState] | tuple[torch.Tensor, LSTMState, LSTMState]:
    """A multi-layer LSTM over a sequence, with resets.

    Args:
        x: ``[*B, T, F]``.
        state: ``(h [*B, L, P], c [*B, L, H])`` before step 0, or ``None`` for zeros.
        params: ``torch.nn.LSTM`` state-dict keys.
        is_init: bool ``[*B, T]`` (or ``[*B, T, 1]``); before every step ``t`` where it is True
            the carry is replaced by ``reset_state[..., t, :, :]``, or by zeros.
        reset_state: ``(h [*B, T, L, P], c [*B, T, L, H])`` per-step states to reset to.
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
        ``(y [*B, T, P], (h_T, c_T))``: top-layer outputs and the carry after the last step
        (and the segment states last, with ``return_segment_states``).
    """
    y, carry, seg = run_sequence(
        LSTM_CELL, x, state, params, is_init, reset_state, backend,
        SequenceOptions(dropout, training, recompute, compute_dtype, matmul_precision, return_segment_states),
    )
    if return_segment_states:
        return y, (carry[0], carry[1]), (seg[0], seg[1])
    return y, (carry[0], carry[1])
