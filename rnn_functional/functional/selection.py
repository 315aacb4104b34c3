"""Which route serves a call: the options checked, the call's context read once, ``auto``'s rule, and the eager
layout of a call's segments.

A backend that cannot serve the cell or an option raises ``ValueError`` naming itself,
what it cannot serve and the backends that can; ``auto`` only picks a backend that serves
the call (the cell's hooks, the context from :func:`call_context`, device, options).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from ..backends import (BACKENDS, LAYOUTS_OF, RECOMPUTE_MODES, SEGMENT_LAYOUTS, Route, SegmentPlan, SequenceOptions,
                        available_backends, pad, parallel, triton_backend)
from ..backends.base import backends_for, forward_mode, no_kernel_for, transforms
from ..cells import Layout, multi_layer_step
from ..precision import check_mode

STEP_BACKENDS = ("auto", "reference", "pad", "triton", "parallel")

__all__ = ["BACKEND_CHOICES", "CallContext", "STEP_BACKENDS", "call_context", "check_options", "choose", "reads_segments",
           "resolve_step"]

BACKEND_CHOICES = ("auto", *BACKENDS)
_RECOMPUTE_BACKENDS = ("reference", "scan", "triton")


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
    ``reference``'s checkpointing cannot run, nor ``triton`` under its autodiff (:func:`choose`)."""
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
    reverse scan ("UncapturedHigherOrderOpError ... _LazyGraphModule._lazy_forward"), so :func:`choose`
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




def _route(backend: str, layout: Layout, plan: SegmentPlan | None, records_grad: bool, forced: str,
           cuda: bool) -> Route:
    """``backend``'s route for an eager call with the segments ``plan`` (``None``: no interior reset), laid out as
    ``forced`` (``segment_layout``) or by the rule: ``pad`` runs whole slices as a view of the call, else (one layer
    under autograd, a kernel fused on the CPU: oneDNN's LSTM) length buckets, whose unpacked calls keep the fused
    kernel and a backward linear in the steps, else one packed call (one cuDNN call on CUDA); the loops run the
    right-aligned segments where they at least halve the steps, else the rows as they are."""
    if plan is None:
        return Route(backend)
    if forced == "auto":
        if backend != "pad":
            forced = "aligned" if 2 * plan.max_len <= plan.shape[1] else "rows"
        elif plan.slice_len is not None:
            forced = "slices"
        else:
            fused = layout.cell.aten.fused_on_cpu and not cuda
            forced = "buckets" if records_grad and layout.num_layers == 1 and fused else "packed"
    why = {"buckets": f"it serves one layer (these params have {layout.num_layers})",
           "slices": "this batch is not whole slices of one length from t = 0 (SliceSampler(strict_length=True))",
           "aligned": f"the {layout.cell.title} reads where segments start, and right-aligned, a segment that "
                      f"continues the incoming state would start with a reset"}
    serves = {"buckets": layout.num_layers == 1, "slices": plan.slice_len is not None,
              "aligned": not layout.cell.reads_starts}
    if forced not in LAYOUTS_OF[backend] or not serves.get(forced, True):
        layouts = [name for name in LAYOUTS_OF[backend] if serves.get(name, True)]
        raise ValueError(f"segment_layout={forced!r} cannot serve this call on backend {backend!r}: "
                         f"{why.get(forced, '')}. Use one of {layouts} or segment_layout='auto'.")
    return Route(backend, forced, plan)


def _check_triton(layout: Layout, x: torch.Tensor, opts: SequenceOptions, step: bool = False) -> None:
    """Raise unless ``triton`` has kernels for the cell (checked first: no device would serve it), runs on ``x``'s
    device, the call is not differentiated in forward mode (its kernels have a reverse-mode backward
    only: tangents would be dropped) and the kernels serve the params and ``opts`` (proj_size, dtype).
    ``step``: the call is a step function's (the errors name the step backends)."""
    triton_backend.kernel_family(layout)

    def serving() -> list[str]:  # for the errors only: not on the call's path
        if step:
            return _step_backends(layout, x)
        names = available_backends(x.device, layout.cell)
        return names if opts.recompute == "none" else [b for b in names if b in recompute_backends(call_context())]

    kinds = () if torch.compiler.is_compiling() else transforms()
    if forward_mode(kinds):
        raise ValueError(
            "backend 'triton' cannot serve forward-mode AD (torch.func.jvp/jacfwd/hessian, dual tensors): its fused "
            f"kernels have a reverse-mode backward only. Use one of {[b for b in serving() if b != 'triton']} (exact "
            "to every order), or 'auto', which picks one of them there."
        )
    if GRAD in kinds:  # torch's wrapper of a registered autograd formula lacks functorch's setup_context
        raise ValueError(
            "backend 'triton' cannot serve torch.func's reverse-mode transforms (grad, vjp, jacrev): torch's autograd "
            "wrapper of its kernels' custom op has no setup_context, which they require (pytorch/pytorch#170834). "
            f"Use one of {[b for b in serving() if b != 'triton']}, or 'auto', which picks one of them there; or "
            "differentiate with .backward() / torch.autograd.grad, which triton serves (over torch.vmap too)."
        )
    if not triton_backend.is_available(x.device):
        raise ValueError(
            f"backend 'triton' is not available on {x.device} here (needs the triton package and a "
            f"CUDA device, or TRITON_INTERPRET=1 on CPU); use one of {serving()}."
        )
    triton_backend.check_supported(layout, opts)


def _aten_serves(layout: Layout, opts: SequenceOptions) -> bool:
    """ATen's fused kernels (``pad``) can run the call eagerly: the cell has them and nothing is recomputed."""
    return opts.recompute == "none" and layout.cell.aten is not None


def _auto_runs_triton(layout: Layout, x: torch.Tensor, opts: SequenceOptions, ctx: CallContext) -> bool:
    """``auto`` runs ``triton`` on CUDA where it serves the call under ``torch.compile`` or ``torch.vmap`` (it compiles
    whole and vmaps in one launch), but not in plain eager mode where cuDNN (``pad``) serves it faster (docs/gpu.md)."""
    if not x.is_cuda or ctx.differentiated:
        return False
    cudnn = not ctx.traced and _aten_serves(layout, opts)
    return not cudnn and triton_backend.serves(layout, x.device, opts)


def reads_segments(name: str, layout: Layout, x: torch.Tensor, opts: SequenceOptions, ctx: CallContext,
                   segment_layout: str = "auto") -> bool:
    """Whether an eager call with ``is_init`` must read it on the host to choose its route (:func:`choose`'s
    ``plan``): ``pad`` and ``auto`` do, and a forced ``segment_layout``; but not ``auto`` where it runs ``triton`` or
    ``parallel`` (a cell linear in its state), nor ``reference``, ``scan``, ``triton`` and ``parallel``, which
    apply every reset on the device."""
    if segment_layout != "auto":
        return True
    if name == "auto":
        return not (layout.cell.linear_in_state or _auto_runs_triton(layout, x, opts, ctx))
    return name == "pad"


def _backward_compiled() -> bool:
    """Under ``torch.compile``: grad mode is on and compiled autograd will trace the backward, which cannot hold a
    ``scan`` (:func:`compiled_autograd`). Grad mode, not ``records_grad``: a vmapped tensor reports
    ``requires_grad=False`` whatever its base."""
    return torch.is_grad_enabled() and compiled_autograd()


def _compiled() -> Route:
    """The route of ``auto`` and ``pad`` under ``torch.compile``: ``scan``, or ``reference``'s loop (unrolled in the
    graph, as torch's decomposition of ``nn.LSTM`` unrolls its loop) where compiled autograd traces the backward."""
    return Route("reference" if _backward_compiled() else "scan")


def choose(name: str, layout: Layout, x: torch.Tensor, opts: SequenceOptions, plan: SegmentPlan | None,
           records_grad: bool, ctx: CallContext, segment_layout: str = "auto") -> Route:
    """The route serving backend ``name`` for this call.

    ``plan``: the call's segments where the caller read ``is_init`` on the host and found interior
    resets (eager ``pad``/``auto``, or a forced ``segment_layout``), else ``None``; ``records_grad``:
    autograd records the call. ``auto``: ``parallel`` for a cell linear in its state, in every context (``scan``
    for ``recompute="full"`` under eager ``torch.func`` transforms); for the others ``triton`` on CUDA where it serves the call (it compiles whole
    and vmaps in one launch); ``scan`` under ``torch.compile`` (``reference`` where compiled autograd traces the
    backward: :func:`_compiled`); under eager ``torch.func`` transforms
    ``reference`` (``scan`` for ``recompute="full"``: reference's checkpointing cannot cross them); in
    plain eager mode ``pad`` for a cell with ATen kernels and ``recompute="none"`` (but for a call under autograd
    of a cell whose kernel is not fused on the CPU, the GRU, whose segments do not halve the steps), else ``scan``
    where autograd records the call and ``reference`` where not, each laid out by :func:`_route`.
    ``pad`` runs ATen's kernels eagerly (laid out by :func:`_route`), and computes the same result through
    ``auto``'s route under ``torch.compile`` and ``reference`` under eager ``torch.func`` transforms, where those
    kernels cannot run (no vmap batching rule, data-dependent splits).
    """
    if name == "auto" and layout.cell.linear_in_state:  # fastest in every context measured (docs/linear_recurrences.md)
        name = "scan" if opts.recompute == "full" and ctx.traced and not ctx.compiling else "parallel"
    if name == "auto":
        if _auto_runs_triton(layout, x, opts, ctx):
            return Route("triton")
        if ctx.compiling:
            return _compiled()
        if not ctx.traced:
            loop = "scan" if records_grad else "reference"  # scan keeps the activations its backward reads
            pad_serves = _aten_serves(layout, opts) and not (
                # ATen's GRU on the CPU is a loop of per-step ops: under autograd, where the segments barely shorten
                # the time, the scan loop over the rows does the same steps without re-batching them
                records_grad and plan is not None and plan.slice_len is None and not x.is_cuda
                and not layout.cell.aten.fused_on_cpu and 2 * plan.max_len > plan.shape[1])
            return _route("pad" if pad_serves else loop, layout, plan, records_grad, "auto", x.is_cuda)
        name = "scan" if opts.recompute == "full" else "reference"  # scan's recompute crosses vmap and grad
    elif name == "pad":
        pad.aten_kernels(layout)  # raises for a cell without ATen kernels, in every context
        if ctx.traced:
            return _compiled() if ctx.compiling else Route("reference")
        return _route("pad", layout, plan, records_grad, segment_layout, x.is_cuda)
    if name == "triton":
        _check_triton(layout, x, opts)
        return Route("triton")
    if name == "scan" and ctx.compiling and _backward_compiled():
        raise ValueError(
            "backend 'scan' cannot serve torch's compiled autograd (torch._dynamo.config.compiled_autograd): it cannot "
            "trace a scan in the backward graph. Use backend 'reference' or 'auto' (which runs reference's loop there), "
            "or differentiate without compiled autograd."
        )
    if name == "parallel":
        parallel.check_cell(layout.cell)
    if name in ("reference", "parallel") and opts.recompute == "full" and ctx.traced and not ctx.compiling:
        raise ValueError(
            f"backend {name!r} cannot serve recompute='full' under an eager torch.func transform or forward-mode "
            "AD (dual tensors): its activation checkpointing replays the forward outside the transform and relies "
            "on saved-tensor hooks, which torch.func.grad/vjp refuse. Use backend 'scan' (or 'auto'), which "
            "recomputes inside its own backward, or recompute='none', or run under torch.compile."
        )
    return Route(name) if plan is None else _route(name, layout, plan, records_grad, segment_layout, x.is_cuda)


def resolve_step(name: str, layout: Layout, x: torch.Tensor, ctx: CallContext):
    """The one-step function ``(layout, params, x [N, F], carry) -> (y, carry)`` for ``name``.

    ``auto``: ATen's fused cells (``pad``, cuDNN's on CUDA) in plain eager mode without projection; else the fused
    ``triton`` step on CUDA where it serves the params (where both serve, ATen's eager step is the faster one,
    docs/gpu.md); else ``reference``.
    ``pad`` is eager-only like its sequence path and runs ``reference`` under
    ``torch.compile`` / ``torch.func`` transforms; it has no projection, so with
    ``proj_size`` it runs ``reference`` too.
    """
    if name in ("pad", "triton", "parallel") and name not in backends_for(layout.cell):
        raise no_kernel_for(name, layout.cell, _step_backends(layout, x))
    if name == "auto":
        if x.is_cuda:
            aten = not ctx.traced and layout.cell.aten is not None and not layout.proj_size
            if not aten and not ctx.differentiated and triton_backend.serves(layout, x.device):
                return triton_backend.step
        if layout.cell.aten is None:
            return multi_layer_step
        name = "pad"
    if name == "pad":  # traced (compile, vmap, torch.func): pad's kernels cannot run, its reference step can
        return multi_layer_step if layout.proj_size or ctx.traced else pad.step
    if name == "triton":
        _check_triton(layout, x, SequenceOptions(), step=True)
        return triton_backend.step
    if name not in ("reference", "parallel"):  # one step of a linear recurrence is the reference step
        raise ValueError(
            f"backend: expected one of {['auto', *_step_backends(layout, x)]} for a {layout.cell.title} step here, "
            f"got {name!r}."
        )
    return multi_layer_step


def _step_backends(layout: Layout, x: torch.Tensor) -> list[str]:
    """The step backends that serve ``layout``'s cell on ``x``'s device here (``scan`` runs sequences only)."""
    return [b for b in STEP_BACKENDS[1:] if b in available_backends(x.device, layout.cell)]
