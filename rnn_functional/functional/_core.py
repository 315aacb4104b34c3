"""The functional layer's one entry (:func:`entries`): a call is checked once (the modules, which check their own
inputs, pass ``layout``), its context read once, its batch dims flattened and its route chosen once (:func:`choose`,
``docs/backends.md``) and run. Empty calls and the segment-end states are handled here, once."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.utils._pytree as pytree

from .. import backends
from ..backends import (BACKENDS, LAYOUTS_OF, RECOMPUTE_MODES, SEGMENT_LAYOUTS, Route, SegmentPlan, SequenceOptions,
                        pad, parallel, segments, triton_backend)
from ..backends.base import CONTEXTS, CallContext, backends_for, no_kernel_for
from ..cells import CELLS, Carry, Cell, Layout, apply_reset, final_at_last_step, keep_segment_ends, multi_layer_step
from ..precision import check_mode
from . import slices

BACKEND_CHOICES = ("auto", *BACKENDS)
STEP_BACKENDS = ("auto", "reference", "pad", "triton", "parallel")
_COUNT = ("no", "one", "two", "three", "four", "five")


# ----------------------------------------------------------------------------- the call's context and options


def recompute_backends(ctx: CallContext) -> list[str]:
    """The backends that serve ``recompute`` in ``ctx``, for the errors (:func:`choose`)."""
    if not (ctx.vmapped or ctx.differentiated):
        return ["reference", "scan", "triton"]
    return ["scan"] if ctx.differentiated else ["scan", "triton"]


_VMAP, _GRAD, _JVP = (torch._C._functorch.TransformType.Vmap, torch._C._functorch.TransformType.Grad,
                      torch._C._functorch.TransformType.Jvp)


def call_context() -> CallContext:
    """The current call's context: ``is_compiling`` first (Dynamo cannot trace the rest; ``torch.jit.trace`` counts
    as compiling: no steering by data), then functorch's transform stack and the forward-mode AD level."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return CONTEXTS[True, False, False, False]
    stack = torch._C._functorch.get_interpreter_stack()
    dual = torch.autograd.forward_ad._current_level >= 0  # dual tensors (torch 2.13 has no public accessor)
    if not stack:
        return CONTEXTS[False, False, dual, dual]
    kinds = {interpreter.key() for interpreter in stack}
    forward = dual or _JVP in kinds
    return CONTEXTS[False, _VMAP in kinds, forward or _GRAD in kinds, forward]


def check_options(*, backend: str = "auto", recompute: str = "none", dropout: float = 0.0,
                  matmul_precision: str | None = None, compute_dtype: torch.dtype | None = None,
                  segment_layout: str = "auto", owner: str = "") -> None:
    """Raise a clear error for an option value, or a combination, that no call could serve. ``owner`` (a module's
    name, e.g. ``"LSTMModule: "``) prefixes the message and spells the arguments ``recurrent_*``."""
    pre = "recurrent_" if owner else ""
    if backend not in BACKEND_CHOICES:
        raise ValueError(f"{owner}{pre}backend: expected one of {list(BACKEND_CHOICES)}, got {backend!r}.")
    if owner and backend == "triton" and importlib.util.find_spec("triton") is None:
        raise RuntimeError(
            f"{owner}{pre}backend='triton' requires the triton package (pip install triton); "
            f"or pick one of {[b for b in BACKEND_CHOICES if b != 'triton']}."
        )
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"{owner}{pre}recompute: expected one of {list(RECOMPUTE_MODES)}, got {recompute!r}.")
    if recompute != "none" and backend == "pad":
        raise ValueError(
            f"{owner}{pre}backend 'pad' cannot serve {pre}recompute={recompute!r}: the cuDNN/oneDNN kernels keep their "
            f"own activations. Use one of {recompute_backends(call_context())} (or {pre}backend='auto', which picks "
            f"one that can), or {pre}recompute='none'."
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


def available_backends(device: torch.device | str | None = None, cell: str | None = None) -> list[str]:
    """The backends that can run on ``device`` (default: CPU) in this environment; with ``cell`` (a function prefix:
    ``"lstm"``, ``"gru"``, ``"min_gru"``, ...), those that serve that cell. These are the ``*_sequence`` functions'
    backends; a ``*_step`` function takes the same but ``"scan"``, which runs sequences only."""
    if cell is not None and cell not in CELLS:
        raise ValueError(f"cell: expected one of {sorted(CELLS)}, got {cell!r}.")
    return backends.available_backends(device, None if cell is None else CELLS[cell])


def read_layout(params: Mapping[str, torch.Tensor], cell: str) -> Layout:
    """The layout of ``params`` for the registered cell named ``cell`` (e.g. ``"gru"``)."""
    return CELLS[cell].read_layout(params)


# ----------------------------------------------------------------------------- validation


def _carry_error(cell: Cell, value, arg: str) -> TypeError:
    """The error for a state that is not ``cell``'s tuple of tensors (a tensor for a one-tensor state)."""
    names, got = cell.state_names, type(value).__name__
    if len(names) == 1:
        return TypeError(f"{arg}: expected a tensor {names[0]} for {cell.title}, got {got}.")
    if isinstance(value, (tuple, list)):
        wrong = [f"{n} is {type(v).__name__}" for n, v in zip(names, value) if not isinstance(v, torch.Tensor)]
        got += f" of length {len(value)}" + (f" whose {', '.join(wrong)}" if len(value) == len(names) else "")
    return TypeError(f"{arg}: expected a tuple ({', '.join(names)}) of {_COUNT[len(names)]} tensors for {cell.title}, "
                     f"got {got}." + (f" Pass {arg}=None for zeros in every entry." if arg == "state" else ""))


def autocast_dtype(layout: Layout) -> torch.dtype | None:
    """The dtype a call runs in under an active ``torch.autocast`` of its device: autocast's for LSTM/GRU params of a
    floating dtype other than fp64 (one rule for every mode, docs/migrating.md), else ``None``: the params'."""
    kind = layout.device.type
    if layout.cell.aten is None or not torch.is_autocast_enabled(kind) or not layout.dtype.is_floating_point \
            or layout.dtype == torch.float64:
        return None
    dtype = torch.get_autocast_dtype(kind)
    return None if dtype == layout.dtype else dtype


@dataclass(slots=True)
class Canonical:
    """A validated, flattened call (see :mod:`rnn_functional.backends.base`)."""

    layout: Layout
    params: dict[str, torch.Tensor]
    batch_shape: tuple
    x: torch.Tensor
    carry: Carry
    is_init: torch.Tensor | None
    reset: Carry | None


def _canonicalize(cell: Cell, x, state, params, is_init, reset_state, sequence: bool) -> tuple[Layout, dict]:
    """The call checked (every error names the argument, the expected and the actual): ``(layout, params)`` for
    :func:`flatten`. The one place the functions check their inputs (the messages are built only on error)."""
    if not isinstance(params, Mapping) and not hasattr(params, "items"):
        raise TypeError(f"params must be a TensorDict (or a mapping) with {cell.params_doc}, got "
                        f"{type(params).__name__}. Build one with {cell.init_function}(...).")
    params = dict(params.items())
    layout = cell.read_layout(params)
    lead, dims = (2, "[*B, T, F]") if sequence else (1, "[*B, F]")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a tensor {dims}, got {type(x).__name__}.")
    if x.ndim < lead or x.shape[-1] != layout.input_size:
        raise ValueError(
            f"x: expected shape {dims} with F={layout.input_size} (the params' input size), "
            f"got {list(x.shape)}." + (" For a single step use the *_step function." if sequence and x.ndim == 1 else "")
        )
    dtype, device = layout.dtype, layout.device
    if (x.dtype != dtype and x.dtype != autocast_dtype(layout)) or x.device != device:
        raise ValueError(f"x: expected dtype {dtype} on {device} (the params'), got {x.dtype} on {x.device}. Convert it "
                         f"with x.to(dtype=..., device=...) or convert the params.")
    batch_shape = tuple(x.shape[:-lead])
    time = tuple(x.shape[-2:-1]) if sequence else ()
    if reset_state is not None and is_init is None:  # (the step functions take no reset_state)
        raise ValueError("reset_state was given without is_init: it is only read where is_init is True. Pass is_init "
                         "too, or drop reset_state.")
    names, n = cell.state_names, len(cell.state_names)
    for arg, value, shape, where in (("state", state, batch_shape, "*B, L"), ("reset_state", reset_state,
                                                                           batch_shape + time, "*B, T, L")):
        carry = () if value is None else (value,) if n == 1 and isinstance(value, torch.Tensor) else \
            tuple(value) if n > 1 and isinstance(value, (tuple, list)) and len(value) == n else None
        if carry is None:
            raise _carry_error(cell, value, arg)
        for name, t, size in zip(names, carry, layout.state_sizes):
            if not isinstance(t, torch.Tensor):
                raise _carry_error(cell, value, arg)
            want = shape + (layout.num_layers, size)
            if t.shape != want:
                raise ValueError(f"{arg} ({name}): expected shape {list(want)} ([{where}, {size}] for this "
                                 f"{layout.cell.title}), got {list(t.shape)}.")
            if (t.dtype != dtype and t.dtype != autocast_dtype(layout)) or t.device != device:
                raise ValueError(f"{arg} ({name}): expected dtype {dtype} on {device} (the params'), got {t.dtype} on "
                                 f"{t.device}. Convert it with .to(dtype=..., device=...) or convert the params.")
    if is_init is not None:
        want = batch_shape + time
        if not isinstance(is_init, torch.Tensor):
            raise TypeError(f"is_init: expected a bool tensor of shape {list(want)}, got {type(is_init).__name__}.")
        if is_init.dtype != torch.bool:
            raise TypeError(f"is_init: expected dtype torch.bool, got {is_init.dtype}. Pass is_init.bool() (True where "
                            f"an episode starts).")
        if is_init.shape != want and is_init.shape != want + (1,):
            raise ValueError(f"is_init: expected shape {list(want)} or {list(want) + [1]}, got {list(is_init.shape)}: "
                             f"one bool per entry of x's leading dims (True where an episode starts).")
    return layout, params


def flatten(layout: Layout, params: Mapping[str, torch.Tensor], x: torch.Tensor, carry: Carry | torch.Tensor | None,
            is_init: torch.Tensor | None, reset: Carry | torch.Tensor | None, sequence: bool = True) -> Canonical:
    """A checked call (shapes against ``layout``, ``is_init`` ``[*B(, T)]`` or with a trailing 1; ``carry`` and
    ``reset`` a tensor or a tuple of them, as the functions take them; ``carry`` ``None`` for zeros) with its batch
    dims ``*B`` flattened into ``N``."""
    params = params if isinstance(params, dict) else dict(params.items())
    carry = (carry,) if isinstance(carry, torch.Tensor) else carry
    reset = (reset,) if isinstance(reset, torch.Tensor) else None if reset is None else tuple(reset)
    if torch.compiler.is_compiling():
        if torch.compiler.is_exporting():
            # torch's scan clones the tensors its step reads and, under non-strict export, fails on one the graph
            # holds as a constant (a global closed over: "Cannot access data pointer of Tensor"); a view is an op
            params, x, is_init, carry, reset = pytree.tree_map_only(
                torch.Tensor, lambda t: t.view_as(t), (params, x, is_init, carry, reset))
    elif torch.is_grad_enabled():
        for t in (x, is_init, *(carry or ()), *(reset or ())):
            if t is not None and t.is_inference():  # autograd cannot save an inference tensor for backward: a call
                # training on data collected in inference mode (as nn.LSTM and TorchRL serve it) copies them
                x, is_init, carry, reset = pytree.tree_map_only(
                    torch.Tensor, lambda t: t.clone() if t.is_inference() else t, (x, is_init, carry, reset))
                break
    if layout.cell.aten is not None and torch.is_autocast_enabled(layout.device.type):
        dtype = autocast_dtype(layout)
        if dtype is not None:  # cast as autocast casts an op's arguments: autograd records the casts, so gradients
            # reach the params and inputs in their own dtypes
            layout, params, x = replace(layout, dtype=dtype), {k: v.to(dtype) for k, v in params.items()}, x.to(dtype)
            carry, reset = [None if ts is None else tuple([t.to(dtype) for t in ts]) for ts in (carry, reset)]
    lead = 2 if sequence else 1
    batch_shape = tuple(x.shape[:-lead])
    if len(batch_shape) == 1 and carry is not None:  # flat already: a policy step
        if is_init is not None and is_init.ndim > lead:  # the modules' [*B(, T), 1]
            is_init = is_init.squeeze(-1)
        return Canonical(layout, params, batch_shape, x, tuple(carry), is_init, reset)
    n = math.prod(batch_shape)
    time = tuple(x.shape[-2:-1]) if sequence else ()
    x = _flat(x, (n, *x.shape[len(batch_shape):]))
    is_init = None if is_init is None else _flat(is_init, (n, *time))
    L = layout.num_layers
    carry = tuple([x.new_zeros((n, L, size)) for size in layout.state_sizes]) if carry is None else \
        tuple([_flat(t, (n, L, t.shape[-1])) for t in carry])
    reset = None if reset is None else tuple([_flat(t, (n, *time, L, t.shape[-1])) for t in reset])
    return Canonical(layout, params, batch_shape, x, carry, is_init, reset)


def _flat(t: torch.Tensor, shape: tuple) -> torch.Tensor:
    """``t`` reshaped to ``shape``; ``t`` itself when it has that shape (one batch dim: no new view per call)."""
    return t if t.shape == shape else t.reshape(shape)


def restore(batch_shape: tuple, tensors: Carry) -> Carry:
    """``[N, ...]`` tensors back to ``[*B, ...]``."""
    return tuple([t.reshape(batch_shape + tuple(t.shape[1:])) for t in tensors])


# ----------------------------------------------------------------------------- the route


def _route(backend: str, layout: Layout, plan: SegmentPlan, records_grad: bool, forced: str, cuda: bool) -> Route:
    """``backend``'s route for an eager call with the interior resets ``plan``, laid out as ``forced``
    (``segment_layout``) or by the rule: ``pad`` runs whole slices as a view, else length buckets (one layer under
    autograd on a CPU-fused kernel), else one packed call; the loops run right-aligned segments where that at least
    halves the steps, else the rows."""
    if forced == "auto":
        if backend != "pad":
            forced = "aligned" if 2 * plan.max_len <= plan.shape[1] else "rows"
        elif plan.slice_len is not None:
            forced = "slices"
        else:
            fused = layout.cell.aten.fused_on_cpu and not cuda
            forced = "buckets" if records_grad and layout.num_layers == 1 and fused else "packed"
    serves = {"buckets": layout.num_layers == 1, "slices": plan.slice_len is not None,
              "aligned": not layout.cell.reads_starts}
    if forced not in LAYOUTS_OF[backend] or not serves.get(forced, True):
        why = {"buckets": f"it serves one layer (these params have {layout.num_layers})",
               "slices": "this batch is not whole slices of one length from t = 0 (SliceSampler(strict_length=True))",
               "aligned": f"the {layout.cell.title} reads where segments start, and right-aligned, a segment that "
                          f"continues the incoming state would start with a reset"}
        layouts = [name for name in LAYOUTS_OF[backend] if serves.get(name, True)]
        raise ValueError(f"segment_layout={forced!r} cannot serve this call on backend {backend!r}: "
                         f"{why.get(forced, '')}. Use one of {layouts} or segment_layout='auto'.")
    return Route(backend, forced, plan)


def _check_triton(layout: Layout, x: torch.Tensor, opts: SequenceOptions, step: bool = False) -> None:
    """Raise unless ``triton`` has kernels for the cell, runs on ``x``'s device, the call is neither forward-mode AD nor
    under ``torch.func``'s grad/vjp, and the kernels serve the params and ``opts``. ``step``: a step function's call."""
    triton_backend.kernel_family(layout)

    def serving() -> list[str]:  # for the errors only: not on the call's path
        if step:
            return _step_backends(layout, x)
        names = backends.available_backends(x.device, layout.cell)
        return names if opts.recompute == "none" else [b for b in names if b in recompute_backends(opts.context)]

    if opts.context.forward:
        raise ValueError(
            "backend 'triton' cannot serve forward-mode AD (torch.func.jvp/jacfwd/hessian, dual tensors): its fused "
            f"kernels have a reverse-mode backward only. Use one of {[b for b in serving() if b != 'triton']} (exact "
            "to every order), or 'auto', which picks one of them there."
        )
    if opts.context.differentiated:  # torch.func's grad/vjp: torch's wrapper of a registered autograd formula lacks
        # functorch's setup_context
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


def _auto_runs_triton(layout: Layout, x: torch.Tensor, opts: SequenceOptions, ctx: CallContext) -> bool:
    """Whether ``auto`` runs ``triton`` on CUDA ``x`` (the callers check ``x.is_cuda``): where it serves the call under
    ``torch.compile`` or ``torch.vmap``, not in plain eager mode where cuDNN (``pad``) is faster (docs/gpu.md)."""
    if ctx.differentiated:
        return False
    cudnn = not ctx.traced and opts.recompute == "none" and layout.cell.aten is not None
    return not cudnn and triton_backend.serves(layout, x.device, opts)


def _reads_segments(name: str, layout: Layout, x: torch.Tensor, opts: SequenceOptions, ctx: CallContext,
                    segment_layout: str) -> bool:
    """Whether an eager call with ``is_init`` reads it on the host to choose its route: ``pad``, a forced
    ``segment_layout``, and ``auto`` where it runs neither ``parallel`` nor ``triton``."""
    return name == "pad" or segment_layout != "auto" or name == "auto" and not (
        layout.cell.linear_in_state or x.is_cuda and _auto_runs_triton(layout, x, opts, ctx))


def _compiled_loop() -> str:
    """``auto`` and ``pad`` under ``torch.compile``: ``scan``, or ``reference``'s unrolled loop where compiled autograd
    traces the backward, which cannot hold a ``scan``. Grad mode: a vmapped tensor reports ``requires_grad=False``."""
    return "reference" if torch.is_grad_enabled() and torch._dynamo.compiled_autograd.compiled_autograd_enabled \
        else "scan"


def auto(layout: Layout, x: torch.Tensor, opts: SequenceOptions, plan: SegmentPlan | None, records_grad: bool,
         ctx: CallContext) -> str:
    """``auto``'s pick, first match of the rule in ``docs/backends.md`` ("What ``auto`` picks")."""
    if layout.cell.linear_in_state:
        return "scan" if opts.recompute == "full" and ctx.traced and not ctx.compiling else "parallel"
    if x.is_cuda and _auto_runs_triton(layout, x, opts, ctx):
        return "triton"
    if ctx.compiling:
        return _compiled_loop()
    if ctx.traced:
        return "scan" if opts.recompute == "full" else "reference"
    loop = "scan" if records_grad else "reference"
    if opts.recompute != "none" or layout.cell.aten is None:
        return loop
    no_gain = (records_grad and plan is not None and plan.slice_len is None and not x.is_cuda
               and not layout.cell.aten.fused_on_cpu and 2 * plan.max_len > plan.shape[1])
    return loop if no_gain else "pad"


def choose(name: str, layout: Layout, x: torch.Tensor, opts: SequenceOptions, plan: SegmentPlan | None,
           records_grad: bool, ctx: CallContext, segment_layout: str = "auto") -> Route:
    """The route serving backend ``name`` (``"auto"``: :func:`auto`'s pick) for this call, laid out by :func:`_route`,
    or a ``ValueError`` naming those that can. ``plan``: the interior resets' segments read on the host, a static plan
    under ``torch.compile``, or ``None``. Traced, ``pad`` runs ``auto``'s compiled loop or ``reference``."""
    if plan is not None and plan.static:  # compiled [num_slices, slice_len] block: its segments right-aligned
        route = choose(name, layout, x, opts, None, records_grad, ctx)
        # parallel serves any segment layout as it is; a cell that reads where segments start runs its rows (right-
        # aligned, a segment continuing the incoming state would restart)
        aligned = route.backend != "parallel" and not layout.cell.reads_starts
        return Route(route.backend, "aligned", plan) if aligned else route
    if name == "auto":
        name = auto(layout, x, opts, plan, records_grad, ctx)
        if name == "triton" or ctx.compiling:
            return Route(name)
    elif name == "pad":
        pad.aten_kernels(layout)  # raises for a cell without ATen kernels, in every context
        if ctx.traced:
            return Route(_compiled_loop() if ctx.compiling else "reference")
    elif name == "triton":
        _check_triton(layout, x, opts)
        return Route("triton")
    elif name == "scan" and ctx.compiling and _compiled_loop() == "reference":
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
    """The one-step function ``(layout, params, x [N, F], carry) -> (y, carry)`` for ``name``. ``auto``: ``pad`` in
    plain eager mode without ``proj_size``, else ``triton`` on CUDA where it serves, else ``reference``; ``pad`` runs
    ``reference`` where its kernels cannot (traced, ``proj_size``)."""
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
        _check_triton(layout, x, SequenceOptions(context=ctx), step=True)
        return triton_backend.step
    if name not in ("reference", "parallel"):  # one step of a linear recurrence is the reference step
        raise ValueError(
            f"backend: expected one of {['auto', *_step_backends(layout, x)]} for a {layout.cell.title} step here, "
            f"got {name!r}."
        )
    return multi_layer_step


def _step_backends(layout: Layout, x: torch.Tensor) -> list[str]:
    """The step backends that serve ``layout``'s cell on ``x``'s device here (``scan`` runs sequences only)."""
    return [b for b in STEP_BACKENDS[1:] if b in backends.available_backends(x.device, layout.cell)]


# ----------------------------------------------------------------------------- drivers


def _empty_call(c: Canonical, time: tuple) -> tuple[torch.Tensor, Carry, Carry]:
    """A call in which no step runs (``N = 0`` or ``T = 0``): ``(y, carry, per-step carries)``. An exact zero reading
    every input connects them to autograd: an empty batch backpropagates zeros into every input, as ``torch.nn``."""
    inputs = (c.x, *c.carry, *(c.reset or ()), *c.params.values())
    zero = sum(t.flatten()[:0].sum() for t in inputs)
    n = c.x.shape[0]
    y = c.x.new_zeros((n, *time, c.layout.out_size)) + zero
    per_step = tuple([s.new_zeros((n, *time, *s.shape[1:])) + zero for s in c.carry])
    return y, tuple([s + zero for s in c.carry]), per_step


def _first_step_resets(x, carry: Carry, is_init: torch.Tensor, reset: Carry | None, host: np.ndarray):
    """A call whose resets all lie at ``t = 0`` (``host``: ``is_init`` read on the host) as a reset-free call
    ``(x, carry, None, None)``: the reset state outright where ``is_init[:, 0]`` is all True, the carry where all
    False, else (or where autograd records a side, which gets ``torch.where``'s zeros) :func:`apply_reset`."""
    resets = np.count_nonzero(host[:, 0])
    reset0 = None if reset is None else tuple([r[:, 0] for r in reset])
    if 0 < resets < host.shape[0] or any(t.requires_grad for t in (*carry, *(reset0 or ()))):
        carry = apply_reset(carry, is_init[:, 0], reset0)
    elif resets:
        carry = reset0 if reset0 is not None else tuple([torch.zeros_like(s) for s in carry])
    return x, carry, None, None


def sequence_route(cell: str, x: torch.Tensor, params: Mapping[str, torch.Tensor], *, is_init: torch.Tensor | None = None,
                   backend: str = "auto", recompute: str = "none", records_grad: bool = True,
                   segment_layout: str = "auto") -> Route:
    """The route an eager ``{cell}_sequence`` call with these arguments takes: its ``backend`` and how it lays out
    its segments (``route.segments``: ``"rows"``, ``"aligned"``, ``"packed"``, ``"buckets"`` or ``"slices"``).
    ``cell``: the function's prefix (``"lstm"``, ...); ``records_grad``: autograd records the call (``auto``'s choice
    depends on it). Reads ``is_init`` on the host as the call would; runs nothing."""
    check_options(backend=backend, recompute=recompute, segment_layout=segment_layout)
    c = flatten(*_canonicalize(CELLS[cell], x, None, params, is_init, None, sequence=True), x, None, is_init, None)
    ctx = call_context()
    opts = SequenceOptions(recompute=recompute, context=ctx)
    plan = None
    if c.is_init is not None and c.is_init.numel() and not ctx.traced and _reads_segments(
            backend, c.layout, c.x, opts, ctx, segment_layout):
        plan = segments.plan(c.is_init.numpy(force=True), c.is_init.device)
    return choose(backend, c.layout, c.x, opts, plan, records_grad, ctx, segment_layout)


# ----------------------------------------------------------------------------- public functions

_STEP_DOC = """One time step of a multi-layer {title}.

    Args:
        x: ``[*B, F]``.
        state: {state}, or ``None`` for zeros.
        params: {params} (see ``{init}``).
        is_init: bool ``[*B]`` (or ``[*B, 1]``); where True the state is reset to zeros first.
        backend: ``"auto"`` (the fused ``triton`` step on CUDA where it applies, ATen's fused cell (``"pad"``) in
            plain eager mode where the cell has one, else ``"reference"``), ``"reference"``, ``"pad"``, ``"triton"``
            or ``"parallel"`` (one step of a linear recurrence: the ``reference`` step).
        dropout, training: dropout probability on the outputs of every layer but the last, applied only when
            ``training`` (then the ``reference`` step runs: no fused cell applies it).
        layout: the params' layout (``Cell.layout_of``) when the caller has checked ``x``, ``state`` (a tuple
            of tensors) and ``is_init`` against it, as the modules do: the call skips its own checks.{extra}

    Returns:
        ``(y [*B, {out}], state)``: the top layer's output and the new state. As ``torch.nn.LSTMCell``'s
        ``h``, ``y`` may share memory with the state (the top layer's ``h``); the modules return a copy.
    """

_SEQUENCE_DOC = """A multi-layer {title} over a sequence, with resets.

    Args:
        x: ``[*B, T, F]``.
        state: {state} before step 0, or ``None`` for zeros.
        params: {params} (see ``{init}``).
        is_init: bool ``[*B, T]`` (or ``[*B, T, 1]``); before every step ``t`` where it is True
            the carry is replaced by ``reset_state[..., t, :, :]``, or by zeros.
        reset_state: per-step states to reset to, the state's format with a ``T`` dim after ``*B``.
        backend: ``"auto"`` (``docs/backends.md``), ``"reference"``, ``"scan"``, ``"pad"``, ``"triton"`` or
            ``"parallel"`` (cells linear in their state); one that cannot serve the call raises a ``ValueError``.
        dropout, training: dropout probability on the outputs of every layer but the last, applied when ``training``.
        recompute: ``"none"`` or ``"full"`` (recompute activations in backward instead of saving them; not ``pad``).
        compute_dtype, matmul_precision: the recurrent matmul's operand dtype and precision (``triton`` only; see
            :mod:`rnn_functional.precision`).
        return_segment_states: also return the per-step states ``[*B, T, L, ·]``: the carry after every step that
            ends a segment (before a reset, and the last step), zeros elsewhere (TorchRL's ``("next", hidden)``).
        slice_len: the time axis is whole slices of exactly this many steps, ``is_init`` True at every slice
            start (``SliceSampler(slice_len=..., strict_length=True)``), run as ``[*B * T / slice_len, slice_len]``
            (static shapes under ``torch.compile``, ``docs/compile.md``).
        num_slices: with ``slice_len``: at most ``num_slices`` segments of at most ``slice_len`` steps
            (``strict_length=False``), run in a ``[num_slices, slice_len]`` block under ``torch.compile``. A hint
            that does not match the batch raises (``ValueError`` eagerly, ``RuntimeError`` compiled); under
            ``torch.vmap`` both are unchecked and unused, the call following ``is_init``.
        segment_layout: how an eager call with interior resets lays out its segments: ``"auto"`` or one of the
            backend's layouts: ``"rows"``/``"aligned"`` (``reference``, ``scan``), ``"packed"``/``"buckets"``/
            ``"slices"`` (``pad``); see ``docs/backends.md``.
        layout: the params' layout (``Cell.layout_of``) when the caller has checked the options and ``x``,
            ``state``, ``is_init`` and ``reset_state`` against it, as the modules do: the call skips its checks.{extra}

    Returns:
        ``(y [*B, T, {out}], state_T)``: top-layer outputs and the carry after the last step
        (and the segment states last, with ``return_segment_states``).
    """


def public_functions(cell: Cell, functions: tuple[Callable, Callable] | None = None, extra: str = ""):
    """``cell``'s public step and sequence functions (default: :func:`entries`), named ``{name}_step`` and
    ``{name}_sequence`` and documented (``extra``: more Args entries)."""
    functions = functions or entries(cell)
    for fn, kind, doc in zip(functions, ("step", "sequence"), (_STEP_DOC, _SEQUENCE_DOC)):
        fn.__name__ = fn.__qualname__ = f"{cell.name}_{kind}"
        fn.__module__ = "rnn_functional.functional"
        fn.__doc__ = doc.format(title=cell.title, state=cell.state_doc, params=cell.params_doc,
                                init=cell.init_function, out=cell.out_dim, extra=extra)
    return functions


def entries(cell: Cell) -> tuple[Callable, Callable]:
    """The step and sequence functions of ``cell``: every call, a user's or a module's (which passes ``layout``: it
    checked the call itself), enters through one of them, is checked once, reads its context once and picks once."""

    def step(x: torch.Tensor, state, params: Mapping[str, torch.Tensor], *, is_init: torch.Tensor | None = None,
             backend: str = "auto", dropout: float = 0.0, training: bool = False, layout: Layout | None = None):
        if layout is None:
            if backend not in STEP_BACKENDS or dropout:  # the unknown-name error first; resolve_step rejects 'scan'
                check_options(backend=backend, dropout=dropout)
            layout, params = _canonicalize(cell, x, state, params, is_init, None, sequence=False)
        c = flatten(layout, params, x, state, is_init, None, False)
        x = c.x if cell.prepare_input is None else cell.prepare_input(c.params, c.x)
        # a cell that reads where segments start gets is_init [N, 1] (only the reference step serves such a cell)
        start = None if c.is_init is None or not cell.reads_starts else c.is_init.unsqueeze(-1)
        if x.shape[0] == 0:
            y, carry, _ = _empty_call(c, ())
        elif training and dropout > 0 and c.layout.num_layers > 1:  # the reference step: no fused cell drops out
            y, carry = multi_layer_step(c.layout, c.params, x, apply_reset(c.carry, c.is_init, None), dropout, True,
                                        start)
        else:
            run = resolve_step(backend, c.layout, x, call_context())
            y, carry = run(c.layout, c.params, x, apply_reset(c.carry, c.is_init, None),
                           **({} if start is None else {"start": start}))
        if len(c.batch_shape) != 1:
            y, *carry = restore(c.batch_shape, (y, *carry))
        return y, (carry[0] if len(carry) == 1 else tuple(carry))

    def sequence(x: torch.Tensor, state, params: Mapping[str, torch.Tensor], *, is_init: torch.Tensor | None = None,
                 reset_state=None, backend: str = "auto", dropout: float = 0.0, training: bool = False,
                 recompute: str = "none", compute_dtype: torch.dtype | None = None, matmul_precision: str | None = None,
                 return_segment_states: bool = False, slice_len: int | None = None, num_slices: int | None = None,
                 segment_layout: str = "auto", layout: Layout | None = None):
        # pad, a forced segment_layout and auto (unless it runs triton or parallel) read is_init on the host once:
        # resets all at t = 0 run reset-free, interior ones get their segments' plan; the others apply every reset
        if layout is None:
            check_options(backend=backend, recompute=recompute, dropout=dropout, matmul_precision=matmul_precision,
                          compute_dtype=compute_dtype, segment_layout=segment_layout)
            layout, params = _canonicalize(cell, x, state, params, is_init, reset_state, sequence=True)
        c = flatten(layout, params, x, state, is_init, reset_state)
        ctx = call_context()
        opts = SequenceOptions(dropout, training, recompute, compute_dtype, matmul_precision, return_segment_states, ctx)
        n, t_len = c.x.shape[:2]
        host = None  # is_init read on the host: once per call, for the hint's check and the segment plan alike
        if slice_len is not None or num_slices is not None:
            if c.is_init is not None and c.is_init.numel() and not ctx.traced:
                host = c.is_init.numpy(force=True)
            slices.check_hint(slice_len, num_slices, t_len, c.is_init, ctx.compiling, host, ctx.vmapped)
        empty = n == 0 or t_len == 0
        records_grad = False
        if torch.is_grad_enabled():
            for t in (c.x, *c.carry, *(c.reset or ()), *c.params.values()):
                if t.requires_grad:
                    records_grad = True
                    break
        call = (c.x if cell.prepare_input is None else cell.prepare_input(c.params, c.x), c.carry, c.is_init, c.reset)
        # under torch.vmap the hint is not checked (nor used): is_init's resets alone give the same result
        reshaped = slice_len is not None and num_slices is None and not empty and not ctx.vmapped
        if reshaped:  # whole slices side by side: [N * T / slice_len, slice_len]
            call = slices.split(slice_len, *call)
            host = None if host is None else host.reshape(call[2].shape)
        plan = None
        if num_slices is not None and ctx.compiling and not empty:  # the segments in a [num_slices, slice_len] block
            plan = segments.static_plan(c.is_init, slice_len, num_slices)
        elif call[2] is not None and not (empty or ctx.traced) and _reads_segments(
                backend, c.layout, call[0], opts, ctx, segment_layout):
            host = call[2].numpy(force=True) if host is None else host
            plan = segments.plan(host, call[2].device)
            if plan is None and not cell.reads_starts:  # such a cell needs is_init at t = 0 too
                call = _first_step_resets(*call, host)
        route = choose(backend, c.layout, call[0], opts, plan, records_grad, ctx, segment_layout)
        if empty:  # no step runs (the route was still chosen: a backend that cannot serve the call says so)
            y, final, seg = _empty_call(c, (t_len,))
        else:
            y, final, per_step, ends = route.run(c.layout, c.params, *call,
                                                opts if call[2] is not None else opts.without_segment_states())
            seg = None
            if opts.segment_states and call[2] is None:  # no interior reset: the final carry at the last step
                seg = final_at_last_step(final, call[0].shape[1])
            elif opts.segment_states:
                seg = per_step if ends else keep_segment_ends(per_step, call[2])
            if reshaped:
                y, final, seg, _ = segments.merge_slices(n, t_len, y, final, seg)
            if records_grad:  # the final carry can be the last step's own, read by y and seg: a node of its own, as
                final = tuple(map(torch.Tensor.view_as, final, final))  # nn's h_n, so a hook sees its own uses only
        if len(c.batch_shape) != 1:
            y, *final = restore(c.batch_shape, (y, *final))
            seg = None if seg is None else restore(c.batch_shape, seg)
        final = final[0] if len(final) == 1 else tuple(final)
        if not return_segment_states:
            return y, final
        return y, final, seg[0] if len(seg) == 1 else tuple(seg)

    return step, sequence
