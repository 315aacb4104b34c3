"""The recurrent-mode switch of the recurrent modules: recurrent (a ``[*B, T]`` batch per call) or sequential (one
step per call), set by the innermost :class:`set_recurrent_mode` (ours or TorchRL's; ours sets TorchRL's flag too, so
one context drives every module of a pipeline), else the module's ``default_recurrent_mode``.

TorchRL is never imported here (its flag is read once ``torchrl`` is in ``sys.modules``). The flag is context-local
eagerly and, under ``torch.compile`` (which cannot trace ``ContextVar.get``), a per-thread mirror that Dynamo guards
per thread; TorchRL's flag is mirrored per thread too (:func:`_watch`), as its own compile-time copy is one per
process and leaks a context into other threads.
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
    """Whether TorchRL's rnn module is imported (never imports it); caches it in ``_torchrl_module`` and, when new,
    mirrors its flag (:func:`_watch`). A constant when compiled: a guard on ``sys.modules`` would recompile on every
    import."""
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
    """Each thread's copy of the flags for compiled code, ours (``mode``) and TorchRL's (``torchrl``): Dynamo guards a
    ``threading.local`` per calling thread."""

    def __init__(self) -> None:
        self.traced: dict[str, bool | None] = {"mode": None, "torchrl": _torchrl_context(_torchrl_module)}


class _ModeState:
    """Context-local flag eagerly, mirrored in a per-thread dict entry for ``torch.compile``: Dynamo drops an
    attribute write made after a higher-order op such as ``scan`` (pytorch/pytorch#195866); dict writes are kept."""

    def __init__(self) -> None:
        self._var = contextvars.ContextVar("rnn_functional_recurrent_mode", default=None)  # bool | None
        self._mirror = _Mirror()

    def get(self) -> bool | None:
        return self._mirror.traced["mode"] if torch.compiler.is_compiling() else self._var.get()

    def set(self, mode: bool | None) -> None:
        self._mirror.traced["mode"] = mode
        if not torch.compiler.is_compiling():
            self._var.set(mode)


_STATE = _ModeState()
# whether our innermost context also set TorchRL's flag: TorchRL's flag, None included, is then the innermost's
_MIRRORED: contextvars.ContextVar[bool] = contextvars.ContextVar("rnn_functional_mode_mirrored", default=False)
# what each eager entry restores on exit, innermost last: per context, as one object may be entered twice at once
_ENTRIES: contextvars.ContextVar[tuple] = contextvars.ContextVar("rnn_functional_mode_entries", default=())


def _watch(trl) -> None:
    """Mirror TorchRL's flag in each thread's :class:`_Mirror` by wrapping its state manager's ``set_mode`` (every
    entry and exit goes through it); the calling thread's mirror starts from TorchRL's flag now."""
    manager = trl.recurrent_mode_state_manager
    set_mode = manager.set_mode
    if not getattr(set_mode, "_mirrored", False):
        def mirrored(mode: bool | None) -> None:
            set_mode(mode)
            _STATE._mirror.traced["torchrl"] = mode

        mirrored._mirrored = True
        manager.set_mode = mirrored
    _STATE._mirror.traced["torchrl"] = _torchrl_context(trl)


def recurrent_mode(default: bool | None = None) -> bool | None:
    """The recurrent mode set by the innermost active context (ours or, when loaded, TorchRL's), or ``default``
    outside any (a module passes its ``default_recurrent_mode``). Under ``torch.compile`` our flag is read first, then
    the calling thread's mirror of TorchRL's."""
    if torch.compiler.is_compiling():
        _torchrl_loaded()  # a constant of the graph: starts mirroring TorchRL's flag when it is newly loaded
        traced = _STATE._mirror.traced
        mode = traced["torchrl"] if traced["mode"] is None else traced["mode"]
    else:
        trl = sys.modules.get(_TORCHRL_RNN)
        if trl is not _torchrl_module:
            _torchrl_loaded()
        mode = None if trl is None else trl.recurrent_mode()
        if mode is None and (trl is None or not _MIRRORED.get()):
            mode = _STATE._var.get()
    return default if mode is None else mode


class set_recurrent_mode(_DecoratorContextManager):
    """Context manager / decorator switching our recurrent modules' mode.

    Args:
        mode: ``True`` or ``"recurrent"``: modules process ``[*B, T]`` batches (time the last batch dim);
            ``False`` or ``"sequential"``: one step per call; ``None``: each module's ``default_recurrent_mode``.

    Same signature and meaning as ``torchrl.modules.set_recurrent_mode``, usable without TorchRL. When TorchRL is
    loaded it sets TorchRL's flag for the same scope too, except inside compiled code, where Dynamo would drop the
    attribute write restoring it after a ``scan``: there our flag alone drives our modules.
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
            raise TypeError(f"set_recurrent_mode: mode must be a bool, None, 'recurrent' or 'sequential', "
                            f"got {type(mode).__name__}.")
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
        trl = _torchrl_module if _torchrl_loaded() else None
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
