"""Which backend serves a call: ``auto``'s rule, the eager-only routing, and the cell's hooks.

A backend that cannot serve the cell or an option raises ``ValueError`` naming itself,
what it cannot serve and the backends that can; ``auto`` only picks a backend that serves
the call (the cell's hooks, the context from :func:`~.options.call_context`, device, options).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ..backends import SEQUENCE, SequenceOptions, available_backends, checkpointed, pad, triton_backend
from ..cells import Layout, multi_layer_step
from . import segments, slices
from .options import CallContext, call_context, check_options

STEP_BACKENDS = ("auto", "reference", "pad", "triton")

__all__ = ["resolve_backend", "resolve_step", "STEP_BACKENDS"]


def _interior_resets(is_init: torch.Tensor | None) -> bool:
    return is_init is not None and is_init.numel() > 0 and bool(is_init[:, 1:].any())


EAGER_PATHS = ("reference", "pad", "packed", "segments", "scan", "scan_segments")


def eager_path(name: str, layout: Layout, opts: SequenceOptions, is_init: torch.Tensor | None,
               plan: Callable[[], segments.SegmentPlan] | None = None, records_grad: bool = True) -> Callable:
    """One exact eager path for a call (a name of ``EAGER_PATHS``): ``"reference"`` (the loop over
    ``T``); ``"pad"`` (one ATen kernel call; with interior resets, whole slices as a view of the call, else
    the segments in length buckets of unpacked calls, or packed for more than one layer); ``"packed"`` (ATen's kernels on the segments
    packed side by side); ``"segments"`` (the ``reference`` loop over the right-aligned segments);
    ``"scan"`` (the ``scan`` backend's eager loop over ``T``, whose hand-written backward consumes
    the activations saved by its forward); ``"scan_segments"`` (that loop over the right-aligned
    segments). See :mod:`.segments`; ``plan``: the call's segments, when already known; ``records_grad``:
    autograd records the call (the length buckets are cut for it)."""
    if name not in EAGER_PATHS:
        raise ValueError(f"eager path: expected one of {list(EAGER_PATHS)}, got {name!r}.")
    loop = checkpointed(SEQUENCE["reference"]) if opts.recompute == "full" else SEQUENCE["reference"]
    if name.startswith("scan"):
        loop = SEQUENCE["scan"]  # serves recompute="full" itself
    if not _interior_resets(is_init):
        return pad.sequence if name in ("pad", "packed") else loop
    if name in ("reference", "scan"):
        return loop
    plan = plan() if plan else segments.plan(is_init)
    if name in ("segments", "scan_segments"):
        return segments.aligned(loop, plan)
    if name == "pad" and plan.slice_len:
        return slices.whole_slices(plan.slice_len)
    if name == "pad" and layout.num_layers == 1:
        return segments.bucketed(plan, records_grad)
    return segments.packed(plan)


# The loop's cost per step grows with its rows as ``rows + _LOOP_ROWS_PER_STEP``: a step of one row
# costs as much as ~28 extra rows (CPU, H=128, fwd+bwd; docs/backends.md).
_LOOP_ROWS_PER_STEP = 28
# Below this padding (steps run / real steps), the length buckets beat one packed call even without
# the backward: full slices (one length, the last cut) run as one or two unpacked calls.
_BUCKET_PADDING = 1.05
# The same for the forward of a fused kernel: oneDNN's unpacked LSTM runs a step of a row faster than
# ATen's packed loop, which pays for some padding (SliceSampler slices, padding 1.12: buckets 1.17x faster).
_FUSED_BUCKET_PADDING = 1.15
# ... in at most this many calls: with more, the rows shorter than their bucket (whose ``c`` is recomputed
# step by step) cost more than the padding saves ([32, 64] with 20% resets, 12 buckets padded 1.10: packed
# 1.29x faster; N=4096 slices <= 20, 20 buckets without padding: the buckets 1.04x faster).
_FUSED_BUCKET_CALLS = 2
# Under autograd, oneDNN's LSTM on the length buckets beats the saved-activation loop over ``T`` unless
# the buckets' estimated cost (``segments.bucket_cost``) exceeds this multiple of the loop's
# (``_loop_cost``): a [B, T] batch whose segments spread over many lengths (docs/backends.md).
_BUCKETS_OVER_LOOP = 1.5
# ... and beats one packed call unless packed's backward gradient fills (``Lmax`` of ``N * T * H`` elements each)
# stay below this and there are many segments per step of the longest (``S >= 2 * Lmax``: the buckets would be
# many calls, or recompute many short rows). LSTM, H=128, fwd+bwd, truncated slices: packed 1.41x faster at
# N=200 slices <= 8 (fills 2.0 x 10^5, 42 segments), 1.07x at N=1024 <= 8 (1.0 x 10^6), 1.12x at N=1024 <= 20
# (2.6 x 10^6); the buckets tie or win at N=200 <= 20 (20 segments), N=200 <= 64 (8), N=1024 <= 64 (8.4 x 10^6)
# and N=4096 (4.2 x 10^6 and up). docs/backends.md.
_PACKED_FILL_STEPS = 3 * 2**20
_PACKED_SEGMENTS_PER_STEP = 2
# Under autograd, a GRU call of at most this many segments runs fastest as the saved-activation loop over
# them (``scan_segments``): with so few rows a step's cost is its fixed overhead, where ATen's GRU loop
# records ~10 ops per step against the scan step's six and one GEMM backward (docs/backends.md).
_SCAN_SEGMENT_ROWS = 4
# Up to this many segments the same loop still beats packed and padded buckets once the slices' lengths
# differ, as long as it pads them (``S * Lmax`` row-steps over the ``N * T`` real ones) no more than
# ``_SCAN_SEGMENT_PADDING`` (SliceSampler-like, 8-16 segments of up to 64 steps, padding 1.12-1.25: packed
# 1.09-1.18x, buckets 1.13-1.21x slower; padding 1.40-1.61 at 16 segments or 24 segments: packed wins);
# full slices keep their bucket call (16 of 64: buckets 0.92x). docs/backends.md.
_SCAN_SEGMENT_ROWS_RAGGED = 16
_SCAN_SEGMENT_PADDING = 1.25
# Forward only, the segments packed into one call lose to the scan loop over ``T`` once the loop over them
# (``_loop_cost(Lmax, S)``) costs this multiple of the loop over the rows: a [B, T] batch with many resets
# (the segments barely shorten the rows). Packed data permuted in one copy, [32, 64] with 20% resets (ratio
# 4.27) runs packed 1.23x (LSTM) and 1.31x (GRU) faster than the loop: only a batch padded further goes to it.
_PACKED_OVER_LOOP = 4.5


def _loop_cost(steps: int, rows: int) -> int:
    """Relative cost of the ``reference`` loop: ``steps`` sequential steps of ``rows`` rows."""
    return steps * (rows + _LOOP_ROWS_PER_STEP)


def _buckets_pay(p: segments.SegmentPlan, layout: Layout, records_grad: bool, fused: bool) -> bool:
    """Rule 5's test: the length buckets pad at most ``_BUCKET_PADDING``; for a fused kernel's forward, they
    run every segment to its end (no padding) or pad at most ``_FUSED_BUCKET_PADDING`` in at most
    ``_FUSED_BUCKET_CALLS`` calls."""
    padding = segments.bucket_padding(p, layout, records_grad)
    if not fused:
        return padding <= _BUCKET_PADDING
    calls = len(segments.bucket_shapes(p, layout, records_grad))
    return padding <= 1.0 or (padding <= _FUSED_BUCKET_PADDING and calls <= _FUSED_BUCKET_CALLS)


def _eager_fastest(layout: Layout, opts: SequenceOptions, is_init: torch.Tensor | None, records_grad: bool,
                   plan: Callable[[], segments.SegmentPlan] | None = None) -> str:
    """The fastest exact eager path able to serve the call (a name of :func:`eager_path`). The rule, measured with
    ``benchmarks/bench_flat.py`` on CPU (``docs/backends.md``, "auto on flat and ragged batches"):

    * no interior reset: ``pad`` (one kernel call), or ``reference`` where ``pad`` cannot
      serve (``recompute="full"``, a cell without ATen kernels);
    * interior resets, ATen kernels available (``recompute="none"``); ``fused``: the cell's unpacked
      kernel is one fused kernel on CPU (oneDNN's LSTM; ATen's GRU is a loop of per-step ops):

      - whole slices (:attr:`.segments.SegmentPlan.slice_len`: every row slices of ``L`` steps from
        ``t = 0``): ``pad``, one kernel call on the view ``[N * T / L, L]`` (and one on the shorter last
        slices), no gather, any number of layers; unless autograd records a call of at most
        ``_SCAN_SEGMENT_ROWS`` slices, not ``fused`` (below);
      - autograd records the call, one layer, ``fused``: ``pad``, the length buckets (oneDNN's backward
        is linear in the steps, where a packed call's backward on CPU zero-fills its input-projection
        gradient at every step), unless their estimated cost is more than ``_BUCKETS_OVER_LOOP`` times
        the loop's over ``T`` (a ``[B, T]`` batch whose segments spread over many lengths): ``scan``, or
        ``packed`` where packed's ``Lmax`` gradient fills of ``N * T * H`` elements stay under
        ``_PACKED_FILL_STEPS`` and there are at least ``_PACKED_SEGMENTS_PER_STEP * Lmax`` segments (short
        ragged slices, small batch);
      - autograd records the call and the longest segment ``Lmax`` is more than half of ``T`` (a
        ``[B, T]`` batch with scattered resets, the segments barely shorten the rows): not ``fused``,
        ``scan`` (its loop over ``T``, whose backward consumes the saved activations, beats ATen's
        autograd-recorded step loop); ``fused`` with more layers, the ``reference`` loop;
      - autograd records the call, not ``fused``, at most ``_SCAN_SEGMENT_ROWS`` segments: ``scan_segments``
        (that loop over the aligned segments; few rows: the per-step overhead decides);
      - autograd does not record the call and ``_loop_cost(Lmax, S)`` exceeds ``_PACKED_OVER_LOOP`` times
        ``_loop_cost(T, N)`` (a ``[B, T]`` batch with many resets): ``scan``, the loop over ``T``;
      - one layer, ``fused`` or autograd records the call, and the length buckets pay (:func:`_buckets_pay`:
        they pad no more than ``_BUCKET_PADDING``; for ``fused``, no padding or at most ``_FUSED_BUCKET_PADDING``
        in at most ``_FUSED_BUCKET_CALLS`` calls): ``pad``;
      - autograd records the call, not ``fused``, at most ``_SCAN_SEGMENT_ROWS_RAGGED`` segments (of
        differing lengths, else ``pad`` above) padded to ``Lmax`` by at most ``_SCAN_SEGMENT_PADDING``:
        ``scan_segments``;
      - otherwise ``packed``: the segments packed into one call (no padding, no extra calls; every
        forward-only GRU call);
    * interior resets, no ATen kernels: the ``reference`` loop, over the segments (``Lmax`` steps of
      ``S`` rows) where that costs less than over the rows (``T`` steps of ``N`` rows), see :func:`_loop_cost`.
    """
    aten = opts.recompute != "full" and layout.cell.aten is not None
    if not _interior_resets(is_init):
        return "pad" if aten else "reference"
    p = plan() if plan else segments.plan(is_init)
    n, t_len = is_init.shape
    if aten:
        fused, one_layer = layout.cell.aten.fused_on_cpu, layout.num_layers == 1
        if p.slice_len and (fused or not records_grad or p.count > _SCAN_SEGMENT_ROWS):
            return "pad"  # whole slices: one view-shaped kernel call (and one for the shorter last slices)
        if records_grad and fused and one_layer:
            if segments.bucket_cost(p, layout, records_grad) > _BUCKETS_OVER_LOOP * _loop_cost(t_len, n):
                return "scan"
            small_fill = p.max_len * n * t_len * layout.hidden_size <= _PACKED_FILL_STEPS
            return "packed" if small_fill and p.count >= _PACKED_SEGMENTS_PER_STEP * p.max_len else "pad"
        if records_grad and 2 * p.max_len > t_len:
            return "reference" if fused else "scan"
        if records_grad and not fused and p.count <= _SCAN_SEGMENT_ROWS:
            return "scan_segments"
        if not records_grad and _loop_cost(p.max_len, p.count) > _PACKED_OVER_LOOP * _loop_cost(t_len, n):
            return "scan"
        if one_layer and (fused or records_grad) and _buckets_pay(p, layout, records_grad, fused):
            return "pad"
        few_ragged = p.count <= _SCAN_SEGMENT_ROWS_RAGGED and p.count * p.max_len <= _SCAN_SEGMENT_PADDING * n * t_len
        if records_grad and not fused and few_ragged:
            return "scan_segments"
        return "packed"
    return "segments" if _loop_cost(p.max_len, p.count) < _loop_cost(t_len, n) else "reference"


def _auto(layout: Layout, x: torch.Tensor, opts: SequenceOptions, is_init, ctx: CallContext,
          records_grad: bool = True, plan: Callable[[], segments.SegmentPlan] | None = None) -> str:
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
    return _eager_fastest(layout, opts, is_init, records_grad, plan=plan)


def resolve_backend(
    name: str,
    layout: Layout,
    x: torch.Tensor,
    opts: SequenceOptions,
    is_init: torch.Tensor | None = None,
    records_grad: bool = True,
) -> Callable:
    """The ``sequence`` implementation serving ``name`` for this call (``records_grad``: autograd
    records it, which changes ``auto``'s eager choice).

    ``auto``: see :func:`_auto`. ``pad`` runs ATen's kernels eagerly, with interior resets in the layout
    ``auto``'s rule picks among ATen's (``packed`` segments, or ``pad``'s own where the rule picks it or
    leaves ATen's kernels), and computes the same result through ``scan`` under ``torch.compile`` and
    ``reference`` under eager ``torch.func`` transforms, where those kernels cannot run (no vmap
    batching rule, data-dependent splits).
    """
    check_options(backend=name)
    ctx = call_context()
    # the call's segments (a host sync), planned at most once: auto's rule and the eager path it picks
    # share them (traced calls never plan; dynamo cannot trace functools.cache)
    plan = None if ctx.traced else functools.cache(lambda: segments.plan(is_init))
    if name == "auto":
        name = _auto(layout, x, opts, is_init, ctx, records_grad, plan)
        if not ctx.traced and name in EAGER_PATHS[1:]:  # the eager choice (traced: plain scan or reference)
            return eager_path(name, layout, opts, is_init, plan, records_grad)
    elif name == "pad":
        pad.aten_kernels(layout)  # raises for a cell without ATen kernels, in every context
        if ctx.traced:  # ATen's kernels have no vmap rule nor functorch autograd, and split on host-side counts
            name = "scan" if ctx.compiling else "reference"
        else:  # ATen's kernels in the layout auto's rule picks among theirs (packed or pad's own), else pad's own
            path = "packed" if _eager_fastest(layout, opts, is_init, records_grad, plan) == "packed" else "pad"
            return eager_path(path, layout, opts, is_init, plan, records_grad)
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
        elif torch.compiler.is_compiling():  # what "pad" runs when traced, with fewer guards per compiled call
            return multi_layer_step
        else:
            name = "reference" if layout.cell.aten is None else "pad"
    if name == "pad":
        pad.aten_kernels(layout)
        return multi_layer_step if call_context().traced or layout.proj_size else pad.step
    if name == "triton":
        resolve_backend("triton", layout, x, SequenceOptions())  # raises when triton cannot serve it
        return triton_backend.step
    return multi_layer_step
