"""``scan``: ``torch._higher_order_ops.scan`` over time, one layer at a time.

Each layer projects its whole input sequence in one GEMM, then scans the recurrent part.
The scanned step returns cloned carries: scan forbids outputs that alias its inputs
(inductor's backward otherwise fails with "scan might be aliasing").

``recompute="full"``: every layer runs through :class:`_RecomputedLayer`, whose forward
scans without autograd and keeps only the layer's input and its carry after every step;
its backward is a reverse scan that rebuilds each step from the saved carry and pulls the
cotangent through it with :func:`torch.func.vjp`. The per-step gates are never stored:
activation memory per step drops from the gates and their nonlinearities to ``F + P (+ H)``.
(``torch.utils.checkpoint`` around the scan higher-order op is unsupported on torch 2.13,
eager and compiled; this custom function works in both.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._higher_order_ops import scan as _scan

from .._layout import LayerWeights, layer_weights
from ..functional._core import (
    Carry,
    CellSpec,
    SequenceOptions,
    apply_reset,
    between_layers,
    broadcast_mask,
    keep_segment_ends,
)


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


def _batched_like_step(init: Carry, *reads: torch.Tensor | None) -> Carry:
    """``init`` carrying the vmap batch dims of every tensor the scanned step reads.

    torch's vmap rule for ``scan`` gives the carry the batch dims of ``init``. Under
    ``torch.vmap`` over stacked params (or batched inputs/resets) with an unbatched initial
    state, the step's carry is batched while ``init`` is not, and scan fails ("Expected init
    and carry to have same metadata"). Adding a zero read from each of those tensors gives
    ``init`` their batch dims; outside vmap it adds an exact 0.

    The zeros are expanded and cloned first: the clone of a stride-0 expand keeps the vmap dims
    innermost in memory, so ``init`` is still contiguous once scan's vmap rule moves those dims
    last (compiled autograd through scan requires a contiguous ``init``).
    """
    zero = sum(torch.zeros_like(t.flatten()[:1], dtype=init[0].dtype).sum() for t in (*init, *reads) if t is not None)
    return tuple(zero.expand(s.shape).clone() + s for s in init)


def _scan_states(cell: CellSpec, w: LayerWeights, carry: Carry, gi: torch.Tensor, mask, reset, all_states: bool):
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
    init = _batched_like_step(init, gi, w.weight_hh, w.bias_hh, w.weight_hr, mask, *(reset or ()))
    return _scan(step, init, xs)


class _RecomputedLayer(torch.autograd.Function):
    """One layer over time whose backward recomputes every step from the saved carries.

    ``apply(cell, n_carry, has_reset, inp [T, N, F], mask [T, N] | None, *carry0 ([N, S] each),
    *reset ([T, N, S] each, if has_reset), weight_ih, weight_hh, bias_ih, bias_hh, weight_hr)``
    (absent weights are ``None``) returns the carry after every step, a tuple of ``[T, N, S]``.
    Saved for backward: ``inp``, the carries and the reset states, never the gates.
    """

    generate_vmap_rule = True  # ensembles: torch.vmap over stacked params runs forward and backward batched

    @staticmethod
    def forward(cell: CellSpec, n_carry: int, has_reset: bool, inp, mask, *rest):
        carry0, reset, weights = _split(rest, n_carry, has_reset)
        w = LayerWeights(*weights)
        gi = F.linear(inp, w.weight_ih, w.bias_ih)
        _, states = _scan_states(cell, w, carry0, gi, mask, reset, all_states=True)
        return tuple(states)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        cell, n_carry, has_reset, inp, mask, *rest = inputs
        carry0, reset, weights = _split(rest, n_carry, has_reset)
        ctx.cell, ctx.n_carry = cell, n_carry
        ctx.save_for_backward(inp, mask, *carry0, *weights, *output, *(reset or ()))

    @staticmethod
    def backward(ctx, *grad_states):
        n, cell = ctx.n_carry, ctx.cell
        inp, mask, *saved = ctx.saved_tensors
        carry0, weights, states, reset = saved[:n], saved[n : n + 5], saved[n + 5 : 2 * n + 5], saved[2 * n + 5 :]
        present = [wt is not None for wt in weights]
        live = [wt for wt in weights if wt is not None]

        def step_from(x_t, pre, *ws):
            it = iter(ws)
            w = LayerWeights(*(next(it) if p else None for p in present))
            return cell.layer_step(F.linear(x_t, w.weight_ih, w.bias_ih), pre, w)

        # carry before step t (before its reset): carry0, then the state after step t - 1
        prev = tuple(torch.cat([c0.unsqueeze(0), s[:-1]]) for c0, s in zip(carry0, states))
        xs: dict[str, object] = {"x": inp, "prev": prev, "g": tuple(grad_states)}
        if mask is not None:
            xs["mask"] = mask
        if reset:
            xs["reset"] = tuple(reset)

        def back_step(acc, xs_t):
            d_carry, d_ws = acc
            m = xs_t.get("mask")
            pre = apply_reset(xs_t["prev"], m, xs_t.get("reset"))
            _, pullback = torch.func.vjp(step_from, xs_t["x"], pre, *live)
            d_x, d_pre, *d_w = pullback(tuple(a + b for a, b in zip(d_carry, xs_t["g"])))
            d_w = tuple(a + b for a, b in zip(d_ws, d_w))
            out = {"x": d_x}
            if m is None:
                return (tuple(d_pre), d_w), out
            if "reset" in xs_t:  # the carry was replaced by reset_state where m
                out["reset"] = tuple(torch.where(broadcast_mask(m, d), d, 0.0) for d in d_pre)
            return (tuple(torch.where(broadcast_mask(m, d), 0.0, d) for d in d_pre), d_w), out

        reads = (inp, mask, *prev, *grad_states, *reset, *live)
        init = (
            _batched_like_step(tuple(torch.zeros_like(c) for c in carry0), *reads),
            _batched_like_step(tuple(torch.zeros_like(wt) for wt in live), *reads),
        )
        (d_carry0, d_live), outs = _scan(back_step, init, xs, reverse=True)
        it = iter(d_live)
        d_weights = [next(it) if p else None for p in present]
        return (None, None, None, outs["x"], None, *d_carry0, *outs.get("reset", ()), *d_weights)


def _split(rest, n_carry: int, has_reset: bool):
    """``rest`` of :class:`_RecomputedLayer`'s inputs -> ``(carry0, reset or None, 5 weights)``."""
    carry0 = tuple(rest[:n_carry])
    reset = tuple(rest[n_carry : 2 * n_carry]) if has_reset else None
    weights = tuple(rest[n_carry * (2 if has_reset else 1) :])
    return carry0, reset, weights


def sequence(cell: CellSpec, layout, params, x, carry: Carry, is_init, reset, opts: SequenceOptions):
    """``x [N, T, F]`` -> ``(y [N, T, P], carry, segment states)``; see :mod:`rnn_functional.functional._core`."""
    if x.shape[1] == 0:
        empty = tuple(s.new_zeros(s.shape[0], 0, *s.shape[1:]) for s in carry)
        return x.new_zeros(x.shape[0], 0, layout.out_size), carry, empty if opts.segment_states else None
    inp = x
    finals, per_step = [], []
    mask_t = None if is_init is None else is_init.transpose(0, 1)  # [T, N]
    for k in range(layout.num_layers):
        w = layer_weights(params, layout, k)
        layer_carry = tuple(s[:, k] for s in carry)
        reset_k = None if reset is None else tuple(r[:, :, k].transpose(0, 1) for r in reset)  # [T, N, S]
        if opts.recompute == "full":
            states = _RecomputedLayer.apply(
                cell, len(layer_carry), reset_k is not None, inp.transpose(0, 1), mask_t,
                *layer_carry, *(reset_k or ()),
                w.weight_ih, w.weight_hh, w.bias_ih, w.bias_hh, w.weight_hr,
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
    seg = None
    if opts.segment_states:
        seg = keep_segment_ends(tuple(torch.stack(parts, dim=2) for parts in zip(*per_step)), is_init)
    return inp, tuple(torch.stack(parts, dim=1) for parts in zip(*finals)), seg
