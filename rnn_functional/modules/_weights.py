"""The weight container: a real ``torch.nn.LSTM``/``GRU`` child, read by the forward through a plain reference.

The child (``module.lstm`` / ``module.gru``, TorchRL's names) owns the parameters, so state
dicts, ``named_parameters``, ``TensorDict.from_module`` and ``module.lstm(x)`` behave as in
TorchRL. The forward never touches the child: ``torch.compile`` graph-breaks on any access
to an ``nn.LSTM``/``nn.GRU`` object. It reads the child's ``_parameters`` dict (and its ``dropout``, from its
attribute dict) through references kept on the parent instead. That dict is the object every parameter swap writes
into (``TensorDict.to_module``, ``torch.func.functional_call``, ``.to()``, ``load_state_dict``);
a ``deepcopy`` or an unpickled copy re-binds the references to its own child.

The reference is held by a :class:`LiveParams` object, not as a bare dict attribute: ``torch.export``
snapshots every plain module attribute with a pytree copy while the parameters are fake tensors and
writes the copy back when it is done (``_detect_attribute_assignment`` in torch's AOTAutograd
frontend), which replaced a bare dict reference by a copy holding the trace's fake tensors. Pytree
treats a ``LiveParams`` as a leaf, so the snapshot writes back the same object, still pointing at
the child's dict.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn
from torch.nn.utils import prune

from ._cells import ModuleCell

__all__ = ["LiveParams", "RNNChild", "build_rnn"]


class LiveParams:
    """A reference to a child module's attribute dict (the same object, never a copy) that pytree leaves alone."""

    __slots__ = ("attrs",)

    def __init__(self, module: nn.Module) -> None:
        self.attrs = module.__dict__

    @property
    def params(self) -> dict:
        """The child's parameter dict, the object every parameter swap writes into."""
        return self.attrs["_parameters"]

    def __reduce__(self):
        """Copied or pickled empty: the owner re-binds it to its own child (``RNNChild.__setstate__``); the child's
        attribute dict holds weak references, which do not pickle."""
        return object.__new__, (LiveParams,)


class RNNChild:
    """Mixin for an ``nn.Module`` whose weights live in the child named ``_cell.child_attr``.

    Assigning that child (in ``__init__`` or later, e.g. ``module.lstm = nn.LSTM(...)``, ``add_module``,
    ``set_submodule``; a direct write of the module dict is seen by the next eager call)
    re-binds the references the forward reads: the child's parameter dict, the
    hyper-parameters the forward needs and the params' layout, checked once (a snapshot taken at
    assignment and after ``.to()``).
    """

    _cell: ClassVar[ModuleCell]

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        if name == self._cell.child_attr:
            self._bind_rnn(value)

    def add_module(self, name: str, module: nn.Module | None) -> None:
        """``add_module``/``register_module`` write the child dict without ``__setattr__``: re-bind here too."""
        super().add_module(name, module)
        if name == self._cell.child_attr:
            self._bind_rnn(module)

    def _bind_rnn(self, rnn: nn.RNNBase) -> None:
        check_child(self._cell, rnn)
        self._live = LiveParams(rnn)
        self._layout = self._cell.core.read_layout(self._weights)  # checked once, read by the step and the sequence
        self._input_size = int(rnn.input_size)
        self._num_layers = int(rnn.num_layers)
        self._state_shapes = tuple((self._num_layers, width) for width in self._cell.state_widths(rnn))

    def __setstate__(self, state: dict) -> None:
        """Unpickled or deep-copied: re-bind, so that the layout names the cell objects, not copies."""
        super().__setstate__(state)
        self._bind_rnn(self._rnn)

    def _apply(self, fn, recurse: bool = True):
        """``.to()``, ``.double()``, ...: re-bind, the weights' dtype or device may have changed."""
        out = super()._apply(fn, recurse)
        self._bind_rnn(self._rnn)
        return out

    @property
    def _weights(self) -> dict:
        """The child's weights by name (``torch.nn`` state-dict names): its parameter dict, or, where the child
        computes some of them, a dict with those as it computes them: parametrized ones
        (``torch.nn.utils.parametrizations.weight_norm``, ``spectral_norm``, ``parametrize``) through their
        ``ParametrizationList`` (a module Dynamo traces), pruned ones (``torch.nn.utils.prune``, whose pre-hook
        the child would run) as ``orig * mask``."""
        if not torch.compiler.is_compiling():
            attr = self._cell.child_attr
            child = self._modules.get(attr)
            if child is None:  # a RuntimeError: an AttributeError raised in a property reads as a missing property
                raise RuntimeError(f"{self._cell.module_name}: the child module.{attr} holding the weights was "
                                   f"deleted; assign a new one to module.{attr}.")
            if child.__dict__ is not self._live.attrs:
                # replaced by a direct write of the module dict (``quantize_dynamic``'s swap does this), which no hook
                # sees; compiled calls cannot check (Dynamo graph-breaks on any access to the child)
                self._bind_rnn(child)
        params, attrs = self._live.params, self._live.attrs
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
    def _dropout(self) -> float:
        """The child's ``dropout`` as it is at this call: ``module.lstm.dropout = p`` after construction takes effect,
        as in TorchRL (read through the child's attribute dict, which Dynamo traces, guarding on its value)."""
        return float(self._live.attrs["dropout"])

    @property
    def _rnn(self) -> nn.RNNBase:
        """The ``torch.nn`` child holding the weights (``self.lstm`` / ``self.gru``)."""
        return getattr(self, self._cell.child_attr)


def check_child(cell: ModuleCell, rnn) -> None:
    """Raise unless ``rnn`` can hold ``cell``'s weights: an ``nn.RNNBase`` in the cell's mode (``nn.LSTM``, or e.g.
    ``torchrl.modules.LSTM``) for the ``torch.nn`` cells, else a ``cell.nn_class``: the forward reads their
    float parameters by name."""
    cls = cell.nn_class
    if issubclass(cls, nn.RNNBase):
        ok = isinstance(rnn, nn.RNNBase) and rnn.mode == cls.__name__
        want = f"a torch.nn.{cls.__name__}"
        alt = f" (or an nn.RNNBase in {cls.__name__} mode)"
        note = " (a quantized one cannot serve: the forward computes with the child's float parameters, read by name)"
    else:
        ok = isinstance(rnn, cls)
        want = f"a {cls.__module__}.{cls.__qualname__}"
        alt = note = ""
    if not ok:
        raise TypeError(f"{cell.module_name}: {cell.child_attr} must be {want}{alt}, got {type(rnn).__module__}."
                        f"{type(rnn).__qualname__}. Assign {want}{note}.")


def build_rnn(
    cell: ModuleCell,
    rnn: nn.RNNBase | None,
    given: dict,
    *,
    batch_first: bool,
    bidirectional: bool,
    device: torch.device | str | None,
) -> nn.RNNBase:
    """The child: ``rnn`` itself, checked, or a new ``cell.nn_class`` built from ``given``.

    ``given``: the constructor's hyper-parameters (``cell.hyper_names``); with ``rnn``,
    ``input_size``/``hidden_size`` must be None and the others at their defaults or equal
    to ``rnn``'s. Exception classes follow TorchRL's for the same mistakes.
    """
    owner, arg, kind = cell.module_name, cell.child_attr, cell.nn_class.__name__
    bidirectional_msg = (
        f"{owner}: bidirectional RNNs are not supported: a backward pass over time cannot honour "
        f"is_init resets causally. Use bidirectional=False."
    )
    if rnn is None:
        takes_child = issubclass(cell.nn_class, nn.RNNBase)  # LSTMModule(lstm=...), GRUModule(gru=...); not the linear cells
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
        raise ValueError(
            f"An {kind} instance cannot be passed along with class argument: {owner}({arg}=...) takes "
            f"input_size and hidden_size from the module; drop them."
        )
    defaults = {"num_layers": 1, "bias": True, "dropout": 0, "proj_size": 0}
    for key in cell.hyper_names:
        if key in defaults and given[key] != defaults[key] and given[key] != getattr(rnn, key):
            raise ValueError(
                f"{owner}: {key}={given[key]!r} conflicts with the wrapped {arg} ({key}={getattr(rnn, key)!r}); "
                f"the wrapped module's hyper-parameters are used: drop {key}."
            )
    if rnn.bidirectional:
        raise ValueError(bidirectional_msg)
    param = next(rnn.parameters())
    if device is not None and torch.device(device) != param.device:
        raise ValueError(
            f"{owner}: device={device!r} differs from the wrapped {arg}'s device {param.device}; "
            f"move the module with .to(device) instead."
        )
    return rnn
