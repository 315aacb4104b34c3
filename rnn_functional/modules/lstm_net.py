"""``LSTMNet``: TorchRL's ``LSTMNet`` (an MLP embedder, a multi-layer LSTM, a linear head) over the functional core:
it compiles with ``fullgraph=True`` and vmaps with any backend, exact with ``proj_size``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..functional._core import BACKEND_CHOICES, check_options
from ..functional import lstm_sequence, lstm_step
from .rnn import LSTM_CELL, RNNChild

__all__ = ["LSTMNet", "MLP"]

Tensor = torch.Tensor

# TorchRL's names: "torch" = torch.nn.LSTM's kernels (our pad), "torchrl" = its Python LSTM (our reference)
_BACKEND_ALIASES = {None: "auto", "torch": "pad", "torchrl": "reference"}
_LSTM_KWARGS = ("input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout", "bidirectional",
                "proj_size", "device", "dtype")
_MLP_KWARGS = ("in_features", "out_features", "depth", "num_cells", "activation_class", "activation_kwargs",
               "norm_class", "norm_kwargs", "dropout", "bias_last_layer", "activate_last_layer")


class MLP(nn.Sequential):
    """A multi-layer perceptron taking TorchRL ``MLP``'s keyword arguments (the common subset).

    ``Linear -> [Dropout] -> [norm] -> activation`` repeated ``depth`` times, then a ``Linear`` (activated too with
    ``activate_last_layer``), numbered as TorchRL's (interchangeable state dicts). ``in_features=None``: a lazy first
    layer. ``num_cells``: 32 per hidden layer given ``depth``, else none. ``[*, in_features] -> [*, out_features]``.
    """

    def __init__(
        self, in_features: int | None = None, out_features: int | None = None, depth: int | None = None,
        num_cells: Sequence[int] | int | None = None, activation_class: type[nn.Module] = nn.Tanh,
        activation_kwargs: dict | None = None, norm_class: type[nn.Module] | None = None,
        norm_kwargs: dict | None = None, dropout: float | None = None, bias_last_layer: bool = True,
        activate_last_layer: bool = False, device: torch.device | str | None = None,
    ) -> None:
        if not isinstance(out_features, int):
            raise TypeError(f"MLP: out_features must be an int, got {out_features!r}.")
        if num_cells is None:
            num_cells = [32] * (depth or 0)
        elif isinstance(num_cells, int):
            if depth is None:
                raise ValueError("MLP: num_cells given as an int needs depth too (or pass a list of widths).")
            num_cells = [num_cells] * depth
        num_cells = list(num_cells)
        if depth is not None and depth != len(num_cells):
            raise ValueError(f"MLP: depth={depth} conflicts with num_cells={num_cells} ({len(num_cells)} widths).")
        for arg, value in (("activation_kwargs", activation_kwargs), ("norm_kwargs", norm_kwargs)):
            if value is not None and not isinstance(value, dict):
                raise TypeError(f"MLP: {arg} must be a dict (one for every layer), got {type(value).__name__}.")
        layers: list[nn.Module] = []
        for i, (n_in, n_out) in enumerate(zip([in_features, *num_cells], [*num_cells, out_features])):
            last = i == len(num_cells)
            layers.append(nn.LazyLinear(n_out, bias=bias_last_layer or not last, device=device) if n_in is None
                          else nn.Linear(n_in, n_out, bias=bias_last_layer or not last, device=device))
            if not last or activate_last_layer:
                if dropout is not None:
                    layers.append(nn.Dropout(p=dropout))
                if norm_class is not None:
                    layers.append(norm_class(**(norm_kwargs or {})))
                layers.append(activation_class(**(activation_kwargs or {})))
        super().__init__(*layers)
        self.in_features, self.out_features = in_features, out_features


class LSTMNet(RNNChild, nn.Module):
    """An MLP followed by an LSTM and a linear head, over the functional core.

    Args:
        out_features: width of ``y``, the head's output.
        lstm_kwargs: ``torch.nn.LSTM`` arguments, not modified (``input_size`` = the MLP's ``out_features``,
            ``hidden_size``, ``num_layers``, ``bias``, ``dropout``, ``proj_size``, ``dtype``; always batch-first).
        mlp_kwargs: TorchRL ``MLP`` arguments (see :class:`MLP`); ``in_features`` builds every layer eagerly (needed
            before ``torch.vmap``/``functional_call`` ensembles).
        device: where the parameters live.

    Keyword Args:
        lstm_backend: our backend for sequences (``None`` = ``"auto"``), or TorchRL's ``"torch"`` (= ``"pad"``) or
            ``"torchrl"`` (= ``"reference"``). Every choice compiles and vmaps (``pad`` routes to one that runs there).

    The weights live in ``self.mlp``, ``self.lstm`` (a ``torch.nn.LSTM`` the forward never calls) and
    ``self.linear``: the state dict reads like TorchRL's. Shapes (``L`` layers, ``P = proj_size or H``):

    | | 1-D input ``[F]`` | 2-D input ``[B, F]`` | 3-D input ``[B, T, F]`` |
    |---|---|---|---|
    | meaning | one step | one step per row | a sequence per row |
    | ``y`` | ``[out]`` | ``[B, out]`` | ``[B, T, out]`` |
    | ``hidden0`` in / out | ``[L, P]`` | ``[B, L, P]`` | ``[B, T, L, P]`` |
    | ``hidden1`` in / out | ``[L, H]`` | ``[B, L, H]`` | ``[B, T, L, H]`` |

    For a sequence only the input hiddens at ``t = 0`` are read; the output hiddens hold the final state at
    ``t = T - 1`` and zeros elsewhere (so that they fit a ``[B, T]`` TensorDict).
    """

    _cell = LSTM_CELL

    def __init__(self, out_features: int, lstm_kwargs: dict, mlp_kwargs: dict,
                 device: torch.device | str | None = None, *, lstm_backend: str | None = None) -> None:
        super().__init__()
        if lstm_backend not in _BACKEND_ALIASES and lstm_backend not in BACKEND_CHOICES:
            raise ValueError(f"LSTMNet: lstm_backend must be None, 'torch', 'torchrl' or one of "
                             f"{list(BACKEND_CHOICES)}, got {lstm_backend!r}.")
        self.lstm_backend = _BACKEND_ALIASES.get(lstm_backend, lstm_backend)
        for arg, kwargs, allowed in (("lstm_kwargs", lstm_kwargs, _LSTM_KWARGS), ("mlp_kwargs", mlp_kwargs, _MLP_KWARGS)):
            unknown = sorted(set(kwargs) - set(allowed))
            if unknown:
                raise TypeError(f"LSTMNet: unsupported {arg} {unknown}; accepted: {list(allowed)}.")
        kw = {"device": device, **lstm_kwargs}
        if not kw.pop("batch_first", True):
            raise ValueError("LSTMNet: the LSTM is always batch-first; drop batch_first=False from lstm_kwargs.")
        if kw.pop("bidirectional", False):
            raise ValueError("LSTMNet: bidirectional LSTMs are not supported; drop bidirectional=True.")
        for required in ("input_size", "hidden_size"):
            if required not in kw:
                raise ValueError(f"LSTMNet: lstm_kwargs must give {required}.")
        check_options(backend=self.lstm_backend, dropout=kw.get("dropout", 0.0))
        self.mlp = MLP(device=device, **mlp_kwargs)
        self.lstm = nn.LSTM(**kw, batch_first=True)
        self.linear = nn.Linear(self.lstm.proj_size or self.lstm.hidden_size, out_features, device=device)

    def forward(self, input: Tensor, hidden0_in: Tensor | None = None,
                hidden1_in: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """``(y, hidden0_in, hidden1_in, hidden0_out, hidden1_out)``, shapes in the class doc: ``hidden0``/``hidden1``
        are the LSTM's ``h``/``c``, both or neither given (neither = zeros, returned as the input hiddens)."""
        if input.ndim not in (1, 2, 3):
            raise ValueError(f"LSTMNet: input must be [F] or [B, F] (one step) or [B, T, F] (a sequence), got shape "
                             f"{list(input.shape)}.")
        if (hidden0_in is None) != (hidden1_in is None):  # TorchRL's class for this mistake
            raise RuntimeError(f"LSTMNet: pass both hidden0_in and hidden1_in or neither; got hidden0_in "
                               f"{type(hidden0_in).__name__} and hidden1_in {type(hidden1_in).__name__}.")
        if input.ndim == 1:  # one row of a batch of one
            hidden = () if hidden0_in is None else (hidden0_in.unsqueeze(0), hidden1_in.unsqueeze(0))
            return tuple(o.squeeze(0) for o in self.forward(input.unsqueeze(0), *hidden))
        x = self.mlp(input)
        sequence = x.ndim == 3
        lead = tuple(x.shape[:-1])
        (L, P), (_, H) = self._state_shapes
        if hidden0_in is None:
            hidden0_in, hidden1_in = x.new_zeros(*lead, L, P), x.new_zeros(*lead, L, H)
        for name, h, width in (("hidden0_in", hidden0_in, P), ("hidden1_in", hidden1_in, H)):
            if tuple(h.shape) != (*lead, L, width):
                raise ValueError(
                    f"LSTMNet: {name} must have shape {[*lead, L, width]} ([*batch{', T' if sequence else ''}, "
                    f"num_layers, {'P' if name == 'hidden0_in' else 'H'}]), got {list(h.shape)}.")
        # the public functions, as users call them, check the call against the weights (dtype, device, sizes)
        dropout = float(self._live.attrs["dropout"]) if self.training else 0.0
        state = (hidden0_in, hidden1_in)
        if sequence:  # from the state entering step 0 ([B, 0, ...] when T = 0: zeros, no step reads them)
            state = tuple(h[:, 0] if h.shape[1] else h.new_zeros(h.shape[0], *h.shape[2:]) for h in state)
            y, _, (h, c) = lstm_sequence(x, state, self._weights, backend=self.lstm_backend, dropout=dropout,
                                         training=self.training, return_segment_states=True)
        else:
            y, (h, c) = lstm_step(x, state, self._weights, dropout=dropout, training=self.training)
            y = y.clone()
        return self.linear(y), hidden0_in, hidden1_in, h, c
