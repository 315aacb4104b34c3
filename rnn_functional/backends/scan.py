"""``scan``: ``torch._higher_order_ops.scan`` over time, one layer at a time.

Each layer projects its whole input sequence in one GEMM, then scans the recurrent part.
The scanned step returns cloned carries: scan forbids outputs that alias its inputs
(inductor's backward otherwise fails with "scan might be aliasing").

``recompute="full"``: every layer runs through :class:`_RecomputedLayer`, whose forward
scans without autograd and keeps only the layer's input and its carry after every step;
its backward is a reverse scan that rebuilds each step from the saved carry and runs the
cell's hand-written backward on it. The per-step gates are never stored: activation memory
per step drops from the gates and their nonlinearities to the carry (``P + H`` for the LSTM,
``H`` for the GRU); the layer's input is kept by its producer anyway.
(``torch.utils.checkpoint`` around the scan higher-order op is unsupported on torch 2.13,
eager and compiled; this custom function works in both.)

Under ``torch.compile``, when gradients are recorded, every layer takes that path whatever
``recompute`` says: Inductor's
in-place buffer reuse miscompiles the backward of torch's own scan autograd on torch 2.13
(silently wrong recurrent-weight gradients with two chained scans and for a GRU's
``bias_hh``, pytorch/pytorch#153679), while the hand-written reverse scan compiles
correctly, at the same speed (``benchmarks/results/recompute_cpu.json``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..cells import Carry, Cell, LayerWeights, Layout, apply_reset, between_layers, broadcast_mask
from . import ensemble_scan
from .base import SequenceOptions
from .scan_parts import contiguous_copy as _contiguous_copy, outer_sum as _outer_sum, scan as _scan, sum_rows as _sum_rows


def _own_cotangent(t: torch.Tensor) -> torch.Tensor:
    """``t`` (a final carry) whose backward hands the scan a cotangent of its own.

    Under ``torch.compile``, a loss such as ``(h_T + c_T).sum()`` gives the final ``h`` and
    ``c`` cotangents that are views of one tensor; scan's compiled backward then fails with
    "scan might be aliasing the input or the output" (torch 2.13). The backward of ``* 1``
    is a fresh ``grad * 1`` per carry; ``clone``/``+ 0`` would pass the aliased views through.
    """
    return t * 1


def _batched_like_step(init: Carry, *reads: torch.Tensor | None) -> Carry:
    """``init`` carrying the vmap batch dims of every tensor the scanned step reads.

    torch's vmap rule for ``scan`` gives the carry the batch dims of ``init``. Under
    ``torch.vmap`` over stacked params (or batched inputs/resets) with an unbatched initial
    state, the step's carry is batched while ``init`` is not, and scan fails ("Expected init
    and carry to have same metadata"). Adding a zero read from each of those tensors gives
    ``init`` their batch dims; outside vmap it adds an exact 0.
    """
    zero = sum(torch.zeros_like(t.flatten()[:1], dtype=init[0].dtype).sum() for t in (*init, *reads) if t is not None)
    return tuple(s + zero for s in init)


def _scan_states(cell: Cell, w: LayerWeights, carry: Carry, gi: torch.Tensor, mask, reset, all_states: bool):
    """Scan one layer over time-major ``gi [T, N, G*H]`` from ``carry`` (tuple of ``[N, S]``).

    ``mask [T, N]`` / ``reset`` (tuple of ``[T, N, S]``) apply the resets. Returns
    ``(final carry, ys)``: ``ys`` is the output ``[T, N, P]``, or every per-step carry
    (tuple of ``[T, N, S]``) with ``all_states``.
    """
    xs: dict[str, object] = {"gi": gi}
    if mask is not None:
        xs["mask"] = mask
        if reset is not None:
            xs["reset"] = reset

    def step(layer_carry, xs_t):
        layer_carry = apply_reset(layer_carry, xs_t.get("mask"), xs_t.get("reset"))
        new = cell.layer_step(xs_t["gi"], layer_carry, w)
        out = tuple(_contiguous_copy(s) for s in new) if all_states else new[0]
        return tuple(_contiguous_copy(s) for s in new), out

    init = tuple(_contiguous_copy(s) for s in carry)
    init = _batched_like_step(init, gi, *w.tensors()[2:], mask, *(reset or ()))
    return _scan(step, init, xs)


class _RecomputedLayer(torch.autograd.Function):
    """One layer over time whose backward recomputes every step from the saved carries.

    ``apply(cell, n_carry, has_reset, inp [N, T, F], mask [T, N] | None, *carry0 ([N, S] each),
    *reset ([T, N, S] each, if has_reset), *LayerWeights.tensors())`` (absent weights are ``None``)
    returns the carry after every step, a tuple of ``[T, N, S]``.
    Saved for backward: ``inp``, the carries and the reset states, never the gates.

    The backward is a reverse scan carrying the cotangent of the carry: each step recomputes
    its input projection and gates from the saved carry before it (after its reset) and applies
    the cell's hand-written backward (:meth:`~rnn_functional.cells.Cell.step_backward`); it emits
    the cotangents of the input and recurrent projections, from which the weight and input
    gradients are a few whole-sequence GEMMs after the scan, and sums the gradients of the cell's
    ``extra`` weights in its carry. (Hand-written rather than
    ``torch.func.vjp``, which refuses to run while saved-tensor hooks are active, e.g. under
    ``torch.autograd.graph.save_on_cpu`` or when ``torch.compile`` traces this backward there.)
    """

    generate_vmap_rule = True  # ensembles: torch.vmap over stacked params runs forward and backward batched

    @staticmethod
    def forward(cell: Cell, n_carry: int, has_reset: bool, inp, mask, *rest):
        carry0, reset, weights = _split(rest, n_carry, has_reset)
        w = LayerWeights.from_tensors(weights)
        gi = F.linear(inp, w.weight_ih, w.bias_ih).transpose(0, 1)  # [T, N, G*H]
        _, states = _scan_states(cell, w, carry0, gi, mask, reset, all_states=True)
        return tuple(states)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        cell, n_carry, has_reset, inp, mask, *rest = inputs
        carry0, reset, weights = _split(rest, n_carry, has_reset)
        ctx.cell, ctx.n_carry, ctx.n_weights = cell, n_carry, len(weights)
        ctx.save_for_backward(inp, mask, *carry0, *weights, *output, *(reset or ()))

    @staticmethod
    def backward(ctx, *grad_states):
        n, n_w, cell = ctx.n_carry, ctx.n_weights, ctx.cell
        inp, mask, *saved = ctx.saved_tensors
        carry0, weights = saved[:n], saved[n : n + n_w]
        states, reset = saved[n + n_w : 2 * n + n_w], tuple(saved[2 * n + n_w :])
        w = LayerWeights.from_tensors(weights)
        extra = [t for t in w.extra if t is not None]  # their gradients are summed in the scan carry
        # Everything runs in reversed time (index 0 = step T - 1): the scan then needs no `reverse`,
        # whose flips of its outputs would copy the [T, N, G*H] gate cotangents; the weight
        # gradients are sums over time, indifferent to the order.
        xs = {"x": inp.transpose(0, 1).flip(0), "g": tuple(g.flip(0) for g in grad_states)}
        mask_r = None if mask is None else mask.flip(0)
        reset_r = tuple(r.flip(0) for r in reset) or None
        # the carry each step starts from: the state after the previous step (carry0 at step 0), reset where mask
        pre = tuple(torch.cat([s[:-1].flip(0), c0.unsqueeze(0)]) for c0, s in zip(carry0, states))
        xs["pre"] = pre = apply_reset(pre, mask_r, reset_r)
        if mask_r is not None:
            xs["mask"] = mask_r

        def back_step(acc, xs_t):
            gi = F.linear(xs_t["x"], w.weight_ih, w.bias_ih)
            d_new = tuple(a + b for a, b in zip(acc["d_carry"], xs_t["g"]))
            d_pre, d_gi, d_gh, d_extra = cell.step_backward(gi, xs_t["pre"], w, d_new)
            out = {"d_gi": d_gi} if d_gh is None else {"d_gi": d_gi, "d_gh": d_gh}
            m = xs_t.get("mask")
            if m is not None:  # where the carry was reset, its cotangent goes to reset_state (or nowhere)
                if reset:
                    out["d_reset"] = tuple(torch.where(broadcast_mask(m, d), d, 0.0) for d in d_pre)
                d_pre = tuple(torch.where(broadcast_mask(m, d), 0.0, d) for d in d_pre)
            new_acc = {"d_carry": tuple(d_pre)}  # same keys in the same order as init
            if extra:
                new_acc["d_extra"] = tuple(a + d for a, d in zip(acc["d_extra"], (d for d in d_extra if d is not None)))
            return new_acc, out

        reads = (inp, mask, *pre, *grad_states, *reset, *(wt for wt in weights if wt is not None))
        init = {"d_carry": _batched_like_step(tuple(torch.zeros_like(c) for c in carry0), *reads)}
        if extra:
            init["d_extra"] = _batched_like_step(tuple(torch.zeros_like(t) for t in extra), *reads)
        acc, outs = _scan(back_step, init, xs)

        d_gi = outs["d_gi"]  # [T, N, G*H], reversed time
        d_gh = outs.get("d_gh", d_gi)
        d_extra = iter(acc.get("d_extra", ()))
        d_weights = (
            _outer_sum(d_gi, xs["x"]),
            _sum_rows(d_gi) if w.bias_ih is not None else None,
            _outer_sum(d_gh, pre[0]),
            _sum_rows(d_gh) if w.bias_hh is not None else None,
            *(None if t is None else next(d_extra) for t in w.extra),
        )
        d_reset = tuple(d.flip(0) for d in outs.get("d_reset", ()))
        d_inp = (d_gi @ w.weight_ih).flip(0).transpose(0, 1)
        return (None, None, None, d_inp, None, *acc["d_carry"], *d_reset, *d_weights)


def _split(rest, n_carry: int, has_reset: bool):
    """``rest`` of :class:`_RecomputedLayer`'s inputs -> ``(carry0, reset or None, weights)``."""
    carry0 = tuple(rest[:n_carry])
    reset = tuple(rest[n_carry : 2 * n_carry]) if has_reset else None
    weights = tuple(rest[n_carry * (2 if has_reset else 1) :])
    return carry0, reset, weights


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
        if ensemble_scan.serves(opts.recompute == "full", inp, mask_t, *layer_carry, *(reset_k or ()), *w.tensors()):
            # compiled torch.vmap with autograd: the native ensemble layer (torch cannot vmap the one below)
            states = ensemble_scan.layer_states(
                cell, len(layer_carry), reset_k is not None, inp, mask_t, *layer_carry, *(reset_k or ()), *w.tensors()
            )
            final, ys = tuple(s[-1] for s in states), (states if opts.segment_states else states[0])
        elif opts.recompute == "full" or (torch.compiler.is_compiling() and _needs_grad(inp, *layer_carry, *(reset_k or ()), w)):
            states = _RecomputedLayer.apply(
                cell, len(layer_carry), reset_k is not None, inp, mask_t, *layer_carry, *(reset_k or ()), *w.tensors()
            )
            final, ys = tuple(s[-1] for s in states), (states if opts.segment_states else states[0])
        else:
            gi = F.linear(inp, w.weight_ih, w.bias_ih).transpose(0, 1)  # [T, N, G*H]
            final, ys = _scan_states(cell, w, layer_carry, gi, mask_t, reset_k, opts.segment_states)
        finals.append(tuple(_own_cotangent(s) for s in final))
        if opts.segment_states:
            per_step.append(tuple(s.transpose(0, 1) for s in ys))  # [N, T, S]
            ys = ys[0]
        inp = between_layers(ys.transpose(0, 1), k, layout, opts.dropout, opts.training)
    states = tuple(torch.stack(parts, dim=2) for parts in zip(*per_step)) if opts.segment_states else None
    return inp, tuple(torch.stack(parts, dim=1) for parts in zip(*finals)), states
