"""Cell-independent plumbing of the step and sequence functions.

Public functions validate their inputs here, flatten the batch dims ``*B`` into one dim
``N`` and hand the backends a canonical call: ``x [N, T, F]``, a carry tuple of
``[N, L, S]`` tensors (``(h, c)`` for LSTM, ``(h,)`` for GRU), ``is_init [N, T]`` or
``None`` and ``reset_state`` as a tuple of ``[N, T, L, S]`` or ``None``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .._layout import CELL_NAMES, LayerWeights, Layout, as_tensor_map, layer_weights, read_layout

Carry = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class CellSpec:
    """A recurrent cell kind: its name and the math of one layer for one step.

    ``layer_step(gi, carry, weights) -> carry'`` takes the input projection
    ``gi = x @ W_ih^T + b_ih`` ``[N, G*H]`` and the layer's carry (tuple of ``[N, S]``);
    the first entry of the returned carry is the layer's output.
    """

    name: str
    layer_step: Callable[[torch.Tensor, Carry, LayerWeights], Carry]


# ----------------------------------------------------------------------------- shared math


def broadcast_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``mask`` with trailing singleton dims so that it broadcasts against ``like``."""
    return mask.reshape(mask.shape + (1,) * (like.ndim - mask.ndim))


def apply_reset(carry: Carry, mask: torch.Tensor | None, reset: Carry | None) -> Carry:
    """Replace ``carry`` by ``reset`` (or zeros) where ``mask`` is True.

    ``mask`` has the leading dims of every carry tensor; ``reset`` the same shapes as carry.
    """
    if mask is None:
        return carry
    if reset is None:
        return tuple(torch.where(broadcast_mask(mask, s), 0.0, s) for s in carry)
    return tuple(torch.where(broadcast_mask(mask, s), r, s) for s, r in zip(carry, reset))


def segment_ends(is_init: torch.Tensor | None, n: int, t_len: int, device: torch.device) -> torch.Tensor:
    """``[N, T]`` bool: True at the last step of every segment (before a reset, and at ``T - 1``)."""
    last = torch.ones(n, 1, dtype=torch.bool, device=device)
    if is_init is None:
        return torch.cat([torch.zeros(n, t_len - 1, dtype=torch.bool, device=device), last], dim=1)
    return torch.cat([is_init[:, 1:], last], dim=1)


def keep_segment_ends(states: Carry, is_init: torch.Tensor | None) -> Carry:
    """Per-step carries ``[N, T, L, S]`` zeroed except at segment ends (TorchRL's ``("next", hidden)``)."""
    n, t_len = states[0].shape[:2]
    ends = segment_ends(is_init, n, t_len, states[0].device)
    return tuple(torch.where(broadcast_mask(ends, s), s, 0.0) for s in states)


def between_layers(y: torch.Tensor, k: int, layout: Layout, dropout: float, training: bool) -> torch.Tensor:
    """Dropout on layer ``k``'s output when another layer follows (``torch.nn.LSTM``'s rule)."""
    if k < layout.num_layers - 1 and dropout > 0 and training:
        return F.dropout(y, dropout, training=True)
    return y


def multi_layer_step(
    cell: CellSpec,
    layout: Layout,
    params: Mapping[str, torch.Tensor],
    x: torch.Tensor,
    carry: Carry,
    dropout: float = 0.0,
    training: bool = False,
) -> tuple[torch.Tensor, Carry]:
    """All layers for one step. ``x [N, F]``, carry tensors ``[N, L, S]``."""
    new_layers: list[Carry] = []
    inp = x
    for k in range(layout.num_layers):
        w = layer_weights(params, layout, k)
        gi = F.linear(inp, w.weight_ih, w.bias_ih)
        layer_carry = cell.layer_step(gi, tuple(s[:, k] for s in carry), w)
        new_layers.append(layer_carry)
        inp = between_layers(layer_carry[0], k, layout, dropout, training)
    new_carry = tuple(torch.stack(parts, dim=1) for parts in zip(*new_layers))
    return inp, new_carry


# ----------------------------------------------------------------------------- validation


def _state_names(cell: str) -> tuple[str, ...]:
    return ("h", "c") if cell == "lstm" else ("h",)


def _as_carry(cell: CellSpec, value, arg: str) -> Carry:
    """The user's state (tuple for LSTM, tensor for GRU) as a carry tuple."""
    if cell.name == "lstm":
        if not (isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, torch.Tensor) for v in value)):
            raise TypeError(
                f"{arg}: expected a tuple (h, c) of two tensors for LSTM, got {type(value).__name__}"
                + (f" of length {len(value)}" if isinstance(value, (tuple, list)) else "")
                + "."
            )
        return (value[0], value[1])
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{arg}: expected a tensor h for GRU, got {type(value).__name__}.")
    return (value,)


def _check_tensor(t: torch.Tensor, arg: str, shape: tuple, layout: Layout, hint: str) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{arg}: expected shape {list(shape)} {hint}, got {list(t.shape)}.")
    if t.dtype != layout.dtype or t.device != layout.device:
        raise ValueError(
            f"{arg}: expected dtype {layout.dtype} on {layout.device} (the params'), got {t.dtype} on "
            f"{t.device}. Convert it with .to(dtype=..., device=...) or convert the params."
        )


def _check_mask(is_init: torch.Tensor, want: tuple, arg: str = "is_init") -> torch.Tensor:
    if not isinstance(is_init, torch.Tensor):
        raise TypeError(f"{arg}: expected a bool tensor of shape {list(want)}, got {type(is_init).__name__}.")
    if is_init.dtype != torch.bool:
        raise TypeError(
            f"{arg}: expected dtype torch.bool, got {is_init.dtype}. Pass is_init.bool() "
            f"(True where an episode starts)."
        )
    shape = tuple(is_init.shape)
    if shape == tuple(want) + (1,):
        return is_init.squeeze(-1)
    if shape != tuple(want):
        raise ValueError(f"{arg}: expected shape {list(want)} or {list(want) + [1]}, got {list(shape)}.")
    return is_init


RECOMPUTE_MODES = ("none", "full")


@dataclass(frozen=True)
class SequenceOptions:
    """Per-call options every backend receives.

    ``compute_dtype`` and ``matmul_precision`` only affect the ``triton`` backend; the others
    compute in the dtype of the params at full precision and ignore them.
    """

    dropout: float = 0.0
    training: bool = False
    recompute: str = "none"  # "none" or "full": recompute activations in backward
    compute_dtype: torch.dtype | None = None  # operand dtype of the recurrent matmul (triton)
    matmul_precision: str | None = None  # see rnn_functional.precision (triton)
    segment_states: bool = False  # also return the carry at every segment end

    def __post_init__(self) -> None:
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ValueError(f"dropout: expected a probability in [0, 1), got {self.dropout}.")
        if self.recompute not in RECOMPUTE_MODES:
            raise ValueError(f"recompute: expected one of {list(RECOMPUTE_MODES)}, got {self.recompute!r}.")


@dataclass
class Canonical:
    """A validated, flattened call."""

    layout: Layout
    params: dict[str, torch.Tensor]
    batch_shape: tuple
    x: torch.Tensor
    carry: Carry
    is_init: torch.Tensor | None
    reset: Carry | None


def _canonicalize(
    cell: CellSpec,
    x: torch.Tensor,
    state,
    params: Mapping[str, torch.Tensor],
    is_init: torch.Tensor | None,
    reset_state,
    sequence: bool,
) -> Canonical:
    params = as_tensor_map(params, cell.name)
    layout = read_layout(params, cell.name)
    name = CELL_NAMES[cell.name]
    lead = 2 if sequence else 1
    dims = "[*B, T, F]" if sequence else "[*B, F]"
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a tensor {dims}, got {type(x).__name__}.")
    if x.ndim < lead or x.shape[-1] != layout.input_size:
        raise ValueError(
            f"x: expected shape {dims} with F={layout.input_size} (the params' input size), "
            f"got {list(x.shape)}." + (" For a single step use the *_step function." if sequence and x.ndim == 1 else "")
        )
    if x.dtype != layout.dtype or x.device != layout.device:
        raise ValueError(
            f"x: expected dtype {layout.dtype} on {layout.device} (the params'), got {x.dtype} on {x.device}. "
            f"Convert it with x.to(dtype=..., device=...) or convert the params."
        )
    batch_shape = tuple(x.shape[:-lead])
    n = math.prod(batch_shape)
    time = tuple(x.shape[-2:-1]) if sequence else ()
    L = layout.num_layers
    names = _state_names(cell.name)

    if state is None:
        carry = tuple(x.new_zeros((n, L, s)) for s in layout.state_sizes)
    else:
        carry = _as_carry(cell, state, "state")
        for nm, t, s in zip(names, carry, layout.state_sizes):
            _check_tensor(t, f"state ({nm})", batch_shape + (L, s), layout, f"([*B, L, {s}] for this {name})")
        carry = tuple(t.reshape(n, L, s) for t, s in zip(carry, layout.state_sizes))

    mask = None
    if is_init is not None:
        mask = _check_mask(is_init, batch_shape + time).reshape((n,) + time)

    reset = None
    if reset_state is not None:
        if not sequence:
            raise TypeError("reset_state is only accepted by the sequence functions.")
        if is_init is None:
            raise ValueError(
                "reset_state was given without is_init: it is only read where is_init is True. "
                "Pass is_init too, or drop reset_state."
            )
        reset = _as_carry(cell, reset_state, "reset_state")
        for nm, t, s in zip(names, reset, layout.state_sizes):
            _check_tensor(t, f"reset_state ({nm})", batch_shape + time + (L, s), layout, f"([*B, T, L, {s}] for this {name})")
        reset = tuple(t.reshape((n,) + time + (L, s)) for t, s in zip(reset, layout.state_sizes))

    x_flat = x.reshape((n,) + tuple(x.shape[len(batch_shape):]))
    return Canonical(layout, params, batch_shape, x_flat, carry, mask, reset)


def _restore(batch_shape: tuple, y: torch.Tensor, carry: Carry) -> tuple[torch.Tensor, Carry]:
    y = y.reshape(batch_shape + tuple(y.shape[1:]))
    return y, tuple(s.reshape(batch_shape + tuple(s.shape[1:])) for s in carry)


# ----------------------------------------------------------------------------- drivers


def run_step(cell: CellSpec, x, state, params, is_init, backend: str = "auto") -> tuple[torch.Tensor, Carry]:
    """Validate, reset to zeros where ``is_init``, run one step over all layers."""
    from ..backends import resolve_step

    c = _canonicalize(cell, x, state, params, is_init, None, sequence=False)
    carry = apply_reset(c.carry, c.is_init, None)
    y, carry = resolve_step(backend, c.layout, c.x)(cell, c.layout, c.params, c.x, carry)
    return _restore(c.batch_shape, y, carry)


def run_sequence(
    cell: CellSpec, x, state, params, is_init, reset_state, backend: str, opts: SequenceOptions
) -> tuple[torch.Tensor, Carry, Carry | None]:
    """Validate, pick the backend, run the sequence. Returns ``(y, carry, segment states or None)``."""
    from ..backends import resolve_backend

    c = _canonicalize(cell, x, state, params, is_init, reset_state, sequence=True)
    impl = resolve_backend(backend, c.layout, c.x, opts, c.is_init)
    y, carry, seg = impl(cell, c.layout, c.params, c.x, c.carry, c.is_init, c.reset, opts)
    y, carry = _restore(c.batch_shape, y, carry)
    if seg is None:
        return y, carry, None
    return y, carry, tuple(s.reshape(c.batch_shape + tuple(s.shape[1:])) for s in seg)
