"""Sequence backends and their selection.

Every backend implements ``sequence(cell, layout, params, x, carry, is_init, reset,
opts) -> (y, carry)`` on the canonical, flattened call described in
:mod:`rnn_functional.functional._core`, and computes exactly what ``reference`` does.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from .._layout import Layout
from ..functional._core import SequenceOptions

BACKENDS = ("reference", "scan", "pad", "triton")
_EAGER_ONLY = ("pad",)  # ATen kernels: data-dependent splits, no vmap batching rule

__all__ = ["available_backends", "resolve_backend", "BACKENDS"]


def _triton_available(device: torch.device | None) -> bool:
    try:
        from . import triton as triton_backend
    except ImportError:
        return False
    return triton_backend.is_available(device)


def available_backends(device: torch.device | str | None = None) -> list[str]:
    """Backends that can run on ``device`` (default: CPU) in this environment."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    names = ["reference", "scan", "pad"]
    if _triton_available(device):
        names.append("triton")
    return names


def inside_vmap() -> bool:
    """True when called under ``torch.vmap`` (at any depth of functorch transforms)."""
    stack = torch._C._functorch.get_interpreter_stack() or ()
    return any(i.key() == torch._C._functorch.TransformType.Vmap for i in stack)


def _eager_fastest(layout: Layout, x: torch.Tensor) -> str:
    """The fastest exact eager backend, measured in ``benchmarks/bench_cpu_backends.py``."""
    return "pad"


def _module(name: str):
    return importlib.import_module(f".{name}", __name__)


def resolve_backend(name: str, layout: Layout, x: torch.Tensor, opts: SequenceOptions) -> Callable:
    """The ``sequence`` implementation serving ``name`` for this call.

    ``auto``: ``scan`` under ``torch.compile`` or ``torch.vmap``, otherwise the fastest
    eager path. ``pad`` runs ATen's kernels eagerly and computes the same result through
    ``scan`` under ``torch.compile`` / ``torch.vmap``, where those kernels cannot run.
    """
    if name not in BACKENDS + ("auto",):
        raise ValueError(
            f"backend: unknown backend {name!r}; expected one of {['auto', *BACKENDS]}."
        )
    traced = torch.compiler.is_compiling() or inside_vmap()
    if name == "auto":
        name = "scan" if traced else _eager_fastest(layout, x)
    elif name in _EAGER_ONLY and traced:
        name = "scan"
    if name == "triton":
        if not _triton_available(x.device):
            raise ValueError(
                f"backend 'triton' is not available on {x.device} here (needs the triton package and a "
                f"CUDA device, or TRITON_INTERPRET=1 on CPU); use one of {available_backends(x.device)}."
            )
        _module("triton").check_supported(layout, opts)
    return _module(name).sequence
