"""TorchRL compatibility of ``LSTMModule``/``GRUModule``: modes, primers, kernel switches.

Everything here mirrors a TorchRL attribute or method of the same name; none of it runs in
the forward's math. TorchRL is never imported here: its classes are read only when
``torchrl`` is already loaded (importing it has global side effects on torch's config).
"""

from __future__ import annotations

import importlib
import sys
from typing import ClassVar

from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import nn

from ..functional.options import call_context
from ._cells import ModuleCell
from ._mode import _TORCHRL_RNN
from ._mode import recurrent_mode as _context_mode

__all__ = ["TorchRLCompat", "python_based_class"]

_PYTHON_PREFIX = "TorchRLPython"
_PYTHON_CLASSES: dict[str, type[nn.RNNBase]] = {}


def _python_class(kind: str) -> type[nn.RNNBase]:
    """``torch.nn.<kind>`` with TorchRL's Python forward first in its MRO (an instance of both)."""
    if kind not in _PYTHON_CLASSES:
        trl = importlib.import_module(_TORCHRL_RNN)
        name = _PYTHON_PREFIX + kind
        _PYTHON_CLASSES[kind] = type(
            name, (getattr(trl, kind), getattr(nn, kind)), {"__module__": __name__, "__qualname__": name}
        )
    return _PYTHON_CLASSES[kind]


def __getattr__(name: str):
    """Unpickling a python-based child looks its class up here: build it on demand."""
    if name.startswith(_PYTHON_PREFIX):
        return _python_class(name[len(_PYTHON_PREFIX):])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def python_based_class(cell: ModuleCell) -> type[nn.RNNBase] | None:
    """The child class of a python-based module, or None when TorchRL is not loaded.

    An instance of both ``cell.nn_class`` and TorchRL's Python implementation
    (``torchrl.modules.LSTM``/``GRU``), so that calling ``module.lstm(x)`` runs TorchRL's
    Python loop (vmap-able) as in TorchRL, and both ``isinstance`` checks hold.
    """
    if _TORCHRL_RNN not in sys.modules or not issubclass(cell.nn_class, nn.RNNBase):  # TorchRL has LSTM/GRU only
        return None
    return _python_class(cell.nn_class.__name__)


def _as_tuple(key: NestedKey) -> tuple[str, ...]:
    return key if isinstance(key, tuple) else (key,)


class TorchRLCompat:
    """Mixin: TorchRL's mode, primer and kernel-switch API on top of :class:`RNNChild`."""

    _cell: ClassVar[ModuleCell]

    # ------------------------------------------------------------------ recurrent mode

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
            f"{self._cell.module_name}.set_recurrent_mode() does not exist (TorchRL removed it in v0.8). Use the "
            f"set_recurrent_mode context manager (rnn_functional.set_recurrent_mode or "
            f"torchrl.modules.set_recurrent_mode) or the default_recurrent_mode constructor argument."
        )

    # ------------------------------------------------------------------ kernels

    def _sequence_backend(self) -> str:
        """The core backend of recurrent mode (and of training steps with dropout).

        ``python_based`` (TorchRL: a Python loop instead of the torch.nn kernels) makes the
        eager ``pad``/``auto`` path run our ``reference`` loop; compiled and vmapped calls
        keep the configured backend, which routes to one that runs there.
        """
        name = self.recurrent_backend
        if self.python_based and name in ("pad", "auto"):
            context = call_context()
            if not (context.compiling or context.vmapped):
                return "reference"
        return name

    def make_python_based(self):
        """Run the eager ``pad``/``auto`` recurrent path with the Python ``reference`` loop. Returns self.

        The child stays the same object holding the same parameters; when TorchRL is loaded
        its class also becomes TorchRL's Python implementation (still a ``torch.nn`` class).
        """
        self.python_based = True
        python_class = python_based_class(self._cell)
        if python_class is not None and type(self._rnn) is self._cell.nn_class:
            self._rnn.__class__ = python_class
        return self

    def make_cudnn_based(self):
        """Run the eager recurrent path with ATen's (cuDNN/oneDNN) kernels: ``recurrent_backend="pad"``
        (routed to ``scan`` under compile/vmap, as always). Returns self."""
        if self._cell.core.aten is None:
            raise ValueError(
                f"{self._cell.module_name}.make_cudnn_based(): cuDNN/oneDNN have no {self._cell.core.title} kernel "
                f"(backend 'pad'); keep recurrent_backend={self.recurrent_backend!r}."
            )
        if self.recurrent_recompute != "none":
            raise ValueError(
                f"{self._cell.module_name}.make_cudnn_based(): recurrent_recompute={self.recurrent_recompute!r} "
                f"cannot be served by the cuDNN/oneDNN kernels (backend 'pad'); keep recurrent_backend="
                f"{self.recurrent_backend!r} or set recurrent_recompute='none' first."
            )
        self.python_based = False
        self.recurrent_backend = "pad"
        if type(self._rnn) in _PYTHON_CLASSES.values():
            self._rnn.__class__ = self._cell.nn_class
        return self

    # ------------------------------------------------------------------ TensorDict layout

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

    # ------------------------------------------------------------------ primers

    def _primer_specs(self) -> dict[tuple[str, ...], tuple[int, int]]:
        """``{in hidden key: (L, state width)}`` after checking the key naming."""
        n = len(self._cell.state_names)
        in_hidden = [_as_tuple(k) for k in self.in_keys[1 : 1 + n]]
        out_hidden = [_as_tuple(k) for k in self.out_keys[1:]]
        if any(o != ("next", *i) for i, o in zip(in_hidden, out_hidden)):
            raise RuntimeError(
                "make_tensordict_primer is supposed to work with in_keys/out_keys that have compatible names, "
                "ie. the out_keys should be named after ('next', <in_key>). Got "
                f"in_keys={self.in_keys} and out_keys={self.out_keys} instead."
            )
        return dict(zip(in_hidden, self._state_shapes))

    def make_tensordict_primer(self):
        """A ``torchrl.envs.TensorDictPrimer`` that adds zero hidden states to env TensorDicts.

        Each hidden key gets an unbounded spec of shape ``[L, P|H]`` (expanded to the env's
        batch size), so collectors, ``step_mdp`` and batched envs carry the state between
        steps. Requires torchrl (imported here, lazily).
        """
        from torchrl.data import Unbounded
        from torchrl.envs.transforms import TensorDictPrimer

        dtype = next(iter(self._weights.values())).dtype
        specs = {k: Unbounded(shape=shape, dtype=dtype) for k, shape in self._primer_specs().items()}
        return TensorDictPrimer(specs, expand_specs=True)

