"""Which backend serves a call: ``auto``'s rule, the eager-only routing, and the cell's hooks.

A backend that cannot serve the cell or an option raises ``ValueError`` naming itself,
what it cannot serve and the backends that can; ``auto`` only picks a backend that serves
the call (the cell's hooks, the context from :func:`~.options.call_context`, device, options).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..backends import SEQUENCE, SequenceOptions, available_backends, checkpointed, pad, triton_backend
from ..cells import Layout, multi_layer_step
from .options import CallContext, call_context, check_options

STEP_BACKENDS = ("auto", "reference", "pad", "triton")
_RECOMPUTE = ("reference", "scan", "triton")  # backends that serve recompute="full"

__all__ = ["resolve_backend", "resolve_step", "STEP_BACKENDS"]


def _eager_fastest(layout: Layout, opts: SequenceOptions, is_init: torch.Tensor | None) -> str:
    """The fastest exact eager backend able to serve the call.

    Measured in ``benchmarks/bench_cpu_backends.py`` (CPU, B=32, T=64, H=128): ``pad`` is
    one fused kernel call and 3x faster than ``reference`` without interior resets; with
    interior resets its packed-sequence path is 2-4x slower than ``reference`` in
    forward+backward. ``pad`` cannot serve ``recompute="full"``, nor cells without ATen kernels.
    """
    if opts.recompute == "full" or layout.cell.aten is None:
        return "reference"
    if is_init is not None and bool(is_init[:, 1:].any()):
        return "reference"
    return "pad"


def _auto(layout: Layout, x: torch.Tensor, opts: SequenceOptions, is_init, ctx: CallContext) -> str:
    """What ``auto`` picks: the fused ``triton`` kernels on CUDA where they serve the call
    (they compile whole and vmap in one launch); else ``scan`` under ``torch.compile``,
    ``reference`` under eager ``torch.func`` transforms (eager scan re-traces its step on
    every call, and cannot run under ``grad``), and the fastest eager path otherwise."""
    if x.is_cuda and not ctx.differentiated and triton_backend.serves(layout, x.device, opts):
        return "triton"
    if ctx.compiling:
        return "scan"
    if ctx.vmapped or ctx.differentiated:  # reference's checkpointing cannot cross vmap; scan's recompute can
        return "scan" if opts.recompute == "full" and not ctx.differentiated else "reference"
    return _eager_fastest(layout, opts, is_init)


def resolve_backend(
    name: str, layout: Layout, x: torch.Tensor, opts: SequenceOptions, is_init: torch.Tensor | None = None
) -> Callable:
    """The ``sequence`` implementation serving ``name`` for this call.

    ``auto``: see :func:`_auto`. ``pad`` runs ATen's kernels eagerly and computes the same result through
    ``scan`` under ``torch.compile`` and ``reference`` under eager ``torch.func`` transforms,
    where those kernels cannot run (no vmap batching rule, data-dependent splits).
    """
    check_options(backend=name)
    ctx = call_context()
    if name == "auto":
        name = _auto(layout, x, opts, is_init, ctx)
    elif name == "pad":
        pad.aten_kernels(layout)  # raises for a cell without ATen kernels, in every context
        if ctx.traced:  # ATen's kernels have no vmap rule nor functorch autograd, and split on host-side counts
            name = "scan" if ctx.compiling else "reference"
    if name == "scan" and ctx.differentiated:
        raise ValueError(
            "backend 'scan' cannot run under an eager torch.func transform (grad, vjp, jvp, jacrev): torch's "
            "scan compiles its step on every eager call and dynamo cannot trace functorch's grad-tracking "
            "tensors. Use backend 'reference' or 'auto' (which picks it there)."
        )
    if name == "triton":
        triton_backend.kernel_family(layout)  # the cell's error comes first: no device would serve it
        if not triton_backend.is_available(x.device):
            raise ValueError(
                f"backend 'triton' is not available on {x.device} here (needs the triton package and a "
                f"CUDA device, or TRITON_INTERPRET=1 on CPU); use one of {available_backends(x.device)}."
            )
        triton_backend.check_supported(layout, opts)
        return triton_backend.sequence
    if name == "reference" and opts.recompute == "full":
        if ctx.vmapped or ctx.differentiated:
            raise ValueError(
                "backend 'reference' cannot serve recompute='full' under an eager torch.func transform: its "
                "activation checkpointing replays the forward outside torch.vmap and relies on saved-tensor hooks, "
                "which torch.func.grad/vjp refuse. Under torch.vmap use backend 'scan' (or 'auto'); under "
                "torch.func.grad use recompute='none' or run under torch.compile."
            )
        return checkpointed(SEQUENCE["reference"])
    return SEQUENCE[name]  # scan serves recompute="full" itself


def resolve_step(name: str, layout: Layout, x: torch.Tensor) -> Callable:
    """The one-step function ``(layout, params, x [N, F], carry) -> (y, carry)`` for ``name``.

    ``auto``: the fused ``triton`` step on CUDA where it serves the params; ATen's fused
    cells (``pad``) in plain eager mode without projection; else ``reference``.
    ``pad`` is eager-only like its sequence path and runs ``reference`` under
    ``torch.compile`` / ``torch.func`` transforms; it has no projection, so with
    ``proj_size`` it runs ``reference`` too.
    """
    if name not in STEP_BACKENDS:
        raise ValueError(f"backend: expected one of {list(STEP_BACKENDS)} for a step, got {name!r}.")
    if name == "auto":
        if x.is_cuda and triton_backend.serves(layout, x.device):
            name = "triton"
        else:
            name = "reference" if layout.cell.aten is None else "pad"
    if name == "pad":
        pad.aten_kernels(layout)
        return multi_layer_step if call_context().traced or layout.proj_size else pad.step
    if name == "triton":
        resolve_backend("triton", layout, x, SequenceOptions())  # raises when triton cannot serve it
        return triton_backend.step
    return multi_layer_step
