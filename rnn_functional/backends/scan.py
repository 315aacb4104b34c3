"""``scan``: one layer at a time, the input projected in one GEMM, then the recurrence over time
(:func:`~.scan_parts.time_loop`): torch's ``scan`` under ``torch.compile`` (traced once, compile time bounded in
``T``), a plain Python loop over the same step eagerly (eager ``scan`` would retrace every call and cannot run under
``torch.func.grad``).

When autograd records a layer it runs through :class:`~.scan_parts.HandWrittenLayer`, whose backward is a
hand-written reverse scan: ``recompute="none"`` keeps every step's activations
(:meth:`~rnn_functional.cells.Cell.layer_step_saving`); ``recompute="full"`` keeps the carries only and rebuilds each
step in the backward (two more GEMMs per step; ``torch.utils.checkpoint`` around ``scan`` is unsupported). That
backward is differentiable (a replayed vjp of the plain steps), so higher orders are exact; forward-mode AD runs the
plain loop under autograd. Never torch's own scan autograd: Inductor miscompiles its backward (silently wrong
gradients, pytorch/pytorch#153679).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..cells import Carry, LayerWeights, Layout, between_layers
from . import ensemble_scan
from .base import SequenceOptions, forward_mode
from .scan_parts import HandWrittenLayer, scan_states, traced_under_grad


def _distinct(values: tuple) -> tuple:
    """``values`` with each repeated tensor (tied params) replaced by a view: Dynamo refuses an
    ``autograd.Function`` given one tensor twice; the gradients still sum."""
    out = []
    for v in values:
        out.append(v.view_as(v) if isinstance(v, torch.Tensor) and any(v is u for u in out) else v)
    return tuple(out)


def _needs_grad(*values) -> bool:
    """True when autograd will record this layer (tensors, or a LayerWeights, among ``values``)."""
    if not torch.is_grad_enabled():
        return False
    tensors = [t for v in values for t in (v.tensors() if isinstance(v, LayerWeights) else (v,))]
    return any(t is not None and t.requires_grad for t in tensors)


def sequence(layout: Layout, params, x, carry: Carry, is_init, reset, opts: SequenceOptions):
    """``x [N, T, F]`` -> ``(y [N, T, P], carry, per-step carries)``; see :mod:`.base`."""
    cell, inp, finals, per_step = layout.cell, x, [], []
    mask_t = None if is_init is None else is_init.transpose(0, 1)  # [T, N]
    for k in range(layout.num_layers):
        w = cell.layer_weights(params, layout, k)
        layer_carry = tuple([s[:, k] for s in carry])
        reset_k = None if reset is None else tuple([r[:, :, k].transpose(0, 1) for r in reset])  # [T, N, S]
        recompute = opts.recompute == "full"
        layer_inputs = (len(layer_carry), reset_k is not None, inp, mask_t, *layer_carry, *(reset_k or ()), *w.tensors())
        if ensemble_scan.serves(recompute, inp, mask_t, *layer_carry, *(reset_k or ()), *w.tensors()):
            # compiled torch.vmap with autograd: the ensemble op (torch cannot vmap the layer below there)
            states = ensemble_scan.layer_states(cell, recompute, *layer_inputs)
            final, ys = tuple([s[-1] for s in states]), (states if opts.segment_states else states[0])
        elif _needs_grad(inp, *layer_carry, *(reset_k or ()), w) and not forward_mode() and not traced_under_grad():
            if torch.compiler.is_compiling():
                layer_inputs = _distinct(layer_inputs)
            states = HandWrittenLayer.apply(cell, recompute, 0, *layer_inputs)[: len(layer_carry)]
            final, ys = tuple([s[-1] for s in states]), (states if opts.segment_states else states[0])
        else:
            gi = F.linear(inp, w.weight_ih, w.bias_ih).transpose(0, 1)  # [T, N, G*H]
            final, ys = scan_states(cell, w.tensors(), layer_carry, gi, mask_t, reset_k, "states" if opts.segment_states else "h")
        # ``* 1``: each final carry's backward hands the scan a cotangent of its own, where a loss such as
        # ``(h_T + c_T).sum()`` gives views of one tensor, which scan rejects ("scan might be aliasing")
        finals.append(tuple([s * 1 for s in final]))
        if opts.segment_states:
            per_step.append(tuple([s.transpose(0, 1) for s in ys]))  # [N, T, S]
            ys = ys[0]
        inp = between_layers(ys.transpose(0, 1), k, layout, opts.dropout, opts.training)
    states = tuple([torch.stack(parts, dim=2) for parts in zip(*per_step)]) if opts.segment_states else None
    return inp, tuple([torch.stack(parts, dim=1) for parts in zip(*finals)]), states
