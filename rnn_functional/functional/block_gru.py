"""The public functions of DreamerV3's block GRU (:mod:`rnn_functional.cells.block_gru`) and of TorchRL's RSSM core
(:mod:`rnn_functional.cells.rssm`). Their hyperparameters (``activation``, ``norm_eps``, ``update_bias``) are
keywords: each combination is one cell (:func:`~rnn_functional.cells.block_gru.block_gru_cell`), made on first use."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from ..cells.block_gru import block_gru_cell
from ..cells.rssm import RSSMCoreCell
from ._core import entries

__all__ = ["block_gru_sequence", "block_gru_step", "configured_cell", "rssm_core_sequence", "rssm_core_step"]

Activation = str | Callable[[torch.Tensor], torch.Tensor]
configured_cell = block_gru_cell  # the cell for these hyperparameters, made and registered on its first use


def block_gru_step(x: torch.Tensor, state: torch.Tensor | None, params: Mapping[str, torch.Tensor], *,
                   is_init: torch.Tensor | None = None, backend: str = "auto", activation: Activation = "silu",
                   norm_eps: float = 1e-4, update_bias: float = -1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of DreamerV3's block GRU.

    Args:
        x: ``[*B, F]``.
        state: ``h [*B, 1, H]`` or ``None`` for zeros.
        params: ``DreamerV3BlockGRUCell`` state-dict keys (see ``init_block_gru_params``).
        is_init: bool ``[*B]`` (or ``[*B, 1]``); where True the state is reset to zeros first.
        backend: ``"auto"`` or ``"reference"`` (``"pad"``/``"triton"`` have no kernel for this cell).
        activation: ``"silu"`` (DreamerV3's), ``"tanh"``, ``"relu"`` or any elementwise callable (``torch.sin``, a
            parameter-free module), whose derivative the hand-written backward takes by ``torch.func.jvp``; it is
            held by identity (one cell each, kept for the process): pass the same object on every call.
        norm_eps, update_bias: the RMS norms' epsilon; a bias added to the update gate's logit.

    Returns:
        ``(y [*B, H], h [*B, 1, H])``.
    """
    step = entries(configured_cell(activation, norm_eps, update_bias))[0]
    return step(x, state, params, is_init=is_init, backend=backend)


def block_gru_sequence(x: torch.Tensor, state: torch.Tensor | None, params: Mapping[str, torch.Tensor], *,
                       is_init: torch.Tensor | None = None, reset_state: torch.Tensor | None = None,
                       backend: str = "auto", recompute: str = "none", activation: Activation = "silu",
                       norm_eps: float = 1e-4, update_bias: float = -1.0, return_segment_states: bool = False,
                       slice_len: int | None = None, num_slices: int | None = None, segment_layout: str = "auto"):
    """DreamerV3's block GRU over a sequence, with resets.

    Args:
        x: ``[*B, T, F]``.
        state: ``h [*B, 1, H]`` before step 0, or ``None`` for zeros.
        params: ``DreamerV3BlockGRUCell`` state-dict keys (see ``init_block_gru_params``).
        is_init: bool ``[*B, T]`` (or ``[*B, T, 1]``); before every step ``t`` where it is True the carry is
            replaced by ``reset_state[..., t, :, :]``, or by zeros.
        reset_state: ``[*B, T, 1, H]``, the states to reset to.
        backend: ``"auto"``, ``"reference"`` or ``"scan"`` (``"pad"``/``"triton"`` have no kernel for this cell).
        recompute, return_segment_states, slice_len, num_slices, segment_layout: as ``gru_sequence``.
        activation, norm_eps, update_bias: as :func:`block_gru_step`.

    Returns:
        ``(y [*B, T, H], h_T [*B, 1, H])`` (and the segment states last, with ``return_segment_states``).
    """
    sequence = entries(configured_cell(activation, norm_eps, update_bias))[1]
    return sequence(x, state, params, is_init=is_init, reset_state=reset_state, backend=backend, recompute=recompute,
                    return_segment_states=return_segment_states, slice_len=slice_len, num_slices=num_slices,
                    segment_layout=segment_layout)


def rssm_core_step(x: torch.Tensor, state: torch.Tensor | None, params: Mapping[str, torch.Tensor], *,
                   is_init: torch.Tensor | None = None, backend: str = "auto", activation: Activation = "silu",
                   norm_eps: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of TorchRL's DreamerV3 RSSM core (``RSSMPriorV3(recurrent_model="block_gru").rnn``).

    Args:
        x: ``[*B, S + A]``: the stochastic state and the action, concatenated (``torch.cat([state, action], -1)``).
        state: the belief ``[*B, 1, H]``, or ``None`` for zeros.
        params: the core's state-dict keys (see ``init_rssm_core_params``; ``RSSMPriorV3(...).rnn.state_dict()``).
        is_init, backend, activation, norm_eps: as :func:`block_gru_step`.

    Returns:
        ``(belief [*B, H], belief [*B, 1, H])``.
    """
    step = entries(configured_cell(activation, norm_eps, kind=RSSMCoreCell))[0]
    return step(x, state, params, is_init=is_init, backend=backend)


def rssm_core_sequence(x: torch.Tensor, state: torch.Tensor | None, params: Mapping[str, torch.Tensor], *,
                       is_init: torch.Tensor | None = None, reset_state: torch.Tensor | None = None,
                       backend: str = "auto", recompute: str = "none", activation: Activation = "silu",
                       norm_eps: float = 1e-4, return_segment_states: bool = False):
    """The RSSM core over a sequence of known stochastic states and actions ``x = [s, a] [*B, T, S + A]``, with
    resets; every other argument and the result as :func:`block_gru_sequence` (the belief is its ``h``)."""
    sequence = entries(configured_cell(activation, norm_eps, kind=RSSMCoreCell))[1]
    return sequence(x, state, params, is_init=is_init, reset_state=reset_state, backend=backend, recompute=recompute,
                    return_segment_states=return_segment_states)
