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
from ..functional._core import multi_layer_step as reference_step
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

STEP_BACKENDS = ("auto", "reference", "pad", "triton")

__all__ = ["available_backends", "resolve_backend", "resolve_step", "BACKENDS", "STEP_BACKENDS"]


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


def inside_grad_transform() -> bool:
    """True when called under ``torch.func.grad`` / ``vjp`` / ``jvp`` / ``jacrev`` (functorch's autodiff transforms)."""
    stack = torch._C._functorch.get_interpreter_stack() or ()
    kinds = (torch._C._functorch.TransformType.Grad, torch._C._functorch.TransformType.Jvp)
    return any(i.key() in kinds for i in stack)


def _eager_fastest(layout: Layout, x: torch.Tensor, opts: SequenceOptions, is_init: torch.Tensor | None) -> str:
    """The fastest exact eager backend able to serve the call.

    Measured in ``benchmarks/bench_cpu_backends.py`` (CPU, B=32, T=64, H=128): ``pad`` is
    one fused kernel call and 3x faster than ``reference`` without interior resets; with
    interior resets its packed-sequence path is 2-4x slower than ``reference`` in
    forward+backward. ``pad`` cannot serve ``recompute="full"``.
    """
    if opts.recompute == "full":
        return "reference"
    if is_init is not None and bool(is_init[:, 1:].any()):
        return "reference"
    return "pad"


def _auto(
    layout: Layout, x: torch.Tensor, opts: SequenceOptions, is_init, compiling: bool, vmapped: bool, differentiated: bool
) -> str:
    """What ``auto`` picks: the fused ``triton`` kernels on CUDA where they serve the call
    (they compile whole and vmap in one launch); else ``scan`` under ``torch.compile``,
    ``reference`` under eager ``torch.func`` transforms (eager scan re-traces its step on
    every call, and cannot run under ``grad``), and the fastest eager path otherwise."""
    if x.is_cuda and not differentiated and triton_backend is not None and triton_backend.serves(layout, x.device, opts):
        return "triton"
    if compiling:
        return "scan"
    if vmapped or differentiated:  # reference's checkpointing cannot cross vmap; scan's recompute can
        return "scan" if opts.recompute == "full" and not differentiated else "reference"
    return _eager_fastest(layout, x, opts, is_init)


def resolve_backend(
    name: str, layout: Layout, x: torch.Tensor, opts: SequenceOptions, is_init: torch.Tensor | None = None
) -> Callable:
    """The ``sequence`` implementation serving ``name`` for this call.

    ``auto``: see :func:`_auto`. ``pad`` runs ATen's kernels eagerly and computes the same result through
    ``scan`` under ``torch.compile`` and ``reference`` under eager ``torch.func`` transforms,
    where those kernels cannot run (no vmap batching rule, data-dependent splits).
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
    compiling = torch.compiler.is_compiling()  # checked first: dynamo cannot trace inside_vmap()
    vmapped = not compiling and inside_vmap()
    differentiated = not compiling and inside_grad_transform()
    if name == "auto":
        name = _auto(layout, x, opts, is_init, compiling, vmapped, differentiated)
    elif name in _EAGER_ONLY and (compiling or vmapped or differentiated):
        # ATen's kernels have no vmap rule nor functorch autograd, and split on host-side counts
        name = "scan" if compiling else "reference"
    if name == "scan" and differentiated:
        raise ValueError(
            "backend 'scan' cannot run under an eager torch.func transform (grad, vjp, jvp, jacrev): torch's "
            "scan compiles its step on every eager call and dynamo cannot trace functorch's grad-tracking "
            "tensors. Use backend 'reference' or 'auto' (which picks it there)."
        )
    if name == "triton":
        if not _triton_available(x.device):
            raise ValueError(
                f"backend 'triton' is not available on {x.device} here (needs the triton package and a "
                f"CUDA device, or TRITON_INTERPRET=1 on CPU); use one of {available_backends(x.device)}."
            )
        triton_backend.check_supported(layout, opts)
        return triton_backend.sequence
    if name == "reference" and opts.recompute == "full":
        if vmapped or differentiated:
            raise ValueError(
                "backend 'reference' cannot serve recompute='full' under an eager torch.func transform: its "
                "activation checkpointing replays the forward outside torch.vmap and relies on saved-tensor hooks, "
                "which torch.func.grad/vjp refuse. Under torch.vmap use backend 'scan' (or 'auto'); under "
                "torch.func.grad use recompute='none' or run under torch.compile."
            )
        return checkpointed(reference.sequence)
    return _SEQUENCE[name]  # scan serves recompute="full" itself


def resolve_step(name: str, layout: Layout, x: torch.Tensor) -> Callable:
    """The one-step function ``(cell, layout, params, x [N, F], carry) -> (y, carry)`` for ``name``.

    ``auto``: the fused ``triton`` step on CUDA where it serves the params; ATen's fused
    cells (``pad``) in plain eager mode without projection; else ``reference``.
    ``pad`` is eager-only like its sequence path and runs ``reference`` under
    ``torch.compile`` / ``torch.func`` transforms; it has no projection, so with
    ``proj_size`` it runs ``reference`` too.
    """
    if name not in STEP_BACKENDS:
        raise ValueError(f"backend: expected one of {list(STEP_BACKENDS)} for a step, got {name!r}.")
    if name == "auto":
        name = "triton" if x.is_cuda and triton_backend is not None and triton_backend.serves(layout, x.device) else "pad"
    if name == "pad":
        traced = torch.compiler.is_compiling() or inside_vmap() or inside_grad_transform()
        return reference_step if traced or layout.proj_size else pad.step
    if name == "triton":
        resolve_backend("triton", layout, x, SequenceOptions())  # raises when triton cannot serve it
        return triton_backend.step
    return reference_step
