"""``parallel``: cells linear in their state (``h_t = a_t * h_{t-1} + b_t``) solved by :func:`linear_scan`, a
chunked scan that never divides by a product of ``a`` (``docs/linear_recurrences.md``). Eagerly :class:`LinearScan`
(preallocated buffers, its backward the same scan in reverse); compiled and in forward mode plain ops under autograd
(Dynamo cannot vmap the Function under a compiled ensemble, nor trace one with a ``jvp``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..cells import Carry, Cell, Layout, between_layers
from .base import SequenceOptions, no_kernel_for

__all__ = ["LinearScan", "check_cell", "linear_scan", "sequence"]


def check_cell(cell: Cell) -> None:
    """Raise the usual ``ValueError`` for a cell whose update is not linear in its state (the LSTM, the GRU)."""
    if not cell.linear_in_state:
        raise no_kernel_for("parallel", cell)


def _chunks(t: torch.Tensor, count: int) -> torch.Tensor:
    """``[N, count * chunk, ...] -> [N, count, chunk, ...]`` (``unflatten`` has no legacy batching rule)."""
    return t.reshape(t.shape[0], count, -1, *t.shape[2:])


def _step(b: torch.Tensor, a: torch.Tensor, h: torch.Tensor, cut: torch.Tensor | None, select: bool,
          out: torch.Tensor | None = None) -> torch.Tensor:
    """``a * h + b``; ``b`` alone where ``cut`` (not even a NaN ``h`` read). ``select``: pick the result (no autograd
    here); else zero the state first, so autograd's derivatives stay finite."""
    if cut is None:
        return torch.addcmul(b, a, h, out=out)
    if select:
        return torch.where(cut, b, torch.addcmul(b, a, h), out=out)
    return torch.addcmul(b, a, torch.where(cut, 0.0, h), out=out)


def _solve(a: torch.Tensor, b: torch.Tensor, init: torch.Tensor | None, reverse: bool,
           out: torch.Tensor | None = None, cut: torch.Tensor | None = None, select: bool = True) -> torch.Tensor:
    """The chunked scan (shapes as :func:`linear_scan`) into ``out`` (eager, autograd off) or stacked: (1) every
    chunk from a zero start, (2) the state entering each chunk, (3) every chunk again from it; the rest one by one."""
    t_len = a.shape[1]
    if t_len == 0:
        return b.clone() if out is None else out
    chunk = 1 << (t_len.bit_length() // 2)  # a power of two near sqrt(T)
    count = t_len // chunk
    lo = t_len - count * chunk if reverse else 0
    # narrow, not t[:, lo:hi]: a slice over all of T is an alias the legacy batched backward cannot batch
    a_c, b_c, c_c = (None if t is None else _chunks(t.narrow(1, lo, count * chunk), count) for t in (a, b, cut))
    # each step's slices taken once (unbind): differentiated, their backward is one stack
    a_j, b_j = a_c.unbind(2), b_c.unbind(2)
    c_j = (None,) * chunk if cut is None else c_c.unbind(2)
    order = (lambda k: range(k - 1, -1, -1)) if reverse else range
    steps = order(chunk)
    h = b_j[steps[0]]
    for j in steps[1:]:  # (1) the chunks' last values from zero starts
        h = _step(b_j[j], a_j[j], h, c_j[j], select)
    chunk_cut = None if cut is None else c_c.any(2)  # a chunk with a reset reads no state from before it
    if chunk_cut is None or select:
        prod = a_c.prod(2)
    else:  # differentiated: no product may span a NaN ``a`` before the reset (0 * NaN derivative)
        prod = torch.where(chunk_cut.unsqueeze(2), 0.0, a_c).prod(2)
    state = torch.zeros_like(b[:, 0]) if init is None else init
    entering = []  # appended: Dynamo cannot trace a list's item assignment
    last, last_a = h.unbind(1), prod.unbind(1)
    last_cut = (None,) * count if cut is None else chunk_cut.unbind(1)
    for c in order(count):  # (2) the state entering each chunk
        entering.append(state)
        state = _step(last[c], last_a[c], state, last_cut[c], select)
    h = torch.stack(entering[::-1] if reverse else entering, dim=1)
    o_j = None if out is None else _chunks(out.narrow(1, lo, count * chunk), count).unbind(2)
    kept = []
    for j in steps:  # (3) every step, from the chunks' entering states
        h = _step(b_j[j], a_j[j], h, c_j[j], select, out=None if out is None else o_j[j])
        kept.append(h)
    tail = []
    rest = slice(0, lo) if reverse else slice(count * chunk, t_len)
    a_t, b_t, o_t = (None if t is None else t[:, rest].unbind(1) for t in (a, b, out))
    c_t = (None,) * len(a_t) if cut is None else cut[:, rest].unbind(1)
    for t in order(len(a_t)):  # the rest, step by step
        state = _step(b_t[t], a_t[t], state, c_t[t], select, out=None if out is None else o_t[t])
        tail.append(state)
    if out is not None:
        return out
    main = torch.stack(kept[::-1] if reverse else kept, dim=2)
    main = main.reshape(main.shape[0], -1, *main.shape[3:])  # [N, count * chunk, ...]
    if not tail:
        return main
    tail = torch.stack(tail[::-1] if reverse else tail, dim=1)
    return torch.cat([tail, main] if reverse else [main, tail], dim=1)


def _wrapped(*tensors: torch.Tensor | None) -> bool:
    """Any of ``tensors`` a ``torch.func`` wrapper or legacy batched tensor: ``out=`` has no batching rule there."""
    functorch = torch._C._functorch
    return any(t is not None and (functorch.is_functorch_wrapped_tensor(t) or functorch.is_legacy_batchedtensor(t))
               for t in tensors)


class LinearScan(torch.autograd.Function):
    """``h = linear_scan(a, b, init, reverse, cut)`` with a backward that is a linear scan in the other direction."""

    generate_vmap_rule = True

    @staticmethod
    def forward(a, b, init, reverse: bool, cut):
        return _solve(a, b, init, reverse, None if _wrapped(a, b, init, cut) else torch.empty_like(b), cut)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        a, _, init, reverse, cut = inputs
        ctx.reverse = reverse
        ctx.save_for_backward(a, output, init, cut)

    @staticmethod
    def backward(ctx, grad):
        a, h, start, cut = ctx.saved_tensors
        rev = ctx.reverse
        # g_t = grad_t + a_{t+1} g_{t+1} (grad_t alone where step t + 1 is cut) is the same scan the other way, from
        # the last step; where step t is cut, a_t and init were not read: their cotangents are 0.
        last, rest, ahead = (0, slice(1, None), slice(0, -1)) if rev else (-1, slice(0, -1), slice(1, None))
        first = -1 if rev else 0
        cut_ahead = None if cut is None else cut[:, ahead]
        # create_graph=True (recorded: every higher order exact), or a torch.func call (no in-place writes)
        if torch.is_grad_enabled() or _wrapped(a, grad, h, start, cut):
            inner = (LinearScan.apply(a[:, ahead], grad[:, rest], grad[:, last], not rev, cut_ahead)
                     if a.shape[1] > 1 else grad[:, rest])
            edge = grad[:, last].unsqueeze(1)
            g = torch.cat([edge, inner] if rev else [inner, edge], dim=1)
            before = (torch.zeros_like(h[:, 0]) if start is None else start).unsqueeze(1)  # the state each step reads
            d_a = g * torch.cat([h[:, 1:], before] if rev else [before, h[:, :-1]], dim=1)
            d_a = d_a if cut is None else torch.where(cut, 0.0, d_a)
        else:  # written in place: no copies
            g = torch.empty_like(grad)
            g[:, last] = grad[:, last]
            _solve(a[:, ahead], grad[:, rest], grad[:, last], not rev, g[:, rest], cut_ahead)
            d_a = torch.empty_like(a)
            torch.mul(g[:, ahead], h[:, rest], out=d_a[:, ahead])
            d_a[:, first] = 0.0 if start is None else g[:, first] * start
            if cut is not None:
                d_a.masked_fill_(cut, 0.0)
        d_init = None if start is None else g[:, first] * a[:, first]
        if d_init is not None and cut is not None:
            d_init = torch.where(cut[:, first], 0.0, d_init)
        return d_a, g, d_init, None, None


def linear_scan(a: torch.Tensor, b: torch.Tensor, init: torch.Tensor | None = None, reverse: bool = False,
                cut: torch.Tensor | None = None, plain_ops: bool = False) -> torch.Tensor:
    """``h_t = a_t * h_{t-1} + b_t`` from ``h_{-1} = init`` (``None``: zeros), or with ``reverse`` from ``h_T``
    backwards; ``h_t = b_t`` where ``cut`` (a reset: not even a NaN state is read). ``a, b [N, T, ...]``,
    ``init [N, ...]``, ``cut`` bool ``[N, T, 1]`` -> ``h`` like ``b``. ``plain_ops``: no :class:`LinearScan`
    (compiled, forward-mode AD: see the module docstring)."""
    if plain_ops:
        return _solve(a, b, init, reverse, cut=cut, select=False)
    return LinearScan.apply(a, b, init, reverse, cut)


def _project(inp: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``F.linear``; compiled, one 2-D product and a bias add: a compiled vmap over stacked params fails on dynamic
    shapes in ``F.linear`` and a 3-D ``matmul`` ("Cannot call sizes() on tensor with symbolic sizes/strides")."""
    if torch.compiler.is_compiling():
        flat = inp.reshape(-1, inp.shape[-1]) @ weight.transpose(-1, -2)
        return flat.reshape(*inp.shape[:-1], weight.shape[0]) + bias
    return F.linear(inp, weight, bias)


def sequence(layout: Layout, params, x, carry: Carry, is_init, reset, opts: SequenceOptions):
    """``x [N, T, F]`` -> ``(y [N, T, H], carry, per-step carries)``; see :mod:`.base`."""
    cell, ctx = layout.cell, opts.context  # the cell is linear in its state: checked when the route was chosen
    mask = None if is_init is None else is_init.unsqueeze(-1)  # [N, T, 1]
    inp, finals, states = x, [], []
    for k in range(layout.num_layers):
        inp = between_layers(inp, opts.dropout, opts.training) if k else inp
        w = cell.layer_weights(params, layout, k)
        # in the state's dtype: under autocast the projection is autocast's, the recurrence the params' (as reference)
        gi = _project(inp, w.weight_ih, w.bias_ih)
        starts = (mask,) if mask is not None and cell.reads_starts else ()  # is_init as the start mask [N, T, 1]
        a, b = (c.to(carry[0].dtype) for c in cell.coefficients(gi, w, *starts))
        if mask is not None and reset is not None:  # a reset restarts from reset_state: h_t = a_t reset_t + b_t
            start = torch.where(mask, reset[0][:, :, k], 0.0)  # elsewhere never read, NaN included
            b = torch.where(mask, torch.addcmul(b, a, start), b)
        h = linear_scan(a, b, carry[0][:, k], cut=mask, plain_ops=ctx.compiling or ctx.forward)  # is_init: h_t = b_t
        finals.append(h[:, -1])
        states.append(h)
        inp = h
    per_step = (torch.stack(states, dim=2),) if opts.segment_states else None
    return inp, (torch.stack(finals, dim=1),), per_step
