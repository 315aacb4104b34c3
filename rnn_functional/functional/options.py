"""Option validation and call-context detection: the one place both live.

The functional API and the modules call :func:`check_options` for every backend/option
combination, and :func:`call_context` for whether a call is being compiled, vmapped or
differentiated by ``torch.func``.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from ..backends import BACKENDS, LAYOUTS_OF, RECOMPUTE_MODES, SEGMENT_LAYOUTS
from ..precision import check_mode

BACKEND_CHOICES = ("auto", *BACKENDS)
_RECOMPUTE_BACKENDS = ("reference", "scan", "triton")

__all__ = ["BACKEND_CHOICES", "RECOMPUTE_MODES", "CallContext", "call_context", "check_options", "compiled_autograd",
           "recompute_backends"]


@dataclass(frozen=True)
class CallContext:
    """Where a call runs: under ``torch.compile``, ``torch.vmap``, an eager ``torch.func`` autodiff (or forward-mode
    AD with dual tensors); ``traced`` when any of the three holds (eager-only kernels cannot run)."""

    compiling: bool  # torch.compile, or torch.jit.trace: a graph is captured
    vmapped: bool
    differentiated: bool
    traced: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "traced", self.compiling or self.vmapped or self.differentiated)


def recompute_backends(ctx: CallContext) -> list[str]:
    """The backends that serve ``recompute`` in ``ctx`` (for the errors only): under an eager ``torch.func`` transform
    ``reference``'s checkpointing cannot run, nor ``triton`` under its autodiff (:func:`..selection.choose`)."""
    if not (ctx.vmapped or ctx.differentiated):
        return list(_RECOMPUTE_BACKENDS)
    return ["scan"] if ctx.differentiated else ["scan", "triton"]


# every context is one of these: a call builds none (a policy step reads its context on every call)
_CONTEXTS = {(c, v, d): CallContext(c, v, d) for c in (False, True) for v in (False, True)
             for d in (False, True)}
VMAP, GRAD, JVP = (torch._C._functorch.TransformType.Vmap, torch._C._functorch.TransformType.Grad,
                   torch._C._functorch.TransformType.Jvp)


def call_context() -> CallContext:
    """The context of the current call, read once per call: ``is_compiling`` first (Dynamo cannot trace the rest),
    then functorch's transform stack and the forward-mode AD level. ``torch.jit.trace`` (and the TorchScript ONNX
    exporter) captures a graph as Dynamo does: a call must not steer by its data there."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return _CONTEXTS[True, False, False]
    stack = torch._C._functorch.get_interpreter_stack()
    forward = torch.autograd.forward_ad._current_level >= 0  # dual tensors (torch 2.13 has no public accessor)
    if not stack:
        return _CONTEXTS[False, False, forward]
    kinds = {interpreter.key() for interpreter in stack}
    return _CONTEXTS[False, VMAP in kinds, forward or GRAD in kinds or JVP in kinds]


def compiled_autograd() -> bool:
    """Whether torch's compiled autograd will trace the backward of the call being compiled (read under
    ``torch.compile`` only): ``torch._dynamo.config.compiled_autograd`` was set before ``torch.compile``, or its
    context is entered. It cannot trace a ``scan`` in a backward graph, torch's own autograd of ``scan`` nor our
    reverse scan ("UncapturedHigherOrderOpError ... _LazyGraphModule._lazy_forward"), so :func:`.selection.choose`
    runs ``reference``'s loop there."""
    return torch._dynamo.compiled_autograd.compiled_autograd_enabled


def check_options(
    *,
    backend: str = "auto",
    recompute: str = "none",
    dropout: float = 0.0,
    matmul_precision: str | None = None,
    compute_dtype: torch.dtype | None = None,
    segment_layout: str = "auto",
    owner: str = "",
) -> None:
    """Raise a clear error for an option value, or a combination, that no call could serve.

    ``owner`` prefixes the message (a module name, e.g. ``"LSTMModule: "``) and switches the
    argument names to the modules' ``recurrent_*`` spelling. Without ``owner`` (the functions),
    a missing triton package is reported when the call runs, as for any unavailable backend.
    """
    pre = "recurrent_" if owner else ""
    if backend not in BACKEND_CHOICES:
        if not owner:
            raise ValueError(f"backend: unknown backend {backend!r}; expected one of {list(BACKEND_CHOICES)}.")
        raise ValueError(f"{owner}{pre}backend must be one of {list(BACKEND_CHOICES)}, got {backend!r}.")
    if owner and backend == "triton" and importlib.util.find_spec("triton") is None:
        raise RuntimeError(
            f"{owner}{pre}backend='triton' requires the triton package (pip install triton); "
            f"or pick one of {[b for b in BACKEND_CHOICES if b != 'triton']}."
        )
    if recompute not in RECOMPUTE_MODES:
        if not owner:
            raise ValueError(f"recompute: expected one of {list(RECOMPUTE_MODES)}, got {recompute!r}.")
        raise ValueError(f"{owner}{pre}recompute must be one of {list(RECOMPUTE_MODES)}, got {recompute!r}.")
    if recompute != "none" and backend == "pad":
        if not owner:
            raise ValueError(
                f"backend 'pad' cannot serve recompute={recompute!r}: the cuDNN/oneDNN kernels keep their own "
                f"activations. Use one of {recompute_backends(call_context())} (or backend='auto'), or recompute='none'."
            )
        raise ValueError(
            f"{owner}{pre}recompute={recompute!r} cannot be served by {pre}backend='pad' (the ATen/cuDNN "
            f"kernels keep their own activations). Use one of {recompute_backends(call_context())} or 'auto' (which "
            f"picks one that can), or {pre}recompute='none'."
        )
    if not isinstance(dropout, (int, float)) or not 0.0 <= float(dropout) < 1.0:
        raise ValueError(f"{owner}dropout: expected a probability in [0, 1), got {dropout!r}.")
    if compute_dtype is not None and (not isinstance(compute_dtype, torch.dtype) or not compute_dtype.is_floating_point):
        raise TypeError(
            f"{owner}{pre}compute_dtype must be None (the params' dtype) or a floating torch.dtype "
            f"(torch.float32 or torch.bfloat16), got {compute_dtype!r}."
        )
    if matmul_precision is not None:
        check_mode(matmul_precision, f"{owner}{pre}matmul_precision")
    if segment_layout != "auto":
        serving = LAYOUTS_OF.get(backend, ())  # auto: none to force
        if segment_layout not in SEGMENT_LAYOUTS:
            raise ValueError(f"segment_layout: expected 'auto' or one of {list(SEGMENT_LAYOUTS)}, got {segment_layout!r}.")
        if segment_layout not in serving:
            raise ValueError(
                f"segment_layout={segment_layout!r} is not a layout of backend {backend!r}: "
                + (f"it lays out calls as one of {list(serving)}." if serving else
                   "with backend='auto' the layout follows auto's rule; name a backend to force one.")
            )
