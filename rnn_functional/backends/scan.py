"""``scan``: ``torch._higher_order_ops.scan`` over time, one layer at a time.

Each layer projects its whole input sequence in one GEMM, then runs the recurrent part over
time (:func:`_time_loop`): under ``torch.compile`` through torch's ``scan`` (traced once,
compile time bounded in ``T``); eagerly as a plain Python loop over the same step function.
Eager ``scan`` would trace and compile its step on every call, and cannot run under eager
``torch.func.grad``/``vjp`` (dynamo refuses functorch's grad-tracking tensors); the loop is exact,
composes with every functorch transform and skips that tracing.
The scanned step returns cloned carries: scan forbids outputs that alias its inputs
(inductor's backward otherwise fails with "scan might be aliasing").

When autograd records a layer, it runs through :class:`_HandWrittenLayer`, an
``autograd.Function`` whose backward is a hand-written reverse scan over the cell's step
backward, in one of two modes:

* ``recompute="none"``: the forward keeps every step's activations
  (:meth:`~rnn_functional.cells.Cell.layer_step_saving`: the LSTM's gates and ``tanh(c)``,
  ``5H`` per step); the backward consumes them (one recurrent GEMM per step, none redone).
* ``recompute="full"``: the forward keeps only the layer's input and its carry after every step;
  the backward rebuilds each step from the saved carry (two more GEMMs per step: the input
  projection and the recurrent one). Activation memory per step drops from the gates to the
  carry (``P + H`` for the LSTM, ``H`` for the GRU); the layer's input is kept by its producer.
  (``torch.utils.checkpoint`` around the scan higher-order op is unsupported on torch 2.13,
  eager and compiled; this custom function works in both.)

Never torch's own scan autograd: Inductor's in-place buffer reuse miscompiles its backward on
torch 2.13 (silently wrong recurrent-weight gradients with two chained scans and for a GRU's
``bias_hh``, pytorch/pytorch#153679), while the hand-written reverse scan compiles correctly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch._higher_order_ops import scan as _scan

from ..cells import Carry, Cell, LayerWeights, Layout, apply_reset, between_layers, broadcast_mask
from .base import SequenceOptions


def _contiguous_copy(t: torch.Tensor) -> torch.Tensor:
    return t.clone(memory_format=torch.contiguous_format)


def _own_cotangent(t: torch.Tensor) -> torch.Tensor:
    """``t`` (a final carry) whose backward hands the scan a cotangent of its own.

    Under ``torch.compile``, a loss such as ``(h_T + c_T).sum()`` gives the final ``h`` and
    ``c`` cotangents that are views of one tensor; scan's compiled backward then fails with
    "scan might be aliasing the input or the output" (torch 2.13). The backward of ``* 1``
    is a fresh ``grad * 1`` per carry; ``clone``/``+ 0`` would pass the aliased views through.
    """
    return t * 1


def _batched_like_step(init, *reads: torch.Tensor | None):
    """``init`` (a pytree of tensors) carrying the vmap batch dims of every tensor the scanned step reads.

    torch's vmap rule for ``scan`` gives the carry the batch dims of ``init``. Under
    ``torch.vmap`` over stacked params (or batched inputs/resets) with an unbatched initial
    state, the step's carry is batched while ``init`` is not, and scan fails ("Expected init
    and carry to have same metadata"). Adding a zero read from each of those tensors gives
    ``init`` their batch dims; outside vmap it adds an exact 0.
    """
    leaves = pytree.tree_leaves(init)
    zero = sum(torch.zeros_like(t.flatten()[:1], dtype=leaves[0].dtype).sum() for t in (*leaves, *reads) if t is not None)
    return pytree.tree_map(lambda s: _contiguous_copy(s) + zero, init)


def _time_loop(step, init, xs, reads=(), reverse: bool = False):
    """``step(carry, xs_t) -> (carry, out_t)`` over the leading (time) dim of every tensor in ``xs``.

    Returns ``(final carry, outputs stacked along a new dim 0)``. With ``reverse`` the steps run
    from the last index to the first and the outputs are stacked in the order they ran (index 0
    is the last time step). Under ``torch.compile`` this is torch's ``scan`` (``reads``: the
    tensors the step closes over, see :func:`_batched_like_step`); eagerly a Python loop.
    """
    if torch.compiler.is_compiling():
        if reverse:
            xs = pytree.tree_map(lambda t: t.flip(0), xs)
        return _scan(step, _batched_like_step(init, *reads), xs)
    leaves, spec = pytree.tree_flatten(xs)
    t_len = leaves[0].shape[0]
    carry, outs = init, []
    for t in (range(t_len - 1, -1, -1) if reverse else range(t_len)):
        carry, out = step(carry, pytree.tree_unflatten([leaf[t] for leaf in leaves], spec))
        outs.append(out)
    return carry, pytree.tree_map(lambda *per_step: torch.stack(per_step), *outs)


def _own(t: torch.Tensor) -> torch.Tensor:
    """A step output that aliases nothing under ``torch.compile`` (scan's rule); as is eagerly."""
    return _contiguous_copy(t) if torch.compiler.is_compiling() else t


def _scan_states(cell: Cell, w: LayerWeights, carry: Carry, gi: torch.Tensor, mask, reset, keep: str):
    """Run one layer over time-major ``gi [T, N, G*H]`` from ``carry`` (tuple of ``[N, S]``).

    ``mask [T, N]`` / ``reset`` (tuple of ``[T, N, S]``) apply the resets. Returns
    ``(final carry, ys)``; ``ys`` per ``keep``: ``"h"`` the output ``[T, N, P]``, ``"states"`` every
    per-step carry (tuple of ``[T, N, S]``), ``"saved"`` the per-step carries and the activations
    each step saves for its backward (tuple of ``[T, N, ·]``), concatenated.
    """
    xs: dict[str, object] = {"gi": gi}
    if mask is not None:
        xs["mask"] = mask
        if reset is not None:
            xs["reset"] = reset

    def step(layer_carry, xs_t):
        layer_carry = apply_reset(layer_carry, xs_t.get("mask"), xs_t.get("reset"))
        new, saved = cell.layer_step_saving(xs_t["gi"], layer_carry, w)
        new = tuple(_own(s) for s in new)
        out = {"h": new[0], "states": new, "saved": (*new, *saved)}[keep]
        return new, (tuple(_own(s) for s in out) if keep != "h" else _own(new[0]))

    return _time_loop(step, carry, xs, reads=(gi, *w.tensors()[2:], mask, *(reset or ())))


def _sum_rows(t: torch.Tensor) -> torch.Tensor:
    """``[T, N, G] -> [G]``."""
    return t.sum(dim=(0, 1))


def _outer_sum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``sum_{t, n} a[t, n]^T b[t, n]``: ``[T, N, G], [T, N, K] -> [G, K]`` (one GEMM)."""
    return a.flatten(0, 1).transpose(0, 1) @ b.flatten(0, 1)


class _HandWrittenLayer(torch.autograd.Function):
    """One layer over time whose backward is a hand-written reverse scan (see the module doc).

    ``apply(cell, recompute, n_carry, has_reset, inp [N, T, F], mask [T, N] | None, *carry0 ([N, S] each),
    *reset ([T, N, S] each, if has_reset), *LayerWeights.tensors())`` (absent weights are ``None``)
    returns the carry after every step, a tuple of ``[T, N, S]``, followed (unless ``recompute``) by the
    per-step activations of :meth:`~rnn_functional.cells.Cell.layer_step_saving` (``[T, N, ·]`` each,
    not differentiable). Saved for backward: ``inp``, the carries, the reset states and those activations.

    The backward runs in reversed time carrying the cotangent of the carry: each step applies the
    cell's hand-written backward, from the saved activations
    (:meth:`~rnn_functional.cells.Cell.step_backward_saved`) or recomputing them from ``inp`` and
    the saved carry before the step, after its reset (:meth:`~rnn_functional.cells.Cell.step_backward`).
    It emits the cotangents of the input and recurrent projections, from which the weight and input
    gradients are a few whole-sequence GEMMs after the loop, and sums the gradients of the cell's
    ``extra`` weights in its carry. (Hand-written rather than ``torch.func.vjp``, which refuses to run
    while saved-tensor hooks are active, e.g. under ``torch.autograd.graph.save_on_cpu`` or when
    ``torch.compile`` traces this backward there.)
    """

    generate_vmap_rule = True  # ensembles: torch.vmap over stacked params runs forward and backward batched

    @staticmethod
    def forward(cell: Cell, recompute: bool, n_carry: int, has_reset: bool, inp, mask, *rest):
        carry0, reset, weights = _split(rest, n_carry, has_reset)
        w = LayerWeights.from_tensors(weights)
        gi = F.linear(inp, w.weight_ih, w.bias_ih).transpose(0, 1)  # [T, N, G*H]
        _, outs = _scan_states(cell, w, carry0, gi, mask, reset, keep="states" if recompute else "saved")
        return tuple(outs)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        cell, recompute, n_carry, has_reset, inp, mask, *rest = inputs
        carry0, reset, weights = _split(rest, n_carry, has_reset)
        saved = output[n_carry:]
        ctx.mark_non_differentiable(*saved)
        ctx.cell, ctx.n_carry, ctx.n_weights, ctx.n_reset = cell, n_carry, len(weights), len(reset or ())
        ctx.save_for_backward(inp, mask, *carry0, *weights, *output, *(reset or ()))

    @staticmethod
    def backward(ctx, *grad_outputs):
        n, n_w, cell = ctx.n_carry, ctx.n_weights, ctx.cell
        inp, mask, *rest = ctx.saved_tensors
        carry0, weights, outputs = rest[:n], rest[n : n + n_w], rest[n + n_w : len(rest) - ctx.n_reset]
        reset = tuple(rest[len(rest) - ctx.n_reset :])
        states, saved, grad_states = outputs[:n], tuple(outputs[n:]), grad_outputs[:n]
        w = LayerWeights.from_tensors(weights)
        extra = [t for t in w.extra if t is not None]  # their gradients are summed in the loop's carry
        # the carry each step starts from: the state after the previous step (carry0 at step 0), reset where mask
        pre = apply_reset(
            tuple(torch.cat([c0.unsqueeze(0), s[:-1]]) for c0, s in zip(carry0, states)), mask, reset or None
        )
        xs = {"pre": pre, "g": tuple(grad_states)}
        if saved:
            xs["saved"] = saved
        else:
            xs["x"] = inp.transpose(0, 1)
        if mask is not None:
            xs["mask"] = mask

        def back_step(acc, xs_t):
            d_new = tuple(a + b for a, b in zip(acc["d_carry"], xs_t["g"]))
            if saved:
                d_pre, d_gi, d_gh, d_extra = cell.step_backward_saved(xs_t["saved"], xs_t["pre"], w, d_new)
            else:
                gi = F.linear(xs_t["x"], w.weight_ih, w.bias_ih)
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

        init = {"d_carry": tuple(torch.zeros_like(c) for c in carry0)}
        if extra:
            init["d_extra"] = tuple(torch.zeros_like(t) for t in extra)
        reads = (inp, mask, *pre, *grad_states, *reset, *saved, *(wt for wt in weights if wt is not None))
        # Reversed time: the outputs come back with index 0 = step T - 1 (under compile the scan then
        # needs no ``reverse``, whose flips of its outputs would copy the [T, N, G*H] gate cotangents);
        # the weight gradients are sums over time, indifferent to the order.
        acc, outs = _time_loop(back_step, init, xs, reads, reverse=True)
        d_gi = outs["d_gi"]  # [T, N, G*H], reversed time
        d_gh = outs.get("d_gh", d_gi)
        d_extra = iter(acc.get("d_extra", ()))
        d_weights = (
            _outer_sum(d_gi, inp.transpose(0, 1).flip(0)),
            _sum_rows(d_gi) if w.bias_ih is not None else None,
            _outer_sum(d_gh, pre[0].flip(0)),
            _sum_rows(d_gh) if w.bias_hh is not None else None,
            *(None if t is None else next(d_extra) for t in w.extra),
        )
        d_reset = tuple(d.flip(0) for d in outs.get("d_reset", ()))
        d_inp = (d_gi @ w.weight_ih).flip(0).transpose(0, 1)
        return (None, None, None, None, d_inp, None, *acc["d_carry"], *d_reset, *d_weights)


def _split(rest, n_carry: int, has_reset: bool):
    """``rest`` of :class:`_HandWrittenLayer`'s inputs -> ``(carry0, reset or None, weights)``."""
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
        if _needs_grad(inp, *layer_carry, *(reset_k or ()), w):
            outs = _HandWrittenLayer.apply(
                cell, opts.recompute == "full", len(layer_carry), reset_k is not None, inp, mask_t, *layer_carry,
                *(reset_k or ()), *w.tensors(),
            )
            states = outs[: len(layer_carry)]
            final, ys = tuple(s[-1] for s in states), (states if opts.segment_states else states[0])
        else:
            gi = F.linear(inp, w.weight_ih, w.bias_ih).transpose(0, 1)  # [T, N, G*H]
            final, ys = _scan_states(cell, w, layer_carry, gi, mask_t, reset_k, "states" if opts.segment_states else "h")
        finals.append(tuple(_own_cotangent(s) for s in final))
        if opts.segment_states:
            per_step.append(tuple(s.transpose(0, 1) for s in ys))  # [N, T, S]
            ys = ys[0]
        inp = between_layers(ys.transpose(0, 1), k, layout, opts.dropout, opts.training)
    states = tuple(torch.stack(parts, dim=2) for parts in zip(*per_step)) if opts.segment_states else None
    return inp, tuple(torch.stack(parts, dim=1) for parts in zip(*finals)), states
