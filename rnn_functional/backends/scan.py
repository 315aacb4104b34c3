"""``scan``: one layer at a time, time-major, the input projected in one GEMM, then the recurrence
(:func:`~.scan_parts.time_loop`): torch's ``scan`` under ``torch.compile``, a Python loop eagerly (eager ``scan``
retraces every call and cannot run under ``torch.func.grad``).

When autograd records a layer it runs :class:`~.scan_parts.HandWrittenLayer`, whose backward is a hand-written
reverse scan (``recompute="full"`` keeps only the carries: checkpointing around ``scan`` is unsupported), itself
differentiable (a replayed vjp); forward-mode AD runs the plain loop. Never torch's own scan autograd: Inductor
miscompiles its backward (silently wrong gradients, pytorch/pytorch#153679).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..cells import Carry, Layout, between_layers
from . import ensemble_scan
from .base import SequenceOptions
from .scan_parts import ONE_MODEL, HandWrittenLayer, scan_states, traced_under_grad


def _distinct(values: tuple) -> tuple:
    """``values``, a repeated tensor (tied params) as a view: Dynamo refuses a Function given one twice."""
    out = []
    for v in values:
        out.append(v.view_as(v) if isinstance(v, torch.Tensor) and any(v is u for u in out) else v)
    return tuple(out)


def sequence(layout: Layout, params, x, carry: Carry, is_init, reset, opts: SequenceOptions):
    """``x [N, T, F]`` -> ``(y [N, T, P], carry, per-step carries)``; see :mod:`.base`. The layers run time-major."""
    cell, ctx, recompute = layout.cell, opts.context, opts.recompute == "full"
    inp = x.transpose(0, 1)  # [T, N, F]
    mask = None if is_init is None else is_init.transpose(0, 1)  # [T, N]
    finals, per_step = [], []
    for k in range(layout.num_layers):
        inp = between_layers(inp, opts.dropout, opts.training) if k else inp
        w = cell.layer_weights(params, layout, k)
        layer_carry = tuple([s[:, k] for s in carry])
        reset_k = () if reset is None else tuple([r[:, :, k].transpose(0, 1) for r in reset])  # [T, N, S]
        weights = w.tensors()
        tensors = (inp, mask, *layer_carry, *reset_k, *weights)
        layer_inputs = (len(layer_carry), bool(reset_k), *tensors)
        states = None
        if ctx.compiling and ensemble_scan.serves(recompute, *tensors):
            # compiled torch.vmap with autograd: the ensemble op (torch cannot vmap the layer below there)
            states = ensemble_scan.layer_states(cell, recompute, *layer_inputs)
        elif torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors) \
                and not ctx.forward and not (ctx.compiling and traced_under_grad()):  # autograd records the layer
            if ctx.compiling:
                layer_inputs = _distinct(layer_inputs)
            states = HandWrittenLayer.apply(cell, recompute, ONE_MODEL, *layer_inputs)[: len(layer_carry)]
        else:
            keep = "states" if opts.segment_states else "h"
            gi = F.linear(inp, w.weight_ih, w.bias_ih)  # [T, N, G*H]
            final, ys = scan_states(cell, weights, layer_carry, gi, mask, reset_k, keep)
        if states is not None:
            # ``* 1``: each final carry's backward hands the scan a cotangent of its own, where a loss such as
            # ``(h_T + c_T).sum()`` gives views of one tensor, which scan rejects ("scan might be aliasing")
            final, ys = tuple([s[-1] * 1 for s in states]), states
        finals.append(final)
        per_step.append(ys)
        inp = ys[0]
    final = tuple([torch.stack(parts, dim=1) for parts in zip(*finals)])
    if not opts.segment_states:
        return inp.transpose(0, 1), final, None
    return inp.transpose(0, 1), final, tuple([torch.stack(parts, dim=2).transpose(0, 1) for parts in zip(*per_step)])
