"""The ``scan`` backend's layer over time and :class:`HandWrittenLayer` (its hand-written reverse scan), for one
model or, through :class:`Members`, an ensemble (:mod:`.ensemble_scan`)."""

from __future__ import annotations

import operator
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch._C._functorch import TransformType
from torch._higher_order_ops import scan

from ..cells import Carry, Cell, LayerWeights, apply_reset
from .base import replayed_vjp

__all__ = ["ONE_MODEL", "HandWrittenLayer", "Members", "contiguous_copy", "scan_states", "split_inputs", "time_loop"]

# Inductor's donated buffers let a compiled backward through this layer overwrite memory it does not own: silently
# wrong gradients (compile_tests/test_compile_donated_buffers.py). Read when a graph compiles.
torch._functorch.config.donated_buffer = False


def contiguous_copy(t: torch.Tensor) -> torch.Tensor:
    """A fresh contiguous tensor: scan forbids a step's outputs aliasing its inputs."""
    return t.clone(memory_format=torch.contiguous_format)


def _sum_rows(t: torch.Tensor) -> torch.Tensor:
    return t.sum(dim=(0, 1))  # [T, N, G] -> [G]


def _outer_sum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[T, N, G], [T, N, K] -> [G, K]`` in one GEMM (``reshape``: ``flatten`` has no legacy batching rule)."""
    return a.reshape(-1, a.shape[-1]).transpose(0, 1) @ b.reshape(-1, b.shape[-1])


@dataclass(frozen=True)
class Members:
    """``count == 0``: one model (time-major ``[T, N, ...]``); ``count == E``: an ensemble, every tensor with a
    members dim of ``E`` or 1 (shared), first (weights, carries) or after time (``[T, e, N, ...]``)."""

    count: int = 0
    static_shapes: bool = False  # scan with static shapes (the ensemble op's layers, see :func:`time_loop`)

    def map(self, fn, *args):
        """``fn`` on each member's share of ``args`` (pytrees, members dim first; a members dim of 1 is shared)."""
        if not self.count:
            return fn(*args)
        leaves, spec = pytree.tree_flatten(args)
        dims = [None if t is None or t.shape[0] == 1 else 0 for t in leaves]
        per_member = pytree.tree_unflatten([t[0] if t is not None and d is None else t for t, d in zip(leaves, dims)], spec)
        if all(d is None for d in dims):  # every input shared (or E = 1): one result, members dim 1
            return pytree.tree_map(lambda t: t.unsqueeze(0), fn(*per_member))
        return torch.vmap(fn, in_dims=tuple(pytree.tree_unflatten(dims, spec)))(*per_member)

    def linear(self, inp: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Each member's ``F.linear``; a shared input meeting per-member weights is copied per member first (a batched
        GEMM with batch stride 0 is slow on CPU)."""
        if inp.shape[0] == 1 and weight.shape[0] != 1:
            inp = inp.expand(weight.shape[0], *inp.shape[1:]).contiguous()
        return self.map(F.linear, inp, weight, bias)

    def map_time_major(self, fn, *args):  # :meth:`map` over ``[T, e, N, ...]``, ``fn`` seeing ``[T, N, ...]``
        return self.map(fn, *pytree.tree_map(self.members_first, args))

    def members_first(self, t: torch.Tensor) -> torch.Tensor:  # [T, e, ...] <-> [e, T, ...]
        return t.movedim(1, 0) if self.count else t

    def rows_by_member(self, step_out: torch.Tensor) -> torch.Tensor:
        """A step's ``[E, N, G]`` as a fresh ``[N, E, G]``: stacked over time, each member's rows are equally spaced
        for the whole-sequence GEMMs (no layout copy)."""
        return step_out.transpose(0, 1).contiguous() if self.count else step_out

    def from_rows_by_member(self, stacked: torch.Tensor) -> torch.Tensor:  # [T, N, E, G] -> [T, E, N, G], a view
        return stacked.transpose(1, 2) if self.count else stacked

    def like(self, grad: torch.Tensor, t: torch.Tensor, dim: int = 0) -> torch.Tensor:  # summed where t is shared
        return grad.sum(dim, keepdim=True) if self.count and t.shape[dim] == 1 and grad.shape[dim] != 1 else grad


ONE_MODEL = Members()


def _batched_like_step(init, *reads: torch.Tensor | None):
    """``init`` plus a zero read from every tensor the step reads, so it has their vmap batch dims: a batched carry
    from an unbatched ``init`` fails ("Expected init and carry to have same metadata")."""
    leaves = pytree.tree_leaves(init)
    zero = sum(torch.zeros_like(t.flatten()[:1], dtype=leaves[0].dtype).sum() for t in (*leaves, *reads) if t is not None)
    return pytree.tree_map(lambda s: contiguous_copy(s) + zero, init)


def time_loop(step, init, xs: tuple, reads=(), reverse: bool = False, members: Members = ONE_MODEL):
    """``step(carry, xs_t) -> (carry, out_t)`` (``out_t`` a tuple of tuples) over dim 0 of ``xs`` -> ``(final carry,
    outputs stacked in the order run)``: compiled, torch's ``scan`` (``reads``: the step's closed-over tensors), the
    ensemble op's layers over time indices with static shapes (Inductor rejects symbolic sizes there); eagerly a loop."""
    if members.static_shapes:
        return _indexed_scan(step, init, xs, reads, reverse)
    if torch.compiler.is_compiling() and not traced_under_grad():
        return _scan(step, _batched_like_step(init, *reads), tuple([t.flip(0) for t in xs]) if reverse else xs)
    per_step = list(zip(*map(torch.unbind, xs)))  # [T] of each step's tensors: one unbind per tensor
    carry, outs = init, []
    for xs_t in (per_step[::-1] if reverse else per_step):
        carry, out = step(carry, xs_t)
        outs.append(out)
    return carry, tuple([tuple(map(torch.stack, zip(*group))) for group in zip(*outs)])


def traced_under_grad() -> bool:
    """Whether a compiled call (the caller checks) is traced under ``torch.func.grad``/``vjp``/``jacrev``
    (innermost): ``scan`` cannot be traced there ("Expected FakeTensor") nor a Function vmapped: the loop unrolls."""
    return torch._C._are_functorch_transforms_active() and \
        torch._functorch.pyfunctorch.retrieve_current_functorch_interpreter().key() == TransformType.Grad


def _indexed_scan(step, init, xs, reads, reverse: bool):
    """A static-shape ``scan`` over time indices, each step reading its slice of ``xs`` from the closure (fused
    indexed loads; scanning over ``xs`` would clone or flip them per call)."""
    count = xs[0].shape[0]
    order = (torch.arange(count - 1, -1, -1) if reverse else torch.arange(count)).to(xs[0].device)

    def indexed_step(carry, index):  # index: [] (int64)
        at = index.reshape(1)
        return step(carry, tuple([t.index_select(0, at).squeeze(0) for t in xs]))

    with torch._dynamo.config.patch(automatic_dynamic_shapes=False, assume_static_by_default=True):
        return _scan(indexed_step, _batched_like_step(init, *reads), order)


@torch._dynamo.assume_constant_result  # runs as plain Python while Dynamo traces: no graph break
def _allow_scan_lowering() -> bool:
    """Let Inductor lower this compile's ``scan``: ``decompose_scan_to_while_loop`` calls ``.item()``, which a
    default compile's ``ShapeEnv`` refuses (``DataDependentOutputException``); granted on that ``ShapeEnv`` alone."""
    context = torch._guards.TracingContext.try_get()
    shape_env = None if context is None or context.fake_mode is None else context.fake_mode.shape_env
    if shape_env is not None and not shape_env.allow_scalar_outputs:
        shape_env.settings = replace(shape_env.settings, allow_scalar_outputs=True)
    return True


def _scan(step, init, xs):
    _allow_scan_lowering()
    if torch._C._are_functorch_transforms_active():
        # vmapped, scan slices xs by the batching fallback (select_copy has no rule), which specializes dynamic sizes
        # mid-trace: the body's inputs keep symbols Dynamo never lifts ("Batching rule not implemented for
        # aten::sym_size.int"). ``operator.index`` specializes them first (a guard each), as that trace would.
        for t in pytree.tree_leaves((init, xs)):
            for size in t.shape:
                operator.index(size)
    return scan(step, init, xs)


def scan_states(cell: Cell, weights: tuple, carry: Carry, gi: torch.Tensor, mask, reset, keep: str,
                members: Members = ONE_MODEL):
    """One layer over ``gi [T, N, G*H]`` from ``carry`` (``[N, S]`` each), ``mask [T, N]`` and ``reset``
    (``[T, N, S]`` each) applying the resets -> ``(final carry, ys)``; ``ys`` per ``keep``: ``"h"`` the output,
    ``"states"`` every step's carry, ``"saved"`` those and the activations the backward reads. An ensemble passes
    its input ``[T, e, N, F]`` as ``gi``, each step projecting its own slice."""
    xs = (gi,) if mask is None else (gi, mask.unsqueeze(-1), *(reset or ()))  # mask [T, N, 1]
    copies = torch.compiler.is_compiling() or members.static_shapes  # compiled, outputs alias nothing (scan's rule)
    w = LayerWeights.from_tensors(weights)
    reads_starts = mask is not None and cell.reads_starts  # the step's start mask [N, 1] is its reset mask

    def member_step(gi_t, c, wts, *start):
        return cell.layer_step_saving(gi_t, c, LayerWeights.from_tensors(wts), *start)

    def step(layer_carry, xs_t):  # xs_t: (gi, mask, *reset) or (gi,)
        if len(xs_t) > 1:
            layer_carry = apply_reset(layer_carry, xs_t[1], xs_t[2:] if len(xs_t) > 2 else None)
        start = xs_t[1:2] if reads_starts else ()
        if members.count:
            gi_t = members.linear(xs_t[0], *weights[:2])
            new, saved = members.map(member_step, gi_t, layer_carry, weights, *start)
        else:
            new, saved = cell.layer_step_saving(xs_t[0], layer_carry, w, *start)
        out = {"h": new[:1], "states": new, "saved": (*new, *saved)}[keep]
        if copies:
            return tuple(map(contiguous_copy, new)), (tuple(map(contiguous_copy, out)),)
        return new, (out,)

    carry, (ys,) = time_loop(step, carry, xs, reads=(gi, *weights[2:], mask, *(reset or ())), members=members)
    return carry, ys


def split_inputs(rest, n_carry: int, has_reset: bool):
    """``(*carry0, *reset, *weights)`` -> ``(carry0, reset or None, weights)``."""
    reset = tuple(rest[n_carry : 2 * n_carry]) if has_reset else None
    return tuple(rest[:n_carry]), reset, tuple(rest[n_carry * (2 if has_reset else 1) :])


class HandWrittenLayer(torch.autograd.Function):
    """One layer over time whose backward is a hand-written reverse scan (see :mod:`.scan`):
    ``apply(cell, recompute, members, n_carry, has_reset, inp [T, N, F], mask [T, N] | None, *carry0 ([N, S]),
    *reset ([T, N, S], if has_reset), *LayerWeights.tensors())`` -> the carry after every step (``[T, N, S]`` each),
    then, unless ``recompute``, the saved activations. An ensemble has a members dim after ``T`` (``[E, N, S]``
    carries). The backward steps the cell's ``step_backward_saved`` (or ``step_backward``) in reversed time; weight
    gradients (``extra`` ones too: not summed in the scan's carry, where Inductor gave wrong ones) and input
    gradients are whole-sequence GEMMs after the loop. Not ``torch.func.vjp``, which refuses saved-tensor hooks.
    """

    generate_vmap_rule = True  # eager torch.vmap over stacked params runs forward and backward batched

    @staticmethod
    def forward(cell: Cell, recompute: bool, members: Members, n_carry: int, has_reset: bool, inp, mask, *rest):
        carry0, reset, weights = split_inputs(rest, n_carry, has_reset)
        # an ensemble projects step by step: the whole sequence's [T, E, N, G*H] would be allocated on every call
        gi = inp if members.count else F.linear(inp, *weights[:2])
        return scan_states(cell, weights, carry0, gi, mask, reset, "states" if recompute else "saved", members)[1]

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        cell, _, members, n_carry, has_reset, inp, mask, *rest = inputs
        ctx.mark_non_differentiable(*output[n_carry:])
        ctx.cell, ctx.members, ctx.n_carry, ctx.has_reset, ctx.n_inputs = cell, members, n_carry, has_reset, len(rest)
        device = inp.device.type
        ctx.amp = device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)
        ctx.save_for_backward(inp, mask, *rest, *output)

    @staticmethod
    def backward(ctx, *grad_outputs):
        # in the forward's autocast state (as torch.amp.custom_bwd): another state mixes dtypes or rounds differently
        device, enabled, dtype = ctx.amp
        if (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)) == (enabled, dtype):
            return HandWrittenLayer._backward(ctx, grad_outputs)
        with torch.autocast(device, dtype=dtype, enabled=enabled):
            return HandWrittenLayer._backward(ctx, grad_outputs)

    @staticmethod
    def _backward(ctx, grad_outputs):
        n, cell, members = ctx.n_carry, ctx.cell, ctx.members
        x, mask, *rest = ctx.saved_tensors  # x [T, (e,) N, F]
        inputs, outputs = rest[: ctx.n_inputs], rest[ctx.n_inputs :]
        if torch.is_grad_enabled():  # create_graph=True (or torch.func.grad): this backward is differentiated too
            return _replayed_backward(ctx, x, mask, inputs, grad_outputs[:n])
        carry0, reset, weights = split_inputs(inputs, n, ctx.has_reset)
        reset = reset or ()
        states, saved, grad_states = outputs[:n], tuple(outputs[n:]), grad_outputs[:n]
        w = LayerWeights.from_tensors(weights)
        # Eagerly, one model runs the reverse scan in spans (:func:`_spans`) whose buffers stay in cache; compiled,
        # and for an ensemble, one span, each step's factors computed inside the scan's body.
        eager = not members.count and not torch.compiler.is_compiling()
        steps = states[0].shape[0]
        spans = _spans(steps, states[0][0]) if eager else ((0, steps),)
        # each step reads its factors (eager), what they are computed from (compiled), or its input (no saved)
        key = "x" if len(saved) == 0 else "factors" if eager else "saved"  # len: Dynamo cannot trace bool(tuple)
        # scan needs the carry in init's layout: vmap (and a block GRU with one-unit blocks) leaves it transposed
        own = contiguous_copy if members.count or torch.compiler.is_compiling() else (lambda t: t)
        recomputes_starts = key == "x" and mask is not None and cell.reads_starts
        n_mask = int(mask is not None)

        def member_back(inputs, pre_t, wts, d_new, *start):
            wl = LayerWeights.from_tensors(wts)
            if key == "x":
                grads = cell.step_backward(F.linear(inputs[0], wl.weight_ih, wl.bias_ih), pre_t, wl, d_new, *start)
            else:
                factors = cell.backward_factors(inputs, pre_t, wl) if key == "saved" else inputs
                grads = cell.step_backward_saved(factors, pre_t, wl, d_new)
            d_gh = () if grads.d_gh is None else (grads.d_gh,)  # None: equal to d_gi (vmap returns tensors only)
            return tuple(grads.d_carry), grads.d_gi, d_gh, tuple(d for d in grads.d_extra if d is not None)

        def back_step(d_carry, xs_t):  # xs_t: (mask?, *pre, *g, *inputs) -> ((d_gi, d_gh?), d_reset, d_extra)
            m = xs_t[0] if n_mask else None  # [(e,) N, 1]
            pre_t, g_t = xs_t[n_mask : n_mask + n], xs_t[n_mask + n : n_mask + 2 * n]
            d_new = tuple(a + b for a, b in zip(d_carry, g_t))
            # the start mask where the step is recomputed (else among the saved activations)
            start = (m,) if recomputes_starts else ()
            d_pre, d_gi, d_gh, d_extra = members.map(member_back, xs_t[n_mask + 2 * n :], pre_t, weights, d_new, *start)
            d_reset = ()
            if m is not None:  # where the carry was reset, its cotangent goes to reset_state (or nowhere)
                d_reset = tuple(torch.where(m, d, 0.0) for d in d_pre[: len(reset)])
                d_pre = tuple(torch.where(m, 0.0, d) for d in d_pre)
            if torch.compiler.is_compiling():  # fresh: a cell's per-row factors may be views of the step's inputs
                d_extra = tuple(map(contiguous_copy, d_extra))
            return tuple(map(own, d_pre)), (tuple(map(members.rows_by_member, (d_gi, *d_gh))), d_reset, d_extra)

        acc = tuple(torch.zeros_like(s[0]) for s in states)
        totals, parts = None, []
        for start, end in reversed(spans):
            # the carry each step starts from, before its reset: [end - start, (E,) N, S] each
            if start:
                pre = tuple(s[start - 1 : end - 1] for s in states)
            else:  # one step more, then cut: a traced ``s[: end - 1]`` guards ``T - 1 != 1`` (T = 2 recompiled)
                pre = tuple(torch.cat([c0.unsqueeze(0), s[:end]])[:end] for c0, s in zip(carry0, states))
            pre = apply_reset(pre, None if mask is None else mask[start:end], tuple(r[start:end] for r in reset) or None)
            if key == "x":
                inputs = (x[start:end],)
            else:
                inputs = tuple(s[start:end] for s in saved)
                inputs = cell.backward_factors(inputs, pre, w) if key == "factors" else inputs
            masks = () if mask is None else (mask[start:end].unsqueeze(-1),)  # [C, (e,) N, 1]
            xs = (*masks, *pre, *(g[start:end] for g in grad_states), *inputs)
            reads = (x, mask, *pre, *grad_states, *reset, *saved, *(wt for wt in weights if wt is not None))
            # reversed time: index 0 = step end - 1 (compiled, no ``reverse`` flips of the gate cotangents)
            acc, outs = time_loop(back_step, acc, xs, reads, reverse=True, members=members)
            weight_grads, part = _span_grads(cell, w, members, *outs, x[start:end], pre[0])
            totals = weight_grads if totals is None else [None if a is None else a + b for a, b in zip(totals, weight_grads)]
            parts.append(part)
        # the time-major inputs' members dim is 1
        d_x, *d_reset = (members.like(_in_time_order(pieces), t, 1) for pieces, t in zip(zip(*parts), (x, *reset)))
        d_weights = tuple(None if d is None else members.like(d, t) for d, t in zip(totals, weights))
        return (None, None, None, None, None, d_x, None, *acc, *d_reset, *d_weights)


CHUNK_BYTES = 256 * 1024
SPAN_ROWS = 512


def _spans(steps: int, state_step: torch.Tensor) -> tuple[tuple[int, int], ...]:
    """``(start, end)`` spans of ``steps`` in time order, each keeping a state-wide tensor (one step: ``state_step``)
    within ``CHUNK_BYTES`` (in cache) with at least ``SPAN_ROWS`` rows for the weight-gradient GEMMs."""
    row_bytes = state_step.numel() * state_step.element_size()
    size = max(1, CHUNK_BYTES // max(1, row_bytes), -(-SPAN_ROWS // max(1, state_step.shape[0])))
    return tuple((start, min(start + size, steps)) for start in range(0, steps, size))


def _span_grads(cell: Cell, w: LayerWeights, members: Members, d_gates: tuple, d_reset: tuple, d_extra: tuple,
                x: torch.Tensor, pre_h: torch.Tensor):
    """One span's ``(weight gradients, (d_x, *d_reset))`` from its reversed-time step outputs and inputs."""
    d_gi = members.from_rows_by_member(d_gates[0])  # [C, (E,) N, G*H], reversed time
    d_gh = members.from_rows_by_member(d_gates[-1])
    d_extra = iter(members.map_time_major(cell.reduce_extra_grads, *d_extra) if d_extra else ())
    seq = members.map_time_major
    weight_grads = [
        seq(_outer_sum, d_gi, x.flip(0)),
        seq(_sum_rows, d_gi) if w.bias_ih is not None else None,
        seq(_outer_sum, d_gh, pre_h.flip(0)) if w.weight_hh is not None else None,  # none: linear in the state
        seq(_sum_rows, d_gh) if w.bias_hh is not None else None,
        *(None if t is None else next(d_extra) for t in w.extra),
    ]
    d_x = members.map(torch.matmul, members.members_first(d_gi), w.weight_ih)  # [(E,) C, N, F], reversed time
    return weight_grads, (members.members_first(d_x).flip(0), *(d.flip(0) for d in d_reset))


def _in_time_order(parts) -> torch.Tensor:
    """The spans' time-major pieces (last span first) joined."""
    return parts[0] if len(parts) == 1 else torch.cat(parts[::-1])


def _replayed_backward(ctx, inp, mask, inputs: tuple, grad_states: tuple) -> tuple:
    """The backward when autograd records it (``create_graph=True``, ``torch.func``): :func:`~.base.replayed_vjp`
    of the plain steps (the hand-written scan treats saved activations as constants)."""
    if ctx.members.count:
        raise RuntimeError("backend 'scan' under a compiled torch.vmap ensemble has no higher-order gradients "
                           "(create_graph=True): its backward is compiled once. Use backend='reference' for these "
                           "derivatives of an ensemble.")

    def states(x, *tensors):  # the forward's differentiable arguments, in order
        carry0, reset, weights = split_inputs(tensors, ctx.n_carry, ctx.has_reset)
        return scan_states(ctx.cell, weights, carry0, F.linear(x, *weights[:2]), mask, reset, "states")[1]

    grads = replayed_vjp(states, (inp, *inputs), grad_states)
    needs = (ctx.needs_input_grad[5], *ctx.needs_input_grad[7:])
    grads = [g if need else None for g, need in zip(grads, needs)]
    return (None, None, None, None, None, grads[0], None, *grads[1:])
