"""``scan``: ``torch._higher_order_ops.scan`` over time, one layer at a time.

Each layer projects its whole input sequence in one GEMM, then runs the recurrent part over
time (:func:`~.scan_parts.time_loop`): under ``torch.compile`` through torch's ``scan`` (traced once,
compile time bounded in ``T``); eagerly as a plain Python loop over the same step function.
Eager ``scan`` would trace and compile its step on every call, and cannot run under eager
``torch.func.grad``/``vjp`` (dynamo refuses functorch's grad-tracking tensors); the loop is exact,
composes with every functorch transform and skips that tracing.
The scanned step returns cloned carries: scan forbids outputs that alias its inputs
(inductor's backward otherwise fails with "scan might be aliasing").

When autograd records a layer, it runs through :class:`~.scan_parts.HandWrittenLayer`, an
``autograd.Function`` whose backward is a hand-written reverse scan over the cell's step
backward, in one of two modes:

* ``recompute="none"``: the forward keeps every step's activations
  (:meth:`~rnn_functional.cells.Cell.layer_step_saving`: the LSTM's activated gates,
  ``4H`` per step); the backward consumes them (one recurrent GEMM per step, none redone).
* ``recompute="full"``: the forward keeps only the layer's input and its carry after every step;
  the backward rebuilds each step from the saved carry (two more GEMMs per step: the input
  projection and the recurrent one). Activation memory per step drops from the gates to the
  carry (``P + H`` for the LSTM, ``H`` for the GRU); the layer's input is kept by its producer.
  (``torch.utils.checkpoint`` around the scan higher-order op is unsupported on torch 2.13,
  eager and compiled; this custom function works in both.)

Its backward is itself differentiable: under ``create_graph=True`` (or ``torch.func``'s nested transforms) it is
the vjp of the layer's plain steps, replayed (:func:`~.scan_parts._replayed_backward`), so second and higher
orders are exact. Eager forward-mode AD (``torch.func.jvp``/``jacfwd``/``hessian``, dual tensors) runs the plain
step loop under autograd instead (Dynamo refuses an ``autograd.Function`` with a ``jvp`` method); ``recompute``
then saves no memory.

Never torch's own scan autograd: Inductor's in-place buffer reuse miscompiles its backward on
torch 2.13 (silently wrong recurrent-weight gradients with two chained scans and for a GRU's
``bias_hh``, pytorch/pytorch#153679), while the hand-written reverse scan compiles correctly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..cells import Carry, LayerWeights, Layout, between_layers
from . import ensemble_scan
from .base import SequenceOptions, forward_mode
from .scan_parts import HandWrittenLayer, scan_states, traced_under_grad


def _own_cotangent(t: torch.Tensor) -> torch.Tensor:
    """``t`` (a final carry) whose backward hands the scan a cotangent of its own.

    Under ``torch.compile``, a loss such as ``(h_T + c_T).sum()`` gives the final ``h`` and
    ``c`` cotangents that are views of one tensor; scan's compiled backward then fails with
    "scan might be aliasing the input or the output" (torch 2.13). The backward of ``* 1``
    is a fresh ``grad * 1`` per carry; ``clone``/``+ 0`` would pass the aliased views through.
    """
    return t * 1


def _distinct(values: tuple) -> tuple:
    """``values`` with each repeated tensor (tied params: one bias under two keys) replaced by a view of it: Dynamo
    refuses an ``autograd.Function`` given one tensor twice ("duplicate tensor input"); the gradients still sum."""
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
    cell = layout.cell
    inp = x
    finals, per_step = [], []
    mask_t = None if is_init is None else is_init.transpose(0, 1)  # [T, N]
    for k in range(layout.num_layers):
        w = cell.layer_weights(params, layout, k)
        layer_carry = tuple(s[:, k] for s in carry)
        reset_k = None if reset is None else tuple(r[:, :, k].transpose(0, 1) for r in reset)  # [T, N, S]
        recompute = opts.recompute == "full"
        layer_inputs = (len(layer_carry), reset_k is not None, inp, mask_t, *layer_carry, *(reset_k or ()), *w.tensors())
        if ensemble_scan.serves(recompute, inp, mask_t, *layer_carry, *(reset_k or ()), *w.tensors()):
            # compiled torch.vmap with autograd: the ensemble op (torch cannot vmap the layer below there)
            states = ensemble_scan.layer_states(cell, recompute, *layer_inputs)
            final, ys = tuple(s[-1] for s in states), (states if opts.segment_states else states[0])
        elif _needs_grad(inp, *layer_carry, *(reset_k or ()), w) and not forward_mode() and not traced_under_grad():
            if torch.compiler.is_compiling():
                layer_inputs = _distinct(layer_inputs)
            states = HandWrittenLayer.apply(cell, recompute, 0, *layer_inputs)[: len(layer_carry)]
            final, ys = tuple(s[-1] for s in states), (states if opts.segment_states else states[0])
        else:
            gi = F.linear(inp, w.weight_ih, w.bias_ih).transpose(0, 1)  # [T, N, G*H]
            final, ys = scan_states(cell, w.tensors(), layer_carry, gi, mask_t, reset_k, "states" if opts.segment_states else "h")
        finals.append(tuple(_own_cotangent(s) for s in final))
        if opts.segment_states:
            per_step.append(tuple(s.transpose(0, 1) for s in ys))  # [N, T, S]
            ys = ys[0]
        inp = between_layers(ys.transpose(0, 1), k, layout, opts.dropout, opts.training)
    states = tuple(torch.stack(parts, dim=2) for parts in zip(*per_step)) if opts.segment_states else None
    return inp, tuple(torch.stack(parts, dim=1) for parts in zip(*finals)), states
