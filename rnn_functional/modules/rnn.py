"""``LSTMModule`` / ``GRUModule``: TensorDict modules over the functional core.

Drop-in replacements for ``torchrl.modules.LSTMModule`` / ``GRUModule``: same
constructor, keys, shapes and modes. The module only moves tensors between the
TensorDict and :func:`~rnn_functional.lstm_step` / :func:`~rnn_functional.lstm_sequence`
(resp. the GRU functions); all math lives in the core.

TensorDict layout (``*B`` batch dims, ``T`` time = the last batch dim in recurrent mode,
``L`` layers, ``H`` hidden size, ``P`` = proj_size or H):

============================  =====================  =========================
key                           sequential mode        recurrent mode
============================  =====================  =========================
``in_keys[0]`` (input)        ``[*B, F]``            ``[*B, T, F]``
hidden ``h`` / ``c`` (in)     ``[*B, L, P|H]``       ``[*B, T, L, P|H]``
``is_init``                   ``[*B, 1]`` or ``[*B]``  ``[*B, T, 1]`` or ``[*B, T]``
``out_keys[0]`` (output)      ``[*B, P]``            ``[*B, T, P]``
hidden (out, ``("next", .)``)  ``[*B, L, P|H]``       ``[*B, T, L, P|H]``
============================  =====================  =========================

Sequential mode resets the incoming hidden to zeros where ``is_init`` is True and runs
one step. Recurrent mode starts from the stored hidden at ``t = 0`` and, at every ``t``
where ``is_init`` is True, restarts from the stored hidden at ``t`` (collected data holds
the primer's zeros there); the output hidden holds each trajectory's final state at its
last step and zeros elsewhere, as TorchRL writes it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

import torch
from tensordict import TensorDictBase, unravel_key_list
from tensordict.nn import TensorDictModuleBase, dispatch
from tensordict.utils import NestedKey
from torch import nn

from ..backends import BACKENDS
from ..functional import gru_sequence, gru_step, lstm_sequence, lstm_step
from ..functional.options import RECOMPUTE_MODES, inside_vmap
from ..params import init_gru_params, init_lstm_params
from ..precision import check_mode
from ._mode import recurrent_mode as _context_mode

__all__ = ["LSTMModule", "GRUModule"]

Tensor = torch.Tensor
States = tuple[Tensor, ...]

_BACKEND_CHOICES = ("auto", *BACKENDS)


def _as_tuple(key: NestedKey) -> tuple[str, ...]:
    return key if isinstance(key, tuple) else (key,)


class RNNWeights(nn.Module):
    """The weights of an LSTM/GRU under ``torch.nn.LSTM``/``GRU`` names, with their hyper-parameters.

    A parameter container, never called: the enclosing module passes its parameters to the
    functional core. It stands in for TorchRL's ``module.lstm`` / ``module.gru`` child, so
    state dicts (``lstm.weight_ih_l0``, ...) and attributes (``hidden_size``, ``num_layers``,
    ``proj_size``, ``dropout``, ...) read the same; it is not a ``torch.nn.LSTM`` because
    ``torch.compile`` refuses to trace through those.
    """

    batch_first = True
    bidirectional = False

    def __init__(self, mode: str, hyper: dict, params: dict[str, Tensor]) -> None:
        super().__init__()
        self.mode = mode
        self.input_size = int(hyper["input_size"])
        self.hidden_size = int(hyper["hidden_size"])
        self.num_layers = int(hyper["num_layers"])
        self.bias = bool(hyper["bias"])
        self.dropout = float(hyper["dropout"])
        self.proj_size = int(hyper.get("proj_size", 0))
        for name, value in params.items():
            self.register_parameter(name, value if isinstance(value, nn.Parameter) else nn.Parameter(value))

    def extra_repr(self) -> str:
        extra = f", proj_size={self.proj_size}" if self.proj_size else ""
        return (
            f"{self.mode}({self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, bias={self.bias}, "
            f"dropout={self.dropout}{extra})"
        )


class _RecurrentModule(TensorDictModuleBase):
    """Key plumbing shared by :class:`LSTMModule` and :class:`GRUModule`.

    Subclasses set the class attributes below and define ``_state_widths() -> (S, ...)``,
    ``_step(x, states, params, is_init) -> (y, states)`` (the core's step function) and
    ``_sequence(x, states, resets, params, is_init, **opts) -> (y, segment states)`` (the core's
    sequence function with ``return_segment_states=True``); states are tuples of tensors.
    """

    _NAME: str  # "LSTMModule" / "GRUModule"
    _RNN_ATTR: str  # name of the child holding the weights: "lstm" / "gru"
    _KIND: str  # "LSTM" / "GRU" (torch.nn.RNNBase.mode)
    _STATE_NAMES: tuple[str, ...]  # ("h", "c") / ("h",)
    DEFAULT_IN_KEYS: list[str]
    DEFAULT_OUT_KEYS: list[tuple[str, str]]

    # ------------------------------------------------------------------ construction

    def _validate_options(
        self,
        python_based: bool,
        recurrent_backend: str,
        recurrent_compute_dtype: torch.dtype,
        recurrent_recompute: str,
        recurrent_matmul_precision: str,
    ) -> None:
        name = self._NAME
        if recurrent_backend not in _BACKEND_CHOICES:
            raise ValueError(
                f"{name}: recurrent_backend must be one of {list(_BACKEND_CHOICES)}, got {recurrent_backend!r}."
            )
        if recurrent_backend == "triton" and importlib.util.find_spec("triton") is None:
            raise RuntimeError(
                f"{name}: recurrent_backend='triton' requires the triton package (pip install triton); "
                f"or pick one of {[b for b in _BACKEND_CHOICES if b != 'triton']}."
            )
        if recurrent_recompute not in RECOMPUTE_MODES:
            raise ValueError(
                f"{name}: recurrent_recompute must be one of {list(RECOMPUTE_MODES)}, got {recurrent_recompute!r}."
            )
        if recurrent_recompute != "none" and recurrent_backend == "pad":
            raise ValueError(
                f"{name}: recurrent_recompute={recurrent_recompute!r} cannot be served by recurrent_backend='pad' "
                f"(the ATen/cuDNN kernels keep their own activations). Use recurrent_backend='scan', 'reference', "
                f"'triton' or 'auto' (which picks one that can), or recurrent_recompute='none'."
            )
        if recurrent_compute_dtype is not None and (
            not isinstance(recurrent_compute_dtype, torch.dtype) or not recurrent_compute_dtype.is_floating_point
        ):
            raise TypeError(
                f"{name}: recurrent_compute_dtype must be None (the params' dtype) or a floating torch.dtype "
                f"(torch.float32 or torch.bfloat16), got {recurrent_compute_dtype!r}."
            )
        check_mode(recurrent_matmul_precision, f"{name}: recurrent_matmul_precision")
        if not isinstance(python_based, bool):
            raise TypeError(f"{name}: python_based must be a bool, got {type(python_based).__name__}.")

    def _build_weights(
        self,
        rnn: nn.RNNBase | None,
        arg: str,
        batch_first: bool,
        bidirectional: bool,
        device,
        given: dict,
        defaults: dict,
    ) -> RNNWeights:
        """The weight container: ``rnn``'s parameters (shared) or new ones initialised like torch.nn.

        ``given``: the hyper-parameters passed to the constructor; ``defaults``: their defaults.
        """
        name, kind = self._NAME, self._KIND
        if rnn is not None:
            if not (isinstance(rnn, nn.RNNBase) and rnn.mode == kind):
                raise TypeError(
                    f"{name}: {arg}= must be a torch.nn.{kind} (or an nn.RNNBase in {kind} mode), "
                    f"got {type(rnn).__name__}."
                )
            if not rnn.batch_first:
                raise ValueError(f"The input {arg} must have batch_first=True.")
            if given["input_size"] is not None or given["hidden_size"] is not None:
                raise ValueError(
                    f"An {kind} instance cannot be passed along with class argument: {name}({arg}=...) takes "
                    f"input_size and hidden_size from the module; drop them."
                )
            for key, default in defaults.items():
                if given[key] != default and given[key] != getattr(rnn, key):
                    raise ValueError(
                        f"{name}: {key}={given[key]!r} conflicts with the wrapped {arg} ({key}={getattr(rnn, key)!r}); "
                        f"the wrapped module's hyper-parameters are used: drop {key}."
                    )
            if rnn.bidirectional:
                raise ValueError(self._bidirectional_msg())
            param = next(rnn.parameters())
            if device is not None and torch.device(device) != param.device:
                raise ValueError(
                    f"{name}: device={device!r} differs from the wrapped {arg}'s device {param.device}; "
                    f"move the module with .to(device) instead."
                )
            hyper = {k: getattr(rnn, k) for k in given}
            return RNNWeights(kind, hyper, dict(rnn.named_parameters()))
        if not batch_first:
            raise ValueError(f"The input {arg} must have batch_first=True.")
        if not given["hidden_size"]:
            raise ValueError("hidden_size must be passed.")
        if not given["input_size"]:
            raise ValueError("input_size must be passed.")
        if bidirectional:
            raise ValueError(self._bidirectional_msg())
        init = init_lstm_params if kind == "LSTM" else init_gru_params
        extra = {"proj_size": given["proj_size"]} if kind == "LSTM" else {}
        params = init(given["input_size"], given["hidden_size"], given["num_layers"], bias=given["bias"],
                      device=device, **extra)
        return RNNWeights(kind, given, dict(params.items()))

    def _bidirectional_msg(self) -> str:
        return (
            f"{self._NAME}: bidirectional RNNs are not supported: a backward pass over time cannot honour "
            f"is_init resets causally. Use bidirectional=False."
        )

    def _set_keys(self, in_key, in_keys, out_key, out_keys) -> None:
        name, n = self._NAME, 1 + len(self._STATE_NAMES)
        if not ((in_key is None) ^ (in_keys is None)):
            raise ValueError(
                f"Either in_keys or in_key must be specified but not both or none. "
                f"Got {in_keys} and {in_key} respectively."
            )
        if in_key is not None:
            in_keys = [in_key, *self.DEFAULT_IN_KEYS]
        if not ((out_key is None) ^ (out_keys is None)):
            raise ValueError(
                f"Either out_keys or out_key must be specified but not both or none. "
                f"Got {out_keys} and {out_key} respectively."
            )
        if out_key is not None:
            out_keys = [out_key, *self.DEFAULT_OUT_KEYS]
        what = "a value and " + ("two hidden states (h, c)" if n == 3 else "one hidden state")
        if not isinstance(in_keys, (list, tuple)):
            raise ValueError(f"{name} expects in_keys as a list of {n} keys ({what}), got {in_keys!r}.")
        in_keys = unravel_key_list(list(in_keys))
        if len(in_keys) != n and not (len(in_keys) == n + 1 and in_keys[-1] == "is_init"):
            raise ValueError(
                f"{name} expects {n} inputs: {what} (and optionally a final 'is_init' marker). "
                f"Got in_keys {in_keys} instead."
            )
        if not isinstance(out_keys, (list, tuple)):
            raise ValueError(f"{name} expects out_keys as a list of {n} keys ({what}), got {out_keys!r}.")
        out_keys = unravel_key_list(list(out_keys))
        if len(out_keys) != n:
            raise ValueError(f"{name} expects {n} outputs: {what}. Got out_keys {out_keys} instead.")
        if "is_init" not in in_keys:
            in_keys = in_keys + ["is_init"]
        self.in_keys = in_keys
        self.out_keys = out_keys

    def _setup(self, rnn: RNNWeights, python_based, recurrent_backend, recurrent_compute_dtype,
               recurrent_recompute, recurrent_matmul_precision, default_recurrent_mode) -> None:
        setattr(self, self._RNN_ATTR, rnn)
        self._param_names = tuple(n for n, _ in rnn.named_parameters())
        self.python_based = python_based
        self.recurrent_backend = recurrent_backend
        self.recurrent_compute_dtype = recurrent_compute_dtype
        self.recurrent_recompute = recurrent_recompute
        self.recurrent_matmul_precision = recurrent_matmul_precision
        self._recurrent_mode = default_recurrent_mode

    # ------------------------------------------------------------------ properties

    @property
    def _rnn(self) -> RNNWeights:
        return getattr(self, self._RNN_ATTR)

    def _params(self) -> dict[str, Tensor]:
        """The weights under ``torch.nn.LSTM``/``GRU`` state-dict names.

        Read from the child at every call, so ``functional_call`` and
        ``TensorDict.to_module`` substitutions are seen.
        """
        rnn = self._rnn
        return {n: getattr(rnn, n) for n in self._param_names}

    @property
    def recurrent_mode(self) -> bool:
        """True when the module processes ``[*B, T]`` sequences, False for single steps."""
        mode = _context_mode()
        return bool(self._recurrent_mode) if mode is None else mode

    @recurrent_mode.setter
    def recurrent_mode(self, value) -> None:
        raise RuntimeError(
            "recurrent_mode cannot be changed in-place. Use the set_recurrent_mode context manager "
            "(rnn_functional.set_recurrent_mode or torchrl.modules.set_recurrent_mode) or the "
            "default_recurrent_mode constructor argument."
        )

    @property
    def temporal_mode(self):
        raise RuntimeError("temporal_mode is deprecated, use recurrent_mode instead.")

    def set_recurrent_mode(self, mode: bool = True):
        raise RuntimeError(
            f"{self._NAME}.set_recurrent_mode() does not exist (TorchRL removed it in v0.8). Use the "
            f"set_recurrent_mode context manager (rnn_functional.set_recurrent_mode or "
            f"torchrl.modules.set_recurrent_mode) or the default_recurrent_mode constructor argument."
        )

    def _sequence_backend(self) -> str:
        """The core backend of recurrent mode.

        ``python_based`` (TorchRL: a Python cell instead of the torch.nn kernels of its pad
        path) makes the eager ``pad``/``auto`` path run our ``reference`` loop.
        """
        name = self.recurrent_backend
        if self.python_based and name in ("pad", "auto") and not (torch.compiler.is_compiling() or inside_vmap()):
            return "reference"
        return name

    def make_python_based(self):
        """Run the eager ``pad``/``auto`` recurrent path with the Python ``reference`` loop. Returns self."""
        self.python_based = True
        return self

    def make_cudnn_based(self):
        """Run the eager recurrent path with ATen's (cuDNN/oneDNN) kernels: ``recurrent_backend="pad"``
        (routed to ``scan`` under compile/vmap, as always). Returns self."""
        if self.recurrent_recompute != "none":
            raise ValueError(
                f"{self._NAME}.make_cudnn_based(): recurrent_recompute={self.recurrent_recompute!r} cannot be "
                f"served by the cuDNN/oneDNN kernels (backend 'pad'); keep recurrent_backend="
                f"{self.recurrent_backend!r} or set recurrent_recompute='none' first."
            )
        self.python_based = False
        self.recurrent_backend = "pad"
        return self

    # ------------------------------------------------------------------ TorchRL interop

    @property
    def canonical_keys(self) -> list[NestedKey]:
        """The keys whose memory layout matters to this module: ``in_keys + out_keys``."""
        return list(self.in_keys) + list(self.out_keys)

    def canonicalize(self, data: TensorDictBase, *, inplace: bool = False) -> TensorDictBase:
        """``data`` with only the :attr:`canonical_keys` leaves made contiguous.

        Missing keys are skipped. ``inplace=False`` returns a shallow copy; other leaves
        keep their storage and layout.
        """
        present = set(data.keys(include_nested=True))
        keys = [k for k in self.canonical_keys if k in present]
        if not keys:
            return data
        sub = data.select(*keys).contiguous(canonical=True)
        out = data if inplace else data.copy()
        out.update(sub)
        return out

    def _primer_specs(self) -> dict[tuple[str, ...], tuple[int, int]]:
        """``{in hidden key: (L, state width)}`` after checking the key naming."""
        in_hidden = [_as_tuple(k) for k in self.in_keys[1 : 1 + len(self._STATE_NAMES)]]
        out_hidden = [_as_tuple(k) for k in self.out_keys[1:]]
        if any(o != ("next", *i) for i, o in zip(in_hidden, out_hidden)):
            raise RuntimeError(
                "make_tensordict_primer is supposed to work with in_keys/out_keys that have compatible names, "
                "ie. the out_keys should be named after ('next', <in_key>). Got "
                f"in_keys={self.in_keys} and out_keys={self.out_keys} instead."
            )
        rnn = self._rnn
        widths = self._state_widths()
        return {k: (rnn.num_layers, w) for k, w in zip(in_hidden, widths)}

    def make_tensordict_primer(self):
        """A ``torchrl.envs.TensorDictPrimer`` that adds zero hidden states to env TensorDicts.

        Each hidden key gets an unbounded spec of shape ``[L, P|H]`` (expanded to the env's
        batch size), so collectors, ``step_mdp`` and batched envs carry the state between
        steps. Requires torchrl (imported here, lazily).
        """
        from torchrl.data import Unbounded
        from torchrl.envs.transforms import TensorDictPrimer

        dtype = next(iter(self._params().values())).dtype
        specs = {k: Unbounded(shape=shape, dtype=dtype) for k, shape in self._primer_specs().items()}
        return TensorDictPrimer(specs, expand_specs=True)

    # ------------------------------------------------------------------ forward

    def _read_states(self, tensordict: TensorDictBase) -> States | None:
        keys = self.in_keys[1 : 1 + len(self._STATE_NAMES)]
        states = tuple(tensordict.get(k, None) for k in keys)
        missing = [k for k, s in zip(keys, states) if s is None]
        if len(missing) == len(keys):
            return None  # zeros, as TorchRL
        if missing:
            raise RuntimeError(
                f"{self._NAME}: hidden state keys {missing} are missing while {[k for k in keys if k not in missing]} "
                f"are present; provide all of {keys} or none (zeros)."
            )
        return states

    @dispatch
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Read the input, hidden and ``is_init`` keys, run one step or a sequence, write outputs.

        See the module docstring for shapes. Returns ``tensordict``, updated in place.
        """
        x = tensordict.get(self.in_keys[0])
        init_key = self.in_keys[-1]
        is_init = tensordict.get(init_key, None)
        if is_init is None:
            raise KeyError(
                f"{self._NAME}: key {init_key!r} not found in the input TensorDict (keys: "
                f"{list(tensordict.keys(include_nested=True))}). It marks trajectory starts: add "
                f"torchrl.envs.InitTracker() to the env (Collector(..., auto_register_policy_transforms=True) "
                f"does), or set it yourself."
            )
        states = self._read_states(tensordict)
        params = self._params()
        rnn = self._rnn
        dropout = float(rnn.dropout) if self.training else 0.0
        if self.recurrent_mode:
            if tensordict.ndim == 0:
                raise ValueError(
                    f"{self._NAME} in recurrent mode needs a TensorDict with at least one batch dim (time, the "
                    f"last one); got batch_size {tuple(tensordict.batch_size)}. Use sequential mode for single steps."
                )
            first = None if states is None else tuple(s[..., 0, :, :] for s in states)
            y, out_states = self._sequence(
                x, first, states, params, is_init,
                backend=self._sequence_backend(),
                dropout=dropout,
                training=self.training,
                recompute=self.recurrent_recompute,
                compute_dtype=self.recurrent_compute_dtype,
                matmul_precision=self.recurrent_matmul_precision,
            )
        elif dropout > 0 and rnn.num_layers > 1:
            # The step functions have no dropout; a length-1 sequence without reset_state is
            # the same step (zeros where is_init) with inter-layer dropout.
            step_init = is_init.unsqueeze(-1) if is_init.shape == x.shape[:-1] else is_init  # [*B, T=1]
            y, out_states = self._sequence(
                x.unsqueeze(-2), states, None, params, step_init,
                backend=self._sequence_backend(), dropout=dropout, training=True,
            )
            y = y.squeeze(-2)
            out_states = tuple(s.squeeze(-3) for s in out_states)
        else:
            y, out_states = self._step(x, states, params, is_init)
        tensordict.set(self.out_keys[0], y)
        for key, value in zip(self.out_keys[1:], out_states):
            tensordict.set(key, value)
        return tensordict


class LSTMModule(_RecurrentModule):
    """Drop-in replacement for ``torchrl.modules.LSTMModule`` built on the functional core.

    Args (TorchRL's, same order and defaults):
        input_size, hidden_size, num_layers, bias, dropout, proj_size: as ``torch.nn.LSTM``.
        batch_first: must be True (TorchRL's rule).
        bidirectional: must be False (resets are causal); raises otherwise.
        python_based: eager recurrent mode runs the ``reference`` Python loop instead of
            ATen kernels for ``recurrent_backend`` ``"pad"``/``"auto"``.
        recurrent_backend: core ``backend`` of recurrent mode: ``"auto"`` (default; TorchRL's
            default is ``"pad"``, which ``auto`` picks whenever it is the fastest exact path),
            ``"pad"``, ``"scan"``, ``"triton"`` or ``"reference"``.
        recurrent_compute_dtype, recurrent_matmul_precision: passed to the core as
            ``compute_dtype`` / ``matmul_precision`` (used by ``triton``; other backends
            compute at the params' precision). ``recurrent_compute_dtype=None`` (default)
            means the params' dtype: ``torch.float32`` for fp32 params, as in TorchRL.
        recurrent_recompute: ``"none"`` or ``"full"`` (checkpointed backward); ``"full"``
            with ``recurrent_backend="pad"`` raises.

    Keyword Args:
        in_key / in_keys: the input key (hidden keys default to ``recurrent_state_h``,
            ``recurrent_state_c``) or the triplet ``[input, h, c]`` (``"is_init"`` is appended).
        out_key / out_keys: the output key (hidden outputs default to
            ``("next", "recurrent_state_h")``, ``("next", "recurrent_state_c")``) or the triplet.
        device: device of new parameters.
        lstm: an ``nn.LSTM`` (``batch_first=True``) whose parameters are used, shared.
        default_recurrent_mode: mode when no ``set_recurrent_mode`` context is active (False).

    The weights live in the child ``self.lstm`` (an :class:`RNNWeights`, named like TorchRL's
    ``nn.LSTM`` child), so state dicts match TorchRL's (``lstm.weight_ih_l0``, ...).
    """

    _NAME = "LSTMModule"
    _RNN_ATTR = "lstm"
    _KIND = "LSTM"
    _STATE_NAMES = ("h", "c")
    DEFAULT_IN_KEYS = ["recurrent_state_h", "recurrent_state_c"]
    DEFAULT_OUT_KEYS = [("next", "recurrent_state_h"), ("next", "recurrent_state_c")]

    def __init__(
        self,
        input_size: int | None = None,
        hidden_size: int | None = None,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = True,
        dropout: float = 0,
        proj_size: int = 0,
        bidirectional: bool = False,
        python_based: bool = False,
        recurrent_backend: str = "auto",
        recurrent_compute_dtype: torch.dtype | None = None,
        recurrent_recompute: str = "none",
        recurrent_matmul_precision: str = "auto",
        *,
        in_key: NestedKey | None = None,
        in_keys: Sequence[NestedKey] | None = None,
        out_key: NestedKey | None = None,
        out_keys: Sequence[NestedKey] | None = None,
        device: torch.device | str | None = None,
        lstm: nn.LSTM | None = None,
        default_recurrent_mode: bool | None = None,
    ) -> None:
        super().__init__()
        self._validate_options(
            python_based, recurrent_backend, recurrent_compute_dtype, recurrent_recompute, recurrent_matmul_precision
        )
        given = dict(input_size=input_size, hidden_size=hidden_size, num_layers=num_layers, bias=bias,
                     dropout=dropout, proj_size=proj_size)
        defaults = dict(num_layers=1, bias=True, dropout=0, proj_size=0)
        rnn = self._build_weights(lstm, "lstm", batch_first, bidirectional, device, given, defaults)
        self._set_keys(in_key, in_keys, out_key, out_keys)
        self._setup(rnn, python_based, recurrent_backend, recurrent_compute_dtype, recurrent_recompute,
                    recurrent_matmul_precision, default_recurrent_mode)

    def _state_widths(self) -> tuple[int, int]:
        rnn = self._rnn
        return (rnn.proj_size or rnn.hidden_size, rnn.hidden_size)

    def _step(self, x, states, params, is_init):
        y, (h, c) = lstm_step(x, states, params, is_init=is_init)
        return y, (h, c)

    def _sequence(self, x, states, resets, params, is_init, **opts):
        y, _, (h, c) = lstm_sequence(
            x, states, params, is_init=is_init, reset_state=resets, return_segment_states=True, **opts
        )
        return y, (h, c)


class GRUModule(_RecurrentModule):
    """Drop-in replacement for ``torchrl.modules.GRUModule`` built on the functional core.

    Same arguments as :class:`LSTMModule` without ``proj_size``, with ``gru=`` (an
    ``nn.GRU``) instead of ``lstm=``, and one hidden key: ``in_keys = [input, h]``,
    ``out_keys = [output, ("next", h)]`` (defaults ``recurrent_state`` /
    ``("next", "recurrent_state")``). Weights live in the child ``self.gru``.
    """

    _NAME = "GRUModule"
    _RNN_ATTR = "gru"
    _KIND = "GRU"
    _STATE_NAMES = ("h",)
    DEFAULT_IN_KEYS = ["recurrent_state"]
    DEFAULT_OUT_KEYS = [("next", "recurrent_state")]

    def __init__(
        self,
        input_size: int | None = None,
        hidden_size: int | None = None,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = True,
        dropout: float = 0,
        bidirectional: bool = False,
        python_based: bool = False,
        recurrent_backend: str = "auto",
        recurrent_compute_dtype: torch.dtype | None = None,
        recurrent_recompute: str = "none",
        recurrent_matmul_precision: str = "auto",
        *,
        in_key: NestedKey | None = None,
        in_keys: Sequence[NestedKey] | None = None,
        out_key: NestedKey | None = None,
        out_keys: Sequence[NestedKey] | None = None,
        device: torch.device | str | None = None,
        gru: nn.GRU | None = None,
        default_recurrent_mode: bool | None = None,
    ) -> None:
        super().__init__()
        self._validate_options(
            python_based, recurrent_backend, recurrent_compute_dtype, recurrent_recompute, recurrent_matmul_precision
        )
        given = dict(input_size=input_size, hidden_size=hidden_size, num_layers=num_layers, bias=bias,
                     dropout=dropout)
        defaults = dict(num_layers=1, bias=True, dropout=0)
        rnn = self._build_weights(gru, "gru", batch_first, bidirectional, device, given, defaults)
        self._set_keys(in_key, in_keys, out_key, out_keys)
        self._setup(rnn, python_based, recurrent_backend, recurrent_compute_dtype, recurrent_recompute,
                    recurrent_matmul_precision, default_recurrent_mode)

    def _state_widths(self) -> tuple[int]:
        return (self._rnn.hidden_size,)

    def _step(self, x, states, params, is_init):
        y, h = gru_step(x, None if states is None else states[0], params, is_init=is_init)
        return y, (h,)

    def _sequence(self, x, states, resets, params, is_init, **opts):
        y, _, h = gru_sequence(
            x,
            None if states is None else states[0],
            params,
            is_init=is_init,
            reset_state=None if resets is None else resets[0],
            return_segment_states=True,
            **opts,
        )
        return y, (h,)
