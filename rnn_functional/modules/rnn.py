"""``LSTMModule`` / ``GRUModule``: drop-ins for TorchRL's over the functional core. The weights live in a real
``torch.nn`` child the forward never calls (Dynamo graph-breaks on one): it reads them through :class:`LiveParams`."""

from __future__ import annotations

import contextvars
import importlib
import inspect
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from tensordict import TensorDictBase, is_tensorclass, unravel_key, unravel_key_list
from tensordict.nn import TensorDictModuleBase, dispatch
from tensordict.utils import NestedKey
from torch import nn
from torch.nn.utils import prune
from torch.utils._contextlib import _DecoratorContextManager

from ..backends.base import backends_for, no_kernel_for
from ..cells import Cell, Layout
from ..cells.gru import GRU
from ..cells.lstm import LSTM
from ..ensemble import ensemble_init_gru_params, ensemble_init_lstm_params
from ..functional import gru_sequence, gru_step, lstm_sequence, lstm_step
from ..functional._core import autocast_dtype, call_context, check_options
from ..functional.slices import check_pair, check_value
from ..precision import mark_constant_result

# ----------------------------------------------------------------------------- the recurrent-mode switch
# The innermost set_recurrent_mode (ours, which sets TorchRL's too, or TorchRL's), else ``default_recurrent_mode``:
# context-local eagerly; compiled (Dynamo cannot trace ``ContextVar.get``), a per-thread mirror (_torchrl_loaded).

_TORCHRL_RNN = "torchrl.modules.tensordict_module.rnn"
_torchrl_module = None  # TorchRL's rnn module, set by _torchrl_loaded()


@mark_constant_result
def _torchrl_loaded() -> bool:
    """Whether TorchRL's rnn module is imported; when newly so, mirror its flag per thread (wrapping its manager's
    ``set_mode``). A constant when compiled: a guard on ``sys.modules`` would recompile on every import."""
    global _torchrl_module
    found = sys.modules.get(_TORCHRL_RNN)
    if found is not _torchrl_module:
        _torchrl_module = found
        if found is not None:
            manager = found.recurrent_mode_state_manager
            set_mode = manager.set_mode
            if not getattr(set_mode, "_mirrored", False):
                def mirrored(mode: bool | None) -> None:
                    set_mode(mode)
                    _MIRROR.traced["torchrl"] = mode

                mirrored._mirrored = True
                manager.set_mode = mirrored
            _MIRROR.traced["torchrl"] = manager._context_mode.get()
    return found is not None


class _Mirror(threading.local):
    """Each thread's copy of our flag and TorchRL's for compiled code: Dynamo guards a ``threading.local`` per thread
    and keeps its dict writes after a ``scan``, where it drops attribute writes (pytorch/pytorch#195866)."""

    def __init__(self) -> None:
        trl = _torchrl_module  # a module (truthy) or None
        self.traced = {"mode": None, "torchrl": trl and trl.recurrent_mode_state_manager._context_mode.get()}


_MIRROR = _Mirror()
_MODE: contextvars.ContextVar[bool | None] = contextvars.ContextVar("rnn_functional_recurrent_mode", default=None)
# whether our innermost context also set TorchRL's flag: TorchRL's flag, None included, is then the innermost's
_MIRRORED: contextvars.ContextVar[bool] = contextvars.ContextVar("rnn_functional_mode_mirrored", default=False)
# what each eager entry restores on exit, innermost last: per context, as one object may be entered twice at once
_ENTRIES: contextvars.ContextVar[tuple] = contextvars.ContextVar("rnn_functional_mode_entries", default=())


def recurrent_mode(default: bool | None = None) -> bool | None:
    """The recurrent mode set by the innermost active context (ours or, when loaded, TorchRL's), or ``default``
    outside any (a module passes its ``default_recurrent_mode``)."""
    if torch.compiler.is_compiling():
        _torchrl_loaded()  # a constant of the graph: starts mirroring TorchRL's flag when it is newly loaded
        traced = _MIRROR.traced
        mode = traced["torchrl"] if traced["mode"] is None else traced["mode"]
    else:
        trl = sys.modules.get(_TORCHRL_RNN)
        if trl is not _torchrl_module:
            _torchrl_loaded()
        mode = None if trl is None else trl.recurrent_mode()
        if mode is None and (trl is None or not _MIRRORED.get()):
            mode = _MODE.get()
    return default if mode is None else mode


class set_recurrent_mode(_DecoratorContextManager):
    """Context manager / decorator switching our recurrent modules' mode.

    Args:
        mode: ``True`` or ``"recurrent"``: modules process ``[*B, T]`` batches (time the last batch dim);
            ``False`` or ``"sequential"``: one step per call; ``None``: each module's ``default_recurrent_mode``.

    As ``torchrl.modules.set_recurrent_mode``, usable without TorchRL; when TorchRL is loaded it sets TorchRL's flag
    too, except in compiled code (Dynamo would drop the write restoring it after a ``scan``).
    """

    def __init__(self, mode: bool | Literal["recurrent", "sequential"] | None = True) -> None:
        super().__init__()
        if isinstance(mode, str) and mode.lower() in ("recurrent", "sequential"):
            mode = mode.lower() == "recurrent"
        elif mode is not None and not isinstance(mode, bool):
            raise (ValueError if isinstance(mode, str) else TypeError)(
                f"set_recurrent_mode: mode must be a bool, None, 'recurrent' or 'sequential', got {mode!r}.")
        self.mode = mode
        self._prev: bool | None = None  # the traced entry's (Dynamo cannot trace a ContextVar)

    def clone(self) -> set_recurrent_mode:
        return type(self)(self.mode)

    def __enter__(self) -> None:
        if torch.compiler.is_compiling():
            self._prev, _MIRROR.traced["mode"] = _MIRROR.traced["mode"], self.mode
            return
        prev = _MODE.get()
        _MIRROR.traced["mode"] = self.mode
        _MODE.set(self.mode)
        trl = _torchrl_module if _torchrl_loaded() else None
        torchrl_ctx = None if trl is None else trl.set_recurrent_mode(self.mode)
        if torchrl_ctx is not None:
            torchrl_ctx.__enter__()
        _ENTRIES.set((*_ENTRIES.get(), (prev, _MIRRORED.set(trl is not None), torchrl_ctx)))

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        if torch.compiler.is_compiling():
            _MIRROR.traced["mode"] = self._prev
            return
        *outer, (prev, mirrored_token, torchrl_ctx) = _ENTRIES.get()
        _ENTRIES.set(tuple(outer))
        if torchrl_ctx is not None:
            torchrl_ctx.__exit__(exc_type, exc_value, traceback)
        _MIRRORED.reset(mirrored_token)
        _MIRROR.traced["mode"] = prev
        _MODE.set(prev)


_torchrl_loaded()  # TorchRL imported first: its flag is mirrored from here on, in every thread


__all__ = ["LSTMModule", "GRUModule", "ModuleCell", "LiveParams", "RNNChild", "recurrent_mode", "set_recurrent_mode"]

# tensordict memoises "is this type a tensorclass?" in eager code only: a forward compiled before any eager write
# would guard on the whole memo and recompile at the first eager write; asking once here guards on one entry
is_tensorclass(torch.Tensor)


@dataclass(frozen=True)
class ModuleCell:
    """A cell kind as the modules see it: names, ``torch.nn`` weight class, core cell, functions, stacked init."""

    module_name: str
    nn_class: type[nn.Module]
    child_attr: str
    hyper_names: tuple[str, ...]
    state_names: tuple[str, ...]
    default_in_keys: tuple[NestedKey, ...]
    core: Cell
    step: Callable
    sequence: Callable
    ensemble_init: Callable

    @property
    def default_out_keys(self) -> tuple[NestedKey, ...]:
        return tuple(("next", key) for key in self.default_in_keys)


HYPER = ("input_size", "hidden_size", "num_layers", "bias", "dropout")
LSTM_CELL = ModuleCell("LSTMModule", nn.LSTM, "lstm", (*HYPER, "proj_size"), ("h", "c"),
                       ("recurrent_state_h", "recurrent_state_c"), LSTM, lstm_step, lstm_sequence,
                       ensemble_init_lstm_params)
GRU_CELL = ModuleCell("GRUModule", nn.GRU, "gru", HYPER, ("h",), ("recurrent_state",), GRU, gru_step, gru_sequence,
                      ensemble_init_gru_params)


# ----------------------------------------------------------------------------- the weight child
class LiveParams:
    """A reference to a child module's attribute dict that pytree leaves alone: ``torch.export`` pytree-copies plain
    module attributes while the parameters are fake and writes the copy back (a bare dict would hold the fakes)."""

    __slots__ = ("attrs",)

    def __init__(self, module: nn.Module) -> None:
        self.attrs = module.__dict__

    def __reduce__(self):
        """Copied or pickled empty: the owner re-binds it to its own child (the attribute dict holds weak refs)."""
        return object.__new__, (LiveParams,)


def check_child(cell: ModuleCell, rnn) -> None:
    """Raise unless ``rnn`` can hold ``cell``'s weights: an ``nn.RNNBase`` in its mode, or a ``cell.nn_class``."""
    cls = cell.nn_class
    if issubclass(cls, nn.RNNBase):
        ok = isinstance(rnn, nn.RNNBase) and rnn.mode == cls.__name__
        want, alt = f"a torch.nn.{cls.__name__}", f" (or an nn.RNNBase in {cls.__name__} mode)"
        note = " (a quantized one cannot serve: the forward computes with the child's float parameters, read by name)"
    else:
        ok, want, alt, note = isinstance(rnn, cls), f"a {cls.__module__}.{cls.__qualname__}", "", ""
    if not ok:
        raise TypeError(f"{cell.module_name}: {cell.child_attr} must be {want}{alt}, got {type(rnn).__module__}."
                        f"{type(rnn).__qualname__}. Assign {want}{note}.")


class RNNChild:
    """Mixin for an ``nn.Module`` whose weights live in the child ``_cell.child_attr``: assigning that child (a direct
    module-dict write is seen by the next eager call), unpickling and ``.to()`` re-bind what the forward reads."""

    _cell: ModuleCell

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        if name == self._cell.child_attr:
            self._bind_rnn(value)

    def add_module(self, name: str, module: nn.Module | None) -> None:
        super().add_module(name, module)
        if name == self._cell.child_attr:
            self._bind_rnn(module)

    def _bind_rnn(self, rnn: nn.Module) -> None:
        check_child(self._cell, rnn)
        self._live = LiveParams(rnn)
        self._layout = self._cell.core.read_layout(self._weights)
        self._input_size = int(rnn.input_size)
        # (P, H) for the LSTM (P = proj_size or H), (H,) otherwise
        widths = (getattr(rnn, "proj_size", 0) or rnn.hidden_size, rnn.hidden_size)[-len(self._cell.state_names):]
        self._sizes = (int(rnn.num_layers), widths)
        self._state_shapes = tuple([(self._sizes[0], width) for width in widths])

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._bind_rnn(self._rnn)

    def _apply(self, fn, recurse: bool = True):
        out = super()._apply(fn, recurse)
        self._bind_rnn(self._rnn)
        return out

    @property
    def _weights(self) -> dict:
        """The child's weights by name: its parameter dict, or a copy with those it computes (parametrize, prune)."""
        if not torch.compiler.is_compiling():
            attr = self._cell.child_attr
            child = self._modules.get(attr)
            if child is None:  # a RuntimeError: an AttributeError raised in a property reads as a missing property
                raise RuntimeError(f"{self._cell.module_name}: the child module.{attr} holding the weights was "
                                   f"deleted; assign a new one to module.{attr}.")
            if child.__dict__ is not self._live.attrs:  # replaced by a direct module-dict write (quantize_dynamic)
                self._bind_rnn(child)
        attrs = self._live.attrs
        params = attrs["_parameters"]
        parametrized, hooks = attrs["_modules"].get("parametrizations"), attrs["_forward_pre_hooks"]
        if parametrized is None and not hooks:
            return params
        weights = dict(params)
        for name, weight in (parametrized or {}).items():
            weights[name] = weight()
        for hook in hooks.values():
            if isinstance(hook, prune.BasePruningMethod):
                name = hook._tensor_name
                weights[name] = weights.pop(name + "_orig") * attrs["_buffers"][name + "_mask"]
        return weights

    @property
    def _rnn(self) -> nn.Module:
        return getattr(self, self._cell.child_attr)


# ----------------------------------------------------------------------------- the one constructor: options, signature
def checked_option(name: str) -> property:
    """The option ``name``, held as ``_name``: assigning it calls the owner's ``_check_option(name, value)`` first."""
    private = f"_{name}"

    def set(self, value) -> None:
        self._check_option(name, value)
        object.__setattr__(self, private, value)

    return property(lambda self: getattr(self, private), set,
                    doc=f"``{name}``, checked on assignment as the constructor checks it.")


def options_state(state: dict, names: tuple[str, ...]) -> dict:
    """A pickled module's ``__dict__`` with the options ``names`` moved to their private names (older pickles)."""
    for name in names:
        if name in state:
            state[f"_{name}"] = state.pop(name)
    return state


_SIGNATURE = (("input_size", None), ("hidden_size", None), ("num_layers", 1), ("bias", True), ("batch_first", True),
              ("dropout", 0), ("proj_size", 0), ("bidirectional", False), ("python_based", False),
              ("recurrent_backend", "auto"), ("recurrent_compute_dtype", None), ("recurrent_recompute", "none"),
              ("recurrent_matmul_precision", "auto"))
_KEYWORDS = (("in_key", None), ("in_keys", None), ("out_key", None), ("out_keys", None), ("device", None),
             ("CHILD", None), ("default_recurrent_mode", None), ("recurrent_slice_len", None),
             ("recurrent_num_slices", None))
_OPTIONS = ("recurrent_backend", "recurrent_recompute", "recurrent_compute_dtype", "recurrent_matmul_precision")
_USE_MODE = ("Use the set_recurrent_mode context manager (rnn_functional.set_recurrent_mode or "
             "torchrl.modules.set_recurrent_mode) or the default_recurrent_mode constructor argument.")


def resolve_keys(cell: ModuleCell, in_key, in_keys, out_key, out_keys) -> tuple[list[NestedKey], list[NestedKey]]:
    """``([input, *hidden, "is_init"], [output, *("next", hidden)])`` by TorchRL's rules and exception classes."""
    owner, n = cell.module_name, 1 + len(cell.state_names)
    what = f"a value and {len(cell.state_names)} hidden state(s) {cell.state_names}"
    given = (("in", in_key, in_keys, cell.default_in_keys), ("out", out_key, out_keys, cell.default_out_keys))
    for io, key, keys, _ in given:
        if not ((key is None) ^ (keys is None)):
            raise ValueError(f"Either {io}_keys or {io}_key must be specified but not both or none. "
                             f"Got {keys} and {key} respectively.")
    resolved = []
    for io, key, keys, defaults in given:
        keys = [key, *defaults] if key is not None else keys
        if not isinstance(keys, (list, tuple)):  # TorchRL's unravel_key_list(keys) binding raises TypeError
            raise TypeError(
                f"{owner}: incompatible function arguments: {io}_keys must be a list or tuple of {n} keys ({what}), "
                f"got {type(keys).__name__} {keys!r}. Use {io}_key={keys!r} to name only the "
                f"{'input' if io == 'in' else 'output'} and keep the default hidden-state keys.")
        resolved.append(unravel_key_list(list(keys)))
    in_keys, out_keys = resolved
    if len(in_keys) != n and not (len(in_keys) == n + 1 and in_keys[-1] == "is_init"):
        raise ValueError(f"{owner} expects {n} inputs: {what} (and optionally a final 'is_init' marker). "
                         f"Got in_keys {in_keys} instead.")
    if len(out_keys) != n:
        raise ValueError(f"{owner} expects {n} outputs: {what}. Got out_keys {out_keys} instead.")
    return (in_keys if "is_init" in in_keys else in_keys + ["is_init"]), out_keys


def build_rnn(cell: ModuleCell, rnn, given: dict, *, batch_first: bool, bidirectional: bool, device) -> nn.Module:
    """The child: ``rnn`` itself, checked, or a new ``cell.nn_class`` built from ``given`` (TorchRL's exceptions)."""
    owner, arg, kind = cell.module_name, cell.child_attr, cell.nn_class.__name__
    bidirectional_msg = (f"{owner}: bidirectional RNNs are not supported: a backward pass over time cannot honour "
                         f"is_init resets causally. Use bidirectional=False.")
    if rnn is None:
        takes_child = issubclass(cell.nn_class, nn.RNNBase)
        if not batch_first:
            raise ValueError(f"The input {arg} must have batch_first=True." if takes_child else
                             f"{owner}: batch_first=False is not supported: inputs are [*B, T, F]. Use batch_first=True.")
        for name in ("input_size", "hidden_size"):  # TorchRL (nn.RNNBase) raises TypeError, input_size first
            if given[name] is None:
                raise TypeError(f"{owner}: {name} must be passed (an int), got None"
                                + (f"; or pass a built {arg}=nn.{kind}(...)." if takes_child else "."))
        if bidirectional:
            raise ValueError(bidirectional_msg)
        return cell.nn_class(**given, batch_first=True, device=device)
    check_child(cell, rnn)
    if not rnn.batch_first:
        raise ValueError(f"The input {arg} must have batch_first=True.")
    if given["input_size"] is not None or given["hidden_size"] is not None:
        raise ValueError(f"An {kind} instance cannot be passed along with class argument: {owner}({arg}=...) takes "
                         f"input_size and hidden_size from the module; drop them.")
    defaults = dict(_SIGNATURE)  # input_size and hidden_size are None here, as their defaults
    for key in cell.hyper_names:
        if given[key] != defaults[key] and given[key] != getattr(rnn, key):
            raise ValueError(f"{owner}: {key}={given[key]!r} conflicts with the wrapped {arg} ({key}="
                             f"{getattr(rnn, key)!r}); the wrapped module's hyper-parameters are used: drop {key}.")
    if rnn.bidirectional:
        raise ValueError(bidirectional_msg)
    param = next(rnn.parameters())
    if device is not None and torch.device(device) != param.device:
        raise ValueError(f"{owner}: device={device!r} differs from the wrapped {arg}'s device {param.device}; "
                         f"move the module with .to(device) instead.")
    return rnn


# ----------------------------------------------------------------------------- TorchRL's python-based child
_PYTHON_PREFIX = "TorchRLPython"
_PYTHON_CLASSES: dict[str, type[nn.RNNBase]] = {}


def _python_class(kind: str) -> type[nn.RNNBase]:
    """``torch.nn.<kind>`` with TorchRL's Python forward first in its MRO (an instance of both)."""
    if kind not in _PYTHON_CLASSES:
        trl = importlib.import_module(_TORCHRL_RNN)
        name = _PYTHON_PREFIX + kind
        _PYTHON_CLASSES[kind] = type(name, (getattr(trl, kind), getattr(nn, kind)),
                                     {"__module__": __name__, "__qualname__": name})
    return _PYTHON_CLASSES[kind]


def __getattr__(name: str):
    """Unpickling a python-based child looks its class up here: build it on demand."""
    if name.startswith(_PYTHON_PREFIX):
        return _python_class(name[len(_PYTHON_PREFIX):])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------- the modules
class RecurrentModule(RNNChild, TensorDictModuleBase):
    """What every recurrent TensorDict module shares; each subclass sets ``_cell``."""

    _cell: ModuleCell

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "_cell" in cls.__dict__:  # TorchRL's signature for this cell, then the subclass's keyword-only arguments
            cell, kind = cls._cell, inspect.Parameter
            params = [kind(name, kind.POSITIONAL_OR_KEYWORD, default=default) for name, default in _SIGNATURE
                      if name != "proj_size" or "proj_size" in cell.hyper_names]
            params += [kind(cell.child_attr if name == "CHILD" else name, kind.KEYWORD_ONLY, default=default)
                       for name, default in _KEYWORDS if name != "CHILD" or issubclass(cell.nn_class, nn.RNNBase)]
            params += [p for p in inspect.signature(cls.__init__).parameters.values() if p.kind is kind.KEYWORD_ONLY]
            cls.__signature__ = inspect.Signature(params)
            cls.DEFAULT_IN_KEYS = list(cls._cell.default_in_keys)
            cls.DEFAULT_OUT_KEYS = list(cls._cell.default_out_keys)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()
        cell = self._cell
        a = type(self).__signature__.bind(*args, **kwargs)
        a.apply_defaults()
        a = a.arguments
        given = {name: a[name] for name in cell.hyper_names}
        self._check_options(dropout=given["dropout"], **{name: a[name] for name in _OPTIONS})
        check_value(a["recurrent_slice_len"], f"{cell.module_name}: recurrent_slice_len")
        check_value(a["recurrent_num_slices"], f"{cell.module_name}: recurrent_num_slices")
        check_pair(a["recurrent_slice_len"], a["recurrent_num_slices"], f"{cell.module_name}: ", "recurrent_")
        if not isinstance(a["python_based"], bool):
            raise TypeError(f"{cell.module_name}: python_based must be a bool, got {type(a['python_based']).__name__}.")
        rnn = build_rnn(cell, a.get(cell.child_attr), given, batch_first=a["batch_first"],
                        bidirectional=a["bidirectional"], device=a["device"])
        self.in_keys, self.out_keys = resolve_keys(cell, a["in_key"], a["in_keys"], a["out_key"], a["out_keys"])
        setattr(self, cell.child_attr, rnn)
        self.python_based = False
        if a["python_based"]:
            self.make_python_based()
        for name in _OPTIONS:  # checked together above; assignments later check each
            object.__setattr__(self, f"_{name}", a[name])
        self.recurrent_slice_len, self.recurrent_num_slices = a["recurrent_slice_len"], a["recurrent_num_slices"]
        self._recurrent_mode = a["default_recurrent_mode"]

    recurrent_backend = checked_option("recurrent_backend")
    recurrent_recompute = checked_option("recurrent_recompute")
    recurrent_compute_dtype = checked_option("recurrent_compute_dtype")
    recurrent_matmul_precision = checked_option("recurrent_matmul_precision")

    def _check_options(self, *, recurrent_backend: str, recurrent_recompute: str, recurrent_compute_dtype,
                       recurrent_matmul_precision, dropout: float = 0.0) -> None:
        """Raise unless these options could serve a call: each value, their combination and the backend's cell."""
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
        """Run one step or a sequence: ``module(tensordict)`` writes the outputs into ``tensordict`` and returns it;
        ``module(input=..., is_init=...)`` returns the outputs."""
        if args and isinstance(args[0], TensorDictBase):  # not through dispatch: its frame adds guards when compiled
            if len(args) == 1 and not kwargs:
                return self._forward(args[0], self._weights, self._layout)
            raise TypeError(
                f"{type(self).__name__}.forward() takes a TensorDict alone, or the in_keys' tensors "
                f"{[str(k) for k in self.in_keys]} without one; got a TensorDict and {len(args) - 1} more positional "
                f"argument(s), keyword(s) {sorted(kwargs)}. Pass module(tensordict): it is updated in place and returned.")
        return self._forward_from_tensors(*args, **kwargs)

    @dispatch
    def _forward_from_tensors(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._forward(tensordict, self._weights, self._layout)

    def forward_with_params(self, tensordict: TensorDictBase, params) -> TensorDictBase:
        """:meth:`forward` with explicit weights (``torch.nn`` names), not the child's (as ``EnsembleModule`` runs)."""
        return self._forward(tensordict, params, None)

    def _forward(self, td: TensorDictBase, params, layout: Layout | None) -> TensorDictBase:
        """``layout``: the own weights' layout, ``None`` for others (Dynamo cannot trace ``params is weights``)."""
        cell, recurrent, owner = self._cell, recurrent_mode(bool(self._recurrent_mode)), type(self).__name__
        # tensordict's private key lists: each public property read adds guards that a compiled call re-checks
        in_keys, out_keys = self._in_keys, self._out_keys_apparent
        n = len(cell.state_names)
        dims = "[*batch, T" if recurrent else "[*batch"
        if recurrent and td.ndim == 0:
            raise ValueError(f"{owner} in recurrent mode needs a TensorDict with at least one batch dim (time, the "
                             f"last one); got batch_size {list(td.batch_size)}. Use sequential mode for single steps.")
        x, is_init = td.get(in_keys[0], None), td.get(in_keys[-1], None)
        if x is None:
            raise KeyError(f"{owner}: input key {in_keys[0]!r} not found in the TensorDict (keys: "
                           f"{list(td.keys(True, True))}). Store the input there ({dims}, {self._input_size}]) or "
                           f"name its key with in_key=... / in_keys=[...].")
        if x.ndim == 0 or x.shape[-1] != self._input_size:
            raise ValueError(f"{owner}: input key {in_keys[0]!r} holds shape {list(x.shape)}; expected {dims}, "
                             f"{self._input_size}] (input_size={self._input_size} features last).")
        lead = tuple(x.shape[:-1])
        if is_init is None:
            raise KeyError(f"{owner}: key {in_keys[-1]!r} (trajectory starts) not found in the TensorDict (keys: "
                           f"{list(td.keys(True, True))}). Add torchrl.envs.InitTracker() to the env (Collector(..., "
                           f"auto_register_policy_transforms=True) does), or set it yourself (bool {list(lead) + [1]}).")
        if is_init.dtype != torch.bool:
            raise TypeError(f"{owner}: key {in_keys[-1]!r} holds dtype {is_init.dtype}; expected torch.bool. Store "
                            f"td[{in_keys[-1]!r}] = td[{in_keys[-1]!r}].bool().")
        if tuple(is_init.shape) not in (lead, (*lead, 1)):
            raise ValueError(f"{owner}: key {in_keys[-1]!r} holds shape {list(is_init.shape)}; expected "
                             f"{list(lead) + [1]} or {list(lead)} ({dims}(, 1)], the input's leading dims). Store one "
                             f"flag per {'step' if recurrent else 'batch element'}.")
        states, missing = [], []
        for key in in_keys[1:1 + n]:
            states.append(td.get(key, None))
            if states[-1] is None:
                missing.append(key)
        if len(missing) == n:
            states = None  # zeros, as TorchRL
        elif missing:
            raise RuntimeError(f"{owner}: hidden state keys {missing} are missing while "
                               f"{[k for k in in_keys[1:1 + n] if k not in missing]} are present; provide all of "
                               f"{in_keys[1:1 + n]} or none (zeros).")
        else:
            states = tuple(states)
            for key, state, (layers, width) in zip(in_keys[1:], states, self._state_shapes):
                if tuple(state.shape) != (*lead, layers, width):
                    hint = (f" It lacks the layer dim: store td[{key!r}] = td[{key!r}].unsqueeze(-2)."
                            if tuple(state.shape) == (*lead, width) and layers == 1
                            else " Build env hidden states with module.make_tensordict_primer().")
                    raise ValueError(f"{owner}: hidden state key {key!r} holds shape {list(state.shape)}; expected "
                                     f"{[*lead, layers, width]} ({dims}, num_layers, {width}]).{hint}")
        params = params if isinstance(params, dict) else dict(params.items())
        layout = cell.core.layout_of(params, layout)
        if layout.device.type == "meta":
            raise RuntimeError(f"{owner}: its weights are on the meta device (an EnsembleModule's template: the "
                               f"members' are in ens.params). Run member e with ens.params[e].to_module(module), or "
                               f"load weights with module.to_empty(device=...) and load_state_dict(...).")
        if layout.input_size != x.shape[-1] or (layout.num_layers, layout.state_sizes) != self._sizes:
            raise ValueError(f"{owner}: the weights are for input_size={layout.input_size}, num_layers="
                             f"{layout.num_layers} and state widths {list(layout.state_sizes)}, but the module is "
                             f"built for input_size={x.shape[-1]}, states {[list(s) for s in self._state_shapes]}. "
                             f"Load weights of the module's sizes (or build the module for these).")
        for key, t in zip(in_keys, (x, *(states or ()))):
            if (t.dtype != layout.dtype and t.dtype != autocast_dtype(layout)) or t.device != layout.device:
                raise ValueError(f"{owner}: key {key!r}: expected dtype {layout.dtype} on {layout.device} (the "
                                 f"params'), got {t.dtype} on {t.device}. Convert the TensorDict (td.to(...)) or the "
                                 f"module (module.to(...)).")
        dropout = float(self._live.attrs["dropout"]) if self.training else 0.0  # the child's, now (as TorchRL)
        if recurrent:
            # the states at t = 0 (none for an empty time dim: empty outputs, as the functional sequence returns)
            first = None
            if states is not None and states[0].shape[-3]:
                first = states[0].select(-3, 0) if n == 1 else (states[0].select(-3, 0), states[1].select(-3, 0))
            backend = self._recurrent_backend  # the options' private fields: each property read is a call
            if self.python_based and backend in ("pad", "auto"):
                # TorchRL's Python loop: eager pad/auto run reference; compiled and vmapped calls keep their backend
                context = call_context()
                backend = backend if context.compiling or context.vmapped else "reference"
            y, _, out = cell.sequence(
                x, first, params, is_init=is_init, reset_state=states, backend=backend, dropout=dropout,
                training=self.training, recompute=self._recurrent_recompute, compute_dtype=self._recurrent_compute_dtype,
                matmul_precision=self._recurrent_matmul_precision, return_segment_states=True,
                slice_len=self.recurrent_slice_len, num_slices=self.recurrent_num_slices, layout=layout)
        else:
            y, out = cell.step(x, states, params, is_init=is_init, dropout=dropout, training=self.training,
                               layout=layout)
            y = y.clone()  # the core's step returns the top layer's h as both (nn.LSTMCell's contract); TorchRL's two
        td.set(out_keys[0], y)
        for key, value in zip(out_keys[1:], (out,) if n == 1 else out):
            td.set(key, value)
        return td

    @property
    def recurrent_mode(self) -> bool:
        """True when the module processes ``[*B, T]`` sequences, False for single steps."""
        return recurrent_mode(bool(self._recurrent_mode))

    @recurrent_mode.setter
    def recurrent_mode(self, value) -> None:
        raise RuntimeError(f"recurrent_mode cannot be changed in-place. {_USE_MODE}")

    @property
    def temporal_mode(self):
        raise RuntimeError("temporal_mode is deprecated, use recurrent_mode instead.")

    def set_recurrent_mode(self, mode: bool = True):
        raise RuntimeError(f"{self._cell.module_name}.set_recurrent_mode() does not exist (TorchRL removed it in "
                           f"v0.8). {_USE_MODE}")

    def make_python_based(self):
        """Run the eager ``pad``/``auto`` recurrent path with the ``reference`` loop; when TorchRL is loaded the
        child's class also becomes TorchRL's Python implementation (still a ``torch.nn`` class). Returns self."""
        self.python_based = True
        if _TORCHRL_RNN in sys.modules and type(self._rnn) in (nn.LSTM, nn.GRU):
            self._rnn.__class__ = _python_class(type(self._rnn).__name__)
        return self

    def make_cudnn_based(self):
        """Run eager recurrent calls on ATen's (cuDNN/oneDNN) kernels: ``recurrent_backend="pad"``. Returns self."""
        owner = self._cell.module_name
        if self._cell.core.aten is None:
            raise ValueError(f"{owner}.make_cudnn_based(): cuDNN/oneDNN have no {self._cell.core.title} kernel "
                             f"(backend 'pad'); keep recurrent_backend={self.recurrent_backend!r}.")
        if self.recurrent_recompute != "none":
            raise ValueError(f"{owner}.make_cudnn_based(): recurrent_recompute={self.recurrent_recompute!r} cannot be "
                             f"served by the cuDNN/oneDNN kernels (backend 'pad'); keep recurrent_backend="
                             f"{self.recurrent_backend!r} or set recurrent_recompute='none' first.")
        self.python_based = False
        self.recurrent_backend = "pad"
        if type(self._rnn) in _PYTHON_CLASSES.values():
            self._rnn.__class__ = self._cell.nn_class
        return self

    @property
    def canonical_keys(self) -> list[NestedKey]:
        """The keys whose memory layout matters to this module: ``in_keys + out_keys``."""
        return list(self.in_keys) + list(self.out_keys)

    def canonicalize(self, data: TensorDictBase, *, inplace: bool = False) -> TensorDictBase:
        """``data`` with its :attr:`canonical_keys` leaves made contiguous (a shallow copy unless ``inplace``)."""
        present = set(data.keys(include_nested=True))
        keys = [k for k in self.canonical_keys if k in present]
        if not keys:
            return data
        out = data if inplace else data.copy()
        out.update(data.select(*keys).contiguous(canonical=True))
        return out

    def make_tensordict_primer(self):
        """A ``torchrl.envs.TensorDictPrimer`` adding zero hidden states (unbounded specs ``[L, P|H]``, expanded to
        the env's batch size) to env TensorDicts. Requires torchrl (imported here, lazily)."""
        from torchrl.data import Unbounded
        from torchrl.envs.transforms import TensorDictPrimer

        in_hidden = self.in_keys[1:1 + len(self._cell.state_names)]
        if any(unravel_key(("next", i)) != unravel_key(o) for i, o in zip(in_hidden, self.out_keys[1:])):
            raise RuntimeError(
                "make_tensordict_primer is supposed to work with in_keys/out_keys that have compatible names, "
                "ie. the out_keys should be named after ('next', <in_key>). Got "
                f"in_keys={self.in_keys} and out_keys={self.out_keys} instead.")
        dtype = next(iter(self._weights.values())).dtype
        return TensorDictPrimer({k: Unbounded(shape=shape, dtype=dtype) for k, shape in
                                 zip(in_hidden, self._state_shapes)}, expand_specs=True)


class LSTMModule(RecurrentModule):
    """Drop-in replacement for ``torchrl.modules.LSTMModule`` built on the functional core.

    Args (TorchRL's, same order and defaults):
        input_size, hidden_size, num_layers, bias, dropout, proj_size: as ``torch.nn.LSTM``.
        batch_first, bidirectional: must be True (TorchRL's rule) / False (resets are causal).
        python_based: eager ``"pad"``/``"auto"`` recurrent calls run the ``reference`` loop (``make_python_based``).
        recurrent_backend: core ``backend`` of recurrent mode: ``"auto"`` (default; it picks TorchRL's ``"pad"`` in
            plain eager mode), ``"pad"``, ``"scan"``, ``"triton"`` or ``"reference"``.
        recurrent_compute_dtype, recurrent_matmul_precision: the core's ``compute_dtype``/``matmul_precision``.
        recurrent_recompute: ``"none"`` or ``"full"`` (checkpointed backward); ``"full"`` with ``"pad"`` raises.

    Keyword Args:
        in_key / in_keys: the input key (hidden keys default to ``recurrent_state_h``, ``recurrent_state_c``) or
            the triplet ``[input, h, c]`` (``"is_init"`` is appended).
        out_key / out_keys: the output key (hidden outputs default to ``("next", <hidden key>)``) or the triplet.
        device: device of new parameters.
        lstm: an ``nn.LSTM`` (``batch_first=True``) kept as ``self.lstm``, which holds the weights (TorchRL's names).
        default_recurrent_mode: mode when no ``set_recurrent_mode`` context is active (False).
        recurrent_slice_len, recurrent_num_slices: ``L`` when recurrent-mode batches are ``SliceSampler`` slices of
            exactly ``L`` steps; ``K`` too when they hold at most ``K`` slices of at most ``L`` steps (compiled, a
            padded ``[K, L]`` block): static shapes under ``torch.compile`` (``docs/compile.md``). Not TorchRL's.
    """

    _cell = LSTM_CELL


class GRUModule(RecurrentModule):
    """Drop-in replacement for ``torchrl.modules.GRUModule`` built on the functional core.

    :class:`LSTMModule`'s arguments without ``proj_size``, ``gru=`` (an ``nn.GRU``, kept as ``self.gru``) for
    ``lstm=``, one hidden key (``recurrent_state``): ``in_keys = [input, h]``, ``out_keys = [output, ("next", h)]``.
    """

    _cell = GRU_CELL
