"""Drop-ins for TorchRL's ``DreamerV3BlockGRUCell`` and ``DreamerV3BlockGRU`` over the functional block GRU: same
arguments, shapes, exception classes, state-dict names and random draws; each forward reads the parameters anew."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch import nn

from ..cells.block_gru import init_weight_
from ..functional._core import entries
from ..functional.block_gru import configured_cell
from .rnn import checked_option, options_state

__all__ = ["DreamerV3BlockGRU", "DreamerV3BlockGRUCell"]

# the core's names of the activations with a closed-form derivative (any other runs as itself)
ACTIVATION_NAMES = {nn.SiLU: "silu", nn.Tanh: "tanh", nn.ReLU: "relu"}
RECURRENT_BACKENDS = ("auto", "reference", "scan")


class _Scale(nn.Module):
    """Holds an RMS norm's learned scale (``weight``, ones), under TorchRL's ``input_norm``/``..._norms.k`` names."""

    def __init__(self, features: int, eps: float, device):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(features, device=device))


class _BlockLinear(nn.Module):
    """A block-diagonal layer's ``weight [nb, in / nb, out / nb]`` and ``bias [out]``, initialised as TorchRL's."""

    def __init__(self, in_features: int, out_features: int, num_blocks: int, device):
        super().__init__()
        self.in_features, self.out_features, self.num_blocks = in_features, out_features, num_blocks
        shape = (num_blocks, in_features // num_blocks, out_features // num_blocks)
        self.weight = nn.Parameter(init_weight_(torch.empty(shape, device=device), in_features))
        self.bias = nn.Parameter(torch.zeros(out_features, device=device))


def activation_of(activation_class) -> nn.Module | Callable:
    """The activation TorchRL's constructors build from ``activation_class`` (a class is instantiated), or its error."""
    activation = activation_class() if isinstance(activation_class, type) else activation_class
    if not callable(activation):
        raise TypeError(f"activation_class: expected a parameter-free elementwise activation (a module class or "
                        f"instance, or a function such as torch.sin), got {activation_class!r}, which is not callable.")
    if isinstance(activation, nn.Module) and next(activation.parameters(), None) is not None:
        raise ValueError(f"activation_class: {activation!r} has learnable parameters; the block GRU's activation must "
                         f"have none (as TorchRL's).")
    return activation


class DreamerV3BlockGRUCell(nn.Module):
    """One step of DreamerV3's block-diagonal GRU: ``forward(input [*B, F], hidden [*B, H] | None) -> hidden'``.

    Args as TorchRL's ``DreamerV3BlockGRUCell`` (``num_layers``: dynamics layers; ``activation_class``: any
    parameter-free elementwise activation: a class, an instance or a function).
    """

    def __init__(self, input_size: int, hidden_size: int, *, projection_size: int = 512, num_blocks: int = 8,
                 num_layers: int = 1, activation_class: type[nn.Module] | Callable = nn.SiLU, norm_eps: float = 1e-4,
                 update_bias: float = -1.0, device: torch.device | str | int | None = None):
        super().__init__()
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}.")
        if hidden_size % num_blocks:
            raise ValueError(f"hidden_size must be divisible by num_blocks, got {hidden_size} and {num_blocks}.")
        if num_layers < 1:
            raise ValueError(f"num_layers must be positive, got {num_layers}.")
        self.activation = activation_of(activation_class)
        self.input_size, self.hidden_size, self.projection_size = input_size, hidden_size, projection_size
        self.num_blocks, self.num_layers, self.norm_eps, self.update_bias = num_blocks, num_layers, norm_eps, update_bias
        # built in TorchRL's order, the projections re-initialised last as its ``apply`` does: the same draws
        self.input_linear = nn.Linear(input_size, projection_size, device=device)
        self.input_norm = _Scale(projection_size, norm_eps, device)
        self.hidden_linear = nn.Linear(hidden_size, projection_size, device=device)
        self.hidden_norm = _Scale(projection_size, norm_eps, device)
        first = hidden_size + 2 * projection_size * num_blocks
        self.dynamic_linears = nn.ModuleList(_BlockLinear(first if k == 0 else hidden_size, hidden_size, num_blocks,
                                                          device) for k in range(num_layers))
        self.dynamic_norms = nn.ModuleList(_Scale(hidden_size, norm_eps, device) for _ in range(num_layers))
        self.gates = _BlockLinear(hidden_size, 3 * hidden_size, num_blocks, device)
        with torch.no_grad():
            for linear in (self.input_linear, self.hidden_linear):
                init_weight_(linear.weight, linear.in_features)
                linear.bias.zero_()

    def functional_cell(self):
        """The core's cell for the current ``activation``, ``norm_eps`` and ``update_bias`` (as TorchRL, per call)."""
        activation = self.activation
        return configured_cell(ACTIVATION_NAMES.get(type(activation), activation), self.norm_eps, self.update_bias)

    def params(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The parameters (TorchRL's names) in ``dtype``: TorchRL runs the projections in the input's dtype."""
        return {name: (p if p.dtype == dtype else p.to(dtype)) for name, p in self.named_parameters()}

    def forward(self, input: torch.Tensor, hidden: torch.Tensor | None = None) -> torch.Tensor:
        if input.shape[-1] != self.input_size:
            raise ValueError(f"Expected input.size(-1) == {self.input_size}, got {input.shape[-1]}.")
        batch = tuple(input.shape[:-1])
        if hidden is not None and tuple(hidden.shape) != (*batch, self.hidden_size):
            raise ValueError(f"hidden must match the input batch shape and hidden_size: expected "
                             f"{[*batch, self.hidden_size]}, got {list(hidden.shape)}.")
        if not batch:  # the core's validated step takes one batch dim at least
            return self(input.unsqueeze(0), None if hidden is None else hidden.unsqueeze(0)).squeeze(0)
        return self._run(0, input, hidden)[1].squeeze(-2)

    def _run(self, entry: int, input: torch.Tensor, hidden: torch.Tensor | None, **options):
        """The core's step (``entry`` 0) or sequence (1) from ``hidden [*B, H]`` or zeros, in the promoted dtype."""
        dtype = input.dtype if hidden is None else torch.promote_types(input.dtype, hidden.dtype)
        params, cell = self.params(dtype), self.functional_cell()
        h = None if hidden is None else hidden.to(dtype).unsqueeze(-2)
        return entries(cell)[entry](input.to(dtype), h, params, layout=cell.read_layout(params), **options)


class DreamerV3BlockGRU(nn.Module):
    """DreamerV3's block-diagonal GRU over a sequence: ``forward(input [B, T, F], hidden [B, H] | None, is_init [B, T]
    (or [B, T, 1]) | None) -> (output [B, T, H], hidden [B, H])``, the carry zeroed before each step where ``is_init``.

    Args as TorchRL's ``DreamerV3BlockGRU``; ``recurrent_backend``: ``"auto"`` (``scan`` when autograd records the
    call or under ``torch.compile``, else ``reference``), ``"reference"`` or ``"scan"`` (no Triton kernel here)."""

    def __init__(self, *args, recurrent_backend: str = "auto", **kwargs):
        super().__init__()
        self.recurrent_backend = recurrent_backend  # checked first, as TorchRL's
        self.cell = DreamerV3BlockGRUCell(*args, **kwargs)

    # the cell's signature (its one definition), recurrent_backend inserted before device as TorchRL lists it
    _cell_args = list(inspect.signature(DreamerV3BlockGRUCell.__init__).parameters.values())
    __init__.__signature__ = inspect.Signature([*_cell_args[:-1], inspect.Parameter(
        "recurrent_backend", inspect.Parameter.KEYWORD_ONLY, default="auto", annotation=str), _cell_args[-1]])
    del _cell_args

    recurrent_backend = checked_option("recurrent_backend")

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(options_state(state, ("recurrent_backend",)))

    @staticmethod
    def _check_option(name: str, value) -> None:
        if value not in RECURRENT_BACKENDS:  # TorchRL's "triton" too
            raise ValueError(f"{name} must be one of {list(RECURRENT_BACKENDS)} (rnn_functional has no Triton kernel "
                             f"for the block GRU), got {value!r}. Use 'auto', the default.")

    def forward(self, input: torch.Tensor, hidden: torch.Tensor | None = None,
                is_init: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        cell = self.cell
        if input.ndim != 3 or input.shape[-1] != cell.input_size:
            raise ValueError(f"input must have shape [batch, time, input_size], got {list(input.shape)}.")
        batch, time, _ = input.shape
        if time == 0:
            raise ValueError("input must contain at least one timestep.")
        if hidden is not None and tuple(hidden.shape) != (batch, cell.hidden_size):
            raise ValueError(f"hidden must have shape {[batch, cell.hidden_size]}, got {list(hidden.shape)}.")
        if is_init is not None:
            if is_init.ndim == 3 and is_init.shape[-1] == 1:
                is_init = is_init.squeeze(-1)
            if tuple(is_init.shape) != (batch, time) or is_init.dtype is not torch.bool:
                raise ValueError(f"is_init must be boolean with shape {[batch, time]} or {[batch, time, 1]}, got "
                                 f"{list(is_init.shape)} and {is_init.dtype}.")
        y, h = cell._run(1, input, hidden, is_init=is_init, backend=self.recurrent_backend)
        return y, h.squeeze(1)
