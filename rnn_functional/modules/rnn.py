"""``LSTMModule`` / ``GRUModule``: TensorDict modules over the functional core.

Drop-in replacements for ``torchrl.modules.LSTMModule`` / ``GRUModule``: same
constructor, keys, shapes and modes. The module only moves tensors between the
TensorDict and :func:`~rnn_functional.lstm_step` / :func:`~rnn_functional.lstm_sequence`
(resp. the GRU functions); all math lives in the core. The pieces live in small files:
``_cells`` (one spec per cell kind), ``_weights`` (the ``torch.nn`` child holding the
weights), ``_keys`` (constructor keys), ``_compat`` (TorchRL's modes, primers, kernel
switches) and ``_forward`` (TensorDict checks and the core calls).

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

from collections.abc import Sequence

import torch
from tensordict import TensorDictBase, is_tensorclass
from tensordict.nn import TensorDictModuleBase, dispatch
from tensordict.utils import NestedKey
from torch import nn

from ..backends.base import backends_for, no_kernel_for
from ..functional.options import check_options
from ..functional.slices import check_pair, check_value
from ._cells import GRU_CELL, LSTM_CELL
from ._compat import TorchRLCompat
from ._forward import bound_layout, read_inputs, run_sequence, run_step, write_outputs
from ._keys import resolve_keys
from ._options import checked_option, options_state
from ._weights import RNNChild, build_rnn

__all__ = ["LSTMModule", "GRUModule"]

# tensordict memoises "is this type a tensorclass?" in eager code only. A forward compiled before any
# eager TensorDict write misses torch.Tensor in that memo and guards on the whole memo, so the first
# eager write afterwards (an env step, a replay buffer) forces a recompile. Asking once here makes the
# compiled forward guard on that one entry instead.
is_tensorclass(torch.Tensor)

# the options checked on assignment (``checked_option``)
_OPTIONS = ("recurrent_backend", "recurrent_recompute", "recurrent_compute_dtype", "recurrent_matmul_precision")


class _RecurrentModule(RNNChild, TorchRLCompat, TensorDictModuleBase):
    """What :class:`LSTMModule` and :class:`GRUModule` share; each sets ``_cell``."""

    def _setup(self, rnn: nn.RNNBase | None, given: dict, *, batch_first, bidirectional, python_based,
               recurrent_backend, recurrent_compute_dtype, recurrent_recompute, recurrent_matmul_precision,
               in_key, in_keys, out_key, out_keys, device, default_recurrent_mode,
               recurrent_slice_len=None, recurrent_num_slices=None) -> None:
        cell = self._cell
        self._check_options(dropout=given["dropout"], recurrent_backend=recurrent_backend,
                            recurrent_recompute=recurrent_recompute, recurrent_compute_dtype=recurrent_compute_dtype,
                            recurrent_matmul_precision=recurrent_matmul_precision)
        check_value(recurrent_slice_len, f"{cell.module_name}: recurrent_slice_len")
        check_value(recurrent_num_slices, f"{cell.module_name}: recurrent_num_slices")
        check_pair(recurrent_slice_len, recurrent_num_slices, f"{cell.module_name}: ", "recurrent_")
        if not isinstance(python_based, bool):
            raise TypeError(f"{cell.module_name}: python_based must be a bool, got {type(python_based).__name__}.")
        rnn = build_rnn(cell, rnn, given, batch_first=batch_first, bidirectional=bidirectional, device=device)
        self.in_keys, self.out_keys = resolve_keys(cell, in_key, in_keys, out_key, out_keys)
        setattr(self, cell.child_attr, rnn)
        self.python_based = False
        if python_based:
            self.make_python_based()
        self._recurrent_backend = recurrent_backend  # checked together above; assignments later check each
        self._recurrent_compute_dtype = recurrent_compute_dtype
        self._recurrent_recompute = recurrent_recompute
        self._recurrent_matmul_precision = recurrent_matmul_precision
        self.recurrent_slice_len = recurrent_slice_len
        self.recurrent_num_slices = recurrent_num_slices
        self._recurrent_mode = default_recurrent_mode

    recurrent_backend = checked_option("recurrent_backend")
    recurrent_recompute = checked_option("recurrent_recompute")
    recurrent_compute_dtype = checked_option("recurrent_compute_dtype")
    recurrent_matmul_precision = checked_option("recurrent_matmul_precision")

    def _check_options(self, *, recurrent_backend: str, recurrent_recompute: str, recurrent_compute_dtype,
                       recurrent_matmul_precision, dropout: float = 0.0) -> None:
        """Raise unless these recurrent options could serve a call: each value, their combination (``recompute``
        with ``pad``) and the backend for this cell."""
        cell = self._cell
        check_options(backend=recurrent_backend, recompute=recurrent_recompute, dropout=dropout,
                      matmul_precision=recurrent_matmul_precision, compute_dtype=recurrent_compute_dtype,
                      owner=f"{cell.module_name}: ")
        if recurrent_backend != "auto" and recurrent_backend not in backends_for(cell.core):
            raise no_kernel_for(recurrent_backend, cell.core)

    def _check_option(self, name: str, value) -> None:
        self._check_options(**{**{option: getattr(self, option) for option in _OPTIONS}, name: value})

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(options_state(state, _OPTIONS))

    def forward(self, *args, **kwargs) -> TensorDictBase:
        """Read the input, hidden and ``is_init`` keys, run one step or a sequence, write outputs.

        ``module(tensordict)``: see the module docstring for shapes; returns ``tensordict``, updated
        in place. ``module(input=..., is_init=..., ...)`` (tensors named by the ``in_keys``, as
        tensordict's ``dispatch``) returns the output tensors instead.

        The TensorDict call does not go through ``dispatch``'s wrapper: under ``torch.compile``
        that extra traced frame cost ~15 us per call of a compiled policy step on CPU
        (``benchmarks/bench_policy_step.py``).
        """
        if args and isinstance(args[0], TensorDictBase):
            if len(args) == 1 and not kwargs:
                return self._forward(args[0], self._weights, self._layout)
            raise TypeError(
                f"{type(self).__name__}.forward() takes a TensorDict alone, or the in_keys' tensors "
                f"{[str(k) for k in self.in_keys]} without one; got a TensorDict and {len(args) - 1} more positional "
                f"argument(s), keyword(s) {sorted(kwargs)}. Pass module(tensordict): it is updated in place and returned."
            )
        return self._forward_from_tensors(*args, **kwargs)

    @dispatch
    def _forward_from_tensors(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._forward(tensordict, self._weights, self._layout)

    def forward_with_params(self, tensordict: TensorDictBase, params) -> TensorDictBase:
        """:meth:`forward` with explicit weights (``torch.nn`` state-dict names) instead of the child's.

        What :class:`~rnn_functional.EnsembleModule` vmaps over stacked members: it never touches the
        ``nn.LSTM``/``nn.GRU`` child, so it traces under ``torch.compile`` without graph breaks.
        """
        return self._forward(tensordict, params, None)

    def _forward(self, tensordict: TensorDictBase, params, layout) -> TensorDictBase:
        """``layout``: the layout of the module's own weights, checked when they were bound (``None`` for other
        params, read and checked per call). Passed in, not found by ``params is self._weights``: torch 2.11's
        Dynamo cannot trace ``is`` between two dicts (a compiled ensemble failed on it)."""
        cell, recurrent = self._cell, self.recurrent_mode
        # tensordict stores ``in_keys``/``out_keys`` in ``_in_keys``/``_out_keys_apparent``: reading those skips two
        # property lookups through the class hierarchy, 8 guards a compiled call re-checks (bench_policy_step.py)
        in_keys, out_keys = self._in_keys, self._out_keys_apparent
        x, states, is_init = read_inputs(cell, tensordict, in_keys, self._input_size, self._state_shapes, recurrent)
        params, layout = bound_layout(cell, params, layout, x, states, in_keys, self._state_shapes)
        if recurrent:
            # [*B, T, L, S] at t = 0; none for an empty time dim (empty outputs, as the functional sequence returns)
            first = None if states is None or states[0].shape[-3] == 0 else tuple(s.select(-3, 0) for s in states)
            y, out_states = run_sequence(
                x, first, states, params, layout, is_init,
                backend=self._sequence_backend(),
                dropout=self._dropout if self.training else 0.0,
                training=self.training,
                recompute=self.recurrent_recompute,
                compute_dtype=self.recurrent_compute_dtype,
                matmul_precision=self.recurrent_matmul_precision,
                slice_len=self.recurrent_slice_len,
                num_slices=self.recurrent_num_slices,
            )
        else:
            dropout = self._dropout if self.training else 0.0
            backend = self._sequence_backend() if dropout > 0 else None  # only a step with dropout runs a sequence
            y, out_states = run_step(cell, x, states, params, is_init, dropout=dropout, training=self.training,
                                     backend=backend, layout=layout)
        return write_outputs(tensordict, out_keys, y, out_states)


class LSTMModule(_RecurrentModule):
    """Drop-in replacement for ``torchrl.modules.LSTMModule`` built on the functional core.

    Args (TorchRL's, same order and defaults):
        input_size, hidden_size, num_layers, bias, dropout, proj_size: as ``torch.nn.LSTM``.
        batch_first: must be True (TorchRL's rule).
        bidirectional: must be False (resets are causal); raises otherwise.
        python_based: eager recurrent mode runs the ``reference`` Python loop instead of
            ATen kernels for ``recurrent_backend`` ``"pad"``/``"auto"``; when TorchRL is
            loaded, ``self.lstm`` is also TorchRL's Python LSTM (see ``make_python_based``).
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
        lstm: an ``nn.LSTM`` (``batch_first=True``) kept as ``self.lstm``: its parameters are the module's.
        default_recurrent_mode: mode when no ``set_recurrent_mode`` context is active (False).
        recurrent_slice_len: ``None`` (default), or ``L`` when recurrent-mode batches are whole
            slices of exactly ``L`` steps along time, ``is_init`` True at each slice start (what
            ``SliceSampler(slice_len=L, strict_length=True)`` returns): they then run side by side
            with static shapes, which makes a flat ``[N]`` batch fast under ``torch.compile``
            (see ``docs/compile.md``). Passed to the core as ``slice_len``; a batch that is not
            whole slices raises. Not a TorchRL argument.
        recurrent_num_slices: ``None`` (default), or ``K`` with ``recurrent_slice_len=L`` when
            batches hold at most ``K`` slices of at most ``L`` steps (``SliceSampler(slice_len=L,
            strict_length=False)`` with ``batch_size = K * L``): compiled, they run in a padded
            ``[K, L]`` block. Passed to the core as ``num_slices``.

    ``self.lstm`` is a real ``torch.nn.LSTM`` (``batch_first=True``) holding the module's
    parameters: callable, state dicts read ``lstm.weight_ih_l0``, ... as TorchRL's.
    """

    _cell = LSTM_CELL
    DEFAULT_IN_KEYS = list(LSTM_CELL.default_in_keys)
    DEFAULT_OUT_KEYS = list(LSTM_CELL.default_out_keys)

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
        recurrent_slice_len: int | None = None,
        recurrent_num_slices: int | None = None,
    ) -> None:
        super().__init__()
        given = dict(input_size=input_size, hidden_size=hidden_size, num_layers=num_layers, bias=bias,
                     dropout=dropout, proj_size=proj_size)
        self._setup(lstm, given, batch_first=batch_first, bidirectional=bidirectional, python_based=python_based,
                    recurrent_backend=recurrent_backend, recurrent_compute_dtype=recurrent_compute_dtype,
                    recurrent_recompute=recurrent_recompute, recurrent_matmul_precision=recurrent_matmul_precision,
                    in_key=in_key, in_keys=in_keys, out_key=out_key, out_keys=out_keys, device=device,
                    default_recurrent_mode=default_recurrent_mode, recurrent_slice_len=recurrent_slice_len,
                    recurrent_num_slices=recurrent_num_slices)


class GRUModule(_RecurrentModule):
    """Drop-in replacement for ``torchrl.modules.GRUModule`` built on the functional core.

    Same arguments as :class:`LSTMModule` without ``proj_size``, with ``gru=`` (an
    ``nn.GRU``) instead of ``lstm=``, and one hidden key: ``in_keys = [input, h]``,
    ``out_keys = [output, ("next", h)]`` (defaults ``recurrent_state`` /
    ``("next", "recurrent_state")``). ``self.gru`` is a real ``torch.nn.GRU`` holding the weights.
    """

    _cell = GRU_CELL
    DEFAULT_IN_KEYS = list(GRU_CELL.default_in_keys)
    DEFAULT_OUT_KEYS = list(GRU_CELL.default_out_keys)

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
        recurrent_slice_len: int | None = None,
        recurrent_num_slices: int | None = None,
    ) -> None:
        super().__init__()
        given = dict(input_size=input_size, hidden_size=hidden_size, num_layers=num_layers, bias=bias,
                     dropout=dropout)
        self._setup(gru, given, batch_first=batch_first, bidirectional=bidirectional, python_based=python_based,
                    recurrent_backend=recurrent_backend, recurrent_compute_dtype=recurrent_compute_dtype,
                    recurrent_recompute=recurrent_recompute, recurrent_matmul_precision=recurrent_matmul_precision,
                    in_key=in_key, in_keys=in_keys, out_key=out_key, out_keys=out_keys, device=device,
                    default_recurrent_mode=default_recurrent_mode, recurrent_slice_len=recurrent_slice_len,
                    recurrent_num_slices=recurrent_num_slices)
