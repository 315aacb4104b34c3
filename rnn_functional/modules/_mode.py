"""The recurrent-mode switch shared by :class:`LSTMModule` and :class:`GRUModule`.

Recurrent mode (a whole ``[*B, T]`` batch per call) versus sequential mode (one step per
call) is chosen, from innermost to outermost, by:

1. :class:`set_recurrent_mode` (ours) or TorchRL's ``torchrl.modules.set_recurrent_mode``:
   whichever context was entered last wins. When TorchRL is loaded, ours also sets
   TorchRL's flag, so a single context drives every recurrent module of a pipeline,
   ours and TorchRL's alike; TorchRL's loss modules and value estimators (which enter
   ``set_recurrent_mode(True)``) therefore drive our modules too.
2. The module's ``default_recurrent_mode``.

TorchRL is never imported here: its flag is read only if ``torchrl`` is already in
``sys.modules``. The flag is context-local in eager mode (each thread and each worker
process has its own) and, under ``torch.compile``, which cannot trace ``ContextVar.get``, a
per-thread mirror (a ``threading.local``, which Dynamo reads and guards per calling thread).
TorchRL's flag is mirrored per thread too (:func:`_watch`): TorchRL's own compile-time copy is
one per process, through which a compiled call in one thread saw a context entered in another
(an actor thread's policy step ran as a recurrent sequence while a learner held
``set_recurrent_mode(True)``; TorchRL's modules still do, docs/compile.md).
"""

from __future__ import annotations

import contextvars
import sys
import threading
from typing import Literal

import torch
from torch.utils._contextlib import _DecoratorContextManager

from ..precision import mark_constant_result

__all__ = ["set_recurrent_mode", "recurrent_mode"]

_TORCHRL_RNN = "torchrl.modules.tensordict_module.rnn"


_torchrl_module = None  # TorchRL's rnn module, set by _torchrl_loaded()


@mark_constant_result
def _torchrl_loaded() -> bool:
    """Whether TorchRL's rnn module is imported (never imports it); caches it in ``_torchrl_module`` and, when it is
    new, starts mirroring its flag (:func:`_watch`).

    A constant under ``torch.compile``: reading ``sys.modules`` in traced code would guard on it, and
    every later import (Inductor imports modules as it compiles) would force a recompile.
    """
    global _torchrl_module
    found = sys.modules.get(_TORCHRL_RNN)
    if found is not _torchrl_module:
        _torchrl_module = found
        if found is not None:
            _watch(found)
    return found is not None


def _torchrl_context(trl) -> bool | None:
    """TorchRL's flag in the calling thread's context (``None`` without TorchRL)."""
    return None if trl is None else trl.recurrent_mode_state_manager._context_mode.get()


class _Mirror(threading.local):
    """Each thread's copy of the flags for compiled code, ours (``mode``) and TorchRL's (``torchrl``): Dynamo reads a
    ``threading.local`` (its guards read the calling thread's value), so a compiled call in one thread does not see a
    context entered in another."""

    def __init__(self) -> None:
        self.traced: dict[str, bool | None] = {"mode": None, "torchrl": _torchrl_context(_torchrl_module)}


class _ModeState:
    """Context-local flag in eager mode, mirrored in a per-thread dict entry for ``torch.compile``.

    The mirror is a dict entry, not an attribute: torch 2.13's Dynamo routes an attribute write on an
    existing object through a ``__dict__`` proxy bound to the side-effect table of its first access,
    which a higher-order op (our ``scan``) replaces, so a write after the op is dropped and a
    ``set_recurrent_mode`` exited after a compiled sequence left the flag set (pytorch/pytorch#195866);
    dict writes are replayed from the live table.
    """

    def __init__(self) -> None:
        self._var: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
            "rnn_functional_recurrent_mode", default=None
        )
        self._mirror = _Mirror()

    def get(self) -> bool | None:
        if torch.compiler.is_compiling():
            return self._mirror.traced["mode"]
        return self._var.get()

    def set(self, mode: bool | None) -> None:
        self._mirror.traced["mode"] = mode
        if not torch.compiler.is_compiling():
            self._var.set(mode)


_STATE = _ModeState()
# whether the innermost of our active contexts also set TorchRL's flag (eagerly, TorchRL loaded): TorchRL's flag is
# then the innermost context's of either kind, its None included (an inner TorchRL set_recurrent_mode(None))
_MIRRORED: contextvars.ContextVar[bool] = contextvars.ContextVar("rnn_functional_mode_mirrored", default=False)


# what each eager entry of a set_recurrent_mode restores on exit, innermost last: kept per thread (a context object
# entered from two threads at once, or twice nested, restored another entry's state from its own attributes)
_ENTRIES: contextvars.ContextVar[tuple] = contextvars.ContextVar("rnn_functional_mode_entries", default=())


def _watch(trl) -> None:
    """Mirror TorchRL's flag in each thread's :class:`_Mirror` for compiled code: every entry and exit of TorchRL's
    ``set_recurrent_mode`` (ours enters one too) goes through its state manager's ``set_mode``, which this wraps.
    The calling thread's mirror starts from TorchRL's flag now (a context entered before TorchRL was first seen)."""
    manager = trl.recurrent_mode_state_manager
    set_mode = manager.set_mode
    if not getattr(set_mode, "_mirrored", False):
        def mirrored(mode: bool | None) -> None:
            set_mode(mode)
            _STATE._mirror.traced["torchrl"] = mode

        mirrored._mirrored = True
        manager.set_mode = mirrored
    _STATE._mirror.traced["torchrl"] = _torchrl_context(trl)


def _torchrl_rnn():
    """TorchRL's rnn module if TorchRL is already imported, else ``None``."""
    return _torchrl_module if _torchrl_loaded() else None


def recurrent_mode() -> bool | None:
    """The recurrent mode set by the innermost active context, or ``None`` outside any.

    Reads TorchRL's ``set_recurrent_mode`` flag too when TorchRL is loaded. Under ``torch.compile``
    our flag is read first (see :class:`set_recurrent_mode`), then the calling thread's mirror of TorchRL's
    (:func:`_watch`).
    """
    if torch.compiler.is_compiling():  # the traced mirror read directly: each traced call adds guards per compiled call
        _torchrl_loaded()  # a constant of the graph: starts mirroring TorchRL's flag when it is newly loaded
        traced = _STATE._mirror.traced
        return traced["torchrl"] if traced["mode"] is None else traced["mode"]
    trl = sys.modules.get(_TORCHRL_RNN)
    if trl is not _torchrl_module:
        _torchrl_loaded()
    if trl is not None:
        mode = trl.recurrent_mode()
        if mode is not None or _MIRRORED.get():
            return mode
    return _STATE._var.get()


class set_recurrent_mode(_DecoratorContextManager):
    """Context manager / decorator switching our recurrent modules' mode.

    Args:
        mode: ``True`` or ``"recurrent"``: modules process ``[*B, T]`` batches (time is
            the last batch dim); ``False`` or ``"sequential"``: one step per call;
            ``None``: each module's ``default_recurrent_mode``. Default ``True``.

    Same signature and meaning as ``torchrl.modules.set_recurrent_mode``, usable without
    TorchRL. When TorchRL is loaded it also sets TorchRL's flag for the same scope, except when
    entered inside ``torch.compile``d code: torch 2.13's Dynamo drops attribute writes made after a
    ``scan`` in the same graph, so TorchRL's flag (an attribute) would stay set after the compiled
    call; there our flag alone drives our modules (TorchRL's modules in that region don't see it).
    """

    def __init__(self, mode: bool | Literal["recurrent", "sequential"] | None = True) -> None:
        super().__init__()
        if isinstance(mode, str):
            named = {"recurrent": True, "sequential": False}
            if mode.lower() not in named:
                raise ValueError(
                    f"set_recurrent_mode: mode must be a bool, None, 'recurrent' or 'sequential', got {mode!r}."
                )
            mode = named[mode.lower()]
        elif mode is not None and not isinstance(mode, bool):
            raise TypeError(
                f"set_recurrent_mode: mode must be a bool, None, 'recurrent' or 'sequential', "
                f"got {type(mode).__name__}."
            )
        self.mode = mode
        self._prev: bool | None = None  # the traced entry's (Dynamo cannot trace a ContextVar)

    def clone(self) -> set_recurrent_mode:
        return type(self)(self.mode)

    def __enter__(self) -> None:
        prev = _STATE.get()
        _STATE.set(self.mode)
        if torch.compiler.is_compiling():
            self._prev = prev
            return
        trl = _torchrl_rnn()
        torchrl_ctx = None if trl is None else trl.set_recurrent_mode(self.mode)
        if torchrl_ctx is not None:
            torchrl_ctx.__enter__()
        _ENTRIES.set((*_ENTRIES.get(), (prev, _MIRRORED.set(trl is not None), torchrl_ctx)))

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        if torch.compiler.is_compiling():
            _STATE.set(self._prev)
            return
        *outer, (prev, mirrored_token, torchrl_ctx) = _ENTRIES.get()
        _ENTRIES.set(tuple(outer))
        if torchrl_ctx is not None:
            torchrl_ctx.__exit__(exc_type, exc_value, traceback)
        _MIRRORED.reset(mirrored_token)
        _STATE.set(prev)


_torchrl_loaded()  # TorchRL imported first: its flag is mirrored from here on, in every thread
