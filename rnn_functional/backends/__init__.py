"""Sequence backends and their selection.

Every backend implements ``sequence(cell, layout, params, x, carry, is_init, reset,
opts) -> (y, carry)`` on the canonical, flattened call described in
:mod:`rnn_functional.functional._core`, and computes exactly what ``reference`` does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._layout import Layout
from ..functional._core import SequenceOptions
from . import pad, reference, scan
from .recompute import checkpointed

try:  # the package imports without triton installed; is_available() says whether it can run
    from . import triton as triton_backend
except ImportError:  # pragma: no cover - only when the triton subpackage itself is broken
    triton_backend = None

_SEQUENCE = {"reference": reference.sequence, "scan": scan.sequence, "pad": pad.sequence}

BACKENDS = ("reference", "scan", "pad", "triton")
_EAGER_ONLY = ("pad",)  # ATen kernels: data-dependent splits, no vmap batching rule
_RECOMPUTE = ("reference", "scan", "triton")  # backends that serve recompute="full"

__all__ = ["available_backends", "resolve_backend", "BACKENDS"]


def _triton_available(device: torch.device | None) -> bool:
    return triton_backend is not None and triton_backend.is_available(device)


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


def _eager_fastest(layout: Layout, x: torch.Tensor, opts: SequenceOptions) -> str:
    """The fastest exact eager backend able to serve ``opts``.

    Measured in ``benchmarks/bench_cpu_backends.py``: ``pad`` is fastest on CPU;
    with ``recompute="full"`` (which ``pad`` cannot serve) the eager loop ``reference``
    beats eager ``scan``, whose per-call compile overhead dominates.
    """
    return "reference" if opts.recompute == "full" else "pad"


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
    if name == "pad" and opts.recompute == "full":
        raise ValueError(
            "backend 'pad' cannot serve recompute='full': the cuDNN/oneDNN kernels keep their own "
            f"activations. Use one of {list(_RECOMPUTE)} (or backend='auto'), or recompute='none'."
        )
    traced = torch.compiler.is_compiling() or inside_vmap()
    if name == "auto":
        name = "scan" if traced else _eager_fastest(layout, x, opts)
    elif name in _EAGER_ONLY and traced:
        name = "scan"
    if name == "triton":
        if not _triton_available(x.device):
            raise ValueError(
                f"backend 'triton' is not available on {x.device} here (needs the triton package and a "
                f"CUDA device, or TRITON_INTERPRET=1 on CPU); use one of {available_backends(x.device)}."
            )
        triton_backend.check_supported(layout, opts)
        return triton_backend.sequence
    if name == "reference" and opts.recompute == "full":
        return checkpointed(reference.sequence)
    return _SEQUENCE[name]  # scan serves recompute="full" itself
