"""The ``scan`` backend's layer over time, shared by one model (:mod:`.scan`) and a compiled
ensemble (:mod:`.ensemble_scan`): the time loop, the forward scan and :class:`HandWrittenLayer`,
whose backward is a hand-written reverse scan (see :mod:`.scan`).

The layer's math is written once, for one model; :class:`Members` says how it applies: directly
(``Members(0)``, the ``scan`` backend's layout), or ``torch.vmap``-ed over a leading members dim
(``Members(E)``, every tensor ``[E or 1, ...]``; one of size 1 is shared by the members and not
expanded, except the input of the projection, see :meth:`Members.linear`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch._C._functorch import TransformType
from torch._higher_order_ops import scan

from ..cells import Carry, Cell, LayerWeights, apply_reset, broadcast_mask
from .base import replayed_vjp

__all__ = ["HandWrittenLayer", "Members", "contiguous_copy", "scan_states", "split_inputs", "time_loop"]

# Inductor's donated buffers (torch 2.13) let a compiled backward through this layer reuse memory it does not own:
# it overwrote parameters that need no gradient (a frozen norm GRU's norm weights, a minGRU's bias) and returned
# silently wrong gradients (a projected LSTM's lower layer; a norm GRU's input); every such case is exact without
# them (compile_tests/test_compile_donated_buffers.py). Process-wide: the switch is read when a graph is compiled.
torch._functorch.config.donated_buffer = False


def contiguous_copy(t: torch.Tensor) -> torch.Tensor:
    """A fresh contiguous tensor: what a scanned step returns (scan forbids outputs aliasing its inputs)."""
    return t.clone(memory_format=torch.contiguous_format)


def _sum_rows(t: torch.Tensor) -> torch.Tensor:
    """``[T, N, G] -> [G]``."""
    return t.sum(dim=(0, 1))


def _outer_sum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``sum_{t, n} a[t, n]^T b[t, n]``: ``[T, N, G], [T, N, K] -> [G, K]`` (one GEMM; ``reshape``, not ``flatten``,
    which torch's legacy batched backward, ``is_grads_batched=True``, cannot batch)."""
    return a.reshape(-1, a.shape[-1]).transpose(0, 1) @ b.reshape(-1, b.shape[-1])


@dataclass(frozen=True)
class Members:
    """How the layer's per-model math applies. ``count == 0``: one model; tensors as laid out by the
    ``scan`` backend (``inp [N, T, F]``, time-major ``[T, N, ...]``). ``count == E``: an ensemble; every
    tensor has a leading members dim of ``E``, or 1 when shared by all members (``inp [e, N, T, F]``,
    time-major ``[T, e, N, ...]``)."""

    count: int = 0
    static_shapes: bool = False  # scan with static shapes (the ensemble op's layers, see :func:`time_loop`)

    @staticmethod
    def of(members: int | Members) -> Members:
        """``members`` as :class:`HandWrittenLayer` receives it (a count, or the ensemble op's ``Members``)."""
        return members if isinstance(members, Members) else Members(members)

    def map(self, fn, *args):
        """``fn`` on each member's share of ``args`` (tensors, tuples of them, ``None``; members dim first).
        Shared tensors (members dim 1) are passed once to every member (vmap ``in_dims=None``)."""
        if not self.count:
            return fn(*args)
        leaves, spec = pytree.tree_flatten(args)
        # a members dim of 1 is passed once: shared (or E = 1, where no vmap is needed at all)
        dims = [None if t is None or t.shape[0] == 1 else 0 for t in leaves]
        per_member = pytree.tree_unflatten([t[0] if t is not None and d is None else t for t, d in zip(leaves, dims)], spec)
        if all(d is None for d in dims):  # every input shared (or E = 1): one result, with a members dim of 1
            return pytree.tree_map(lambda t: t.unsqueeze(0), fn(*per_member))
        return torch.vmap(fn, in_dims=tuple(pytree.tree_unflatten(dims, spec)))(*per_member)

    def linear(self, inp: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Each member's ``F.linear(inp, weight, bias)``, ``[e, ..., F] -> [E, ..., G]`` (a sequence ``[e, N, T, F]``
        or, in the ensemble's scan, one step's ``[e, N, F]``). An input shared
        by per-member weights is copied per member first: a batched GEMM reading one input for every member
        (batch stride 0) runs slower on CPU than one over contiguous copies, by far more than the copy costs."""
        if self.count and inp.shape[0] == 1 and weight.shape[0] != 1:
            inp = inp.expand(weight.shape[0], *inp.shape[1:]).contiguous()
        return self.map(F.linear, inp, weight, bias)

    def map_time_major(self, fn, *args):
        """:meth:`map` over time-major tensors (``[T, e, N, ...]``), ``fn`` seeing ``[T, N, ...]``."""
        return self.map(fn, *pytree.tree_map(self.members_first, args))

    def members_first(self, t: torch.Tensor) -> torch.Tensor:
        """``[T, e, ...] <-> [e, T, ...]`` (its own inverse; one model: ``t``)."""
        return t.movedim(1, 0) if self.count else t

    def time_major(self, t: torch.Tensor | None, time_dim: int) -> torch.Tensor | None:
        """``t`` with its (per-member) dim ``time_dim`` moved first (a view)."""
        return None if t is None else t.movedim(time_dim + bool(self.count), 0)

    def from_time_major(self, t: torch.Tensor, time_dim: int) -> torch.Tensor:
        """The inverse of :meth:`time_major`."""
        return t.movedim(0, time_dim + bool(self.count))

    def rows_by_member(self, step_out: torch.Tensor) -> torch.Tensor:
        """A step's gate cotangents ``[E, N, G]`` as a fresh ``[N, E, G]`` tensor (one model: ``step_out``).

        Stacked over time, ``[T, N, E, G]``: each member's ``(t, n)`` rows are then equally spaced, so the
        whole-sequence weight-gradient and input-gradient GEMMs read them in place (as one ``[T * N, G]``
        matrix with row stride ``E * G``) where ``[T, E, N, G]`` would need a layout copy first."""
        return step_out.transpose(0, 1).contiguous() if self.count else step_out

    def from_rows_by_member(self, stacked: torch.Tensor) -> torch.Tensor:
        """:meth:`rows_by_member` outputs stacked over time, ``[T, N, E, G]``, as ``[T, E, N, G]`` (a view)."""
        return stacked.transpose(1, 2) if self.count else stacked

    def expand(self, t: torch.Tensor) -> torch.Tensor:
        """A carry ``[e, N, S]`` for every member (``[E, N, S]``, a view); one model: ``t``."""
        return t.expand(self.count, *t.shape[1:]) if self.count else t

    def like(self, grad: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``grad [E, ...]`` summed over the members where ``t`` is shared by all of them (``[1, ...]``)."""
        return grad.sum(0, keepdim=True) if self.count and t.shape[0] == 1 and grad.shape[0] != 1 else grad


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
    return pytree.tree_map(lambda s: contiguous_copy(s) + zero, init)


def time_loop(step, init, xs, reads=(), reverse: bool = False, members: Members = Members()):
    """``step(carry, xs_t) -> (carry, out_t)`` over the leading (time) dim of every tensor in ``xs``.

    Returns ``(final carry, outputs stacked along a new dim 0)``. With ``reverse`` the steps run
    from the last index to the first and the outputs are stacked in the order they ran (index 0
    is the last time step). Under ``torch.compile`` this is torch's ``scan`` (``reads``: the
    tensors the step closes over, see :func:`_batched_like_step`); eagerly a Python loop.
    An ensemble layer (``members.static_shapes``) always scans, over time indices
    (:func:`_indexed_scan`) and with static shapes: it runs inside the ensemble op while AOTAutograd traces, where ``scan`` compiles its step with Dynamo itself; from
    the second shape on, automatic dynamic shapes would make sizes symbolic, which Inductor's
    subgraph pass rejects ("A subgraph argument other than striding has been modified").
    """
    if members.static_shapes:
        return _indexed_scan(step, init, xs, reads, reverse)
    if torch.compiler.is_compiling() and not traced_under_grad():
        if reverse:
            xs = pytree.tree_map(lambda t: t.flip(0), xs)
        return _scan(step, _batched_like_step(init, *reads), xs)
    leaves, spec = pytree.tree_flatten(xs)
    per_step = list(zip(*(t.unbind(0) for t in leaves)))  # [T] of each step's leaves: one unbind per tensor
    rebuild = _builder(spec)
    carry, outs = init, []
    for t in (range(len(per_step) - 1, -1, -1) if reverse else range(len(per_step))):
        carry, out = step(carry, rebuild(iter(per_step[t])))
        outs.append(_leaves(out))
    out_spec = pytree.tree_structure(out)
    return carry, pytree.tree_unflatten([torch.stack(parts) for parts in zip(*outs)], out_spec)


def traced_under_grad() -> bool:
    """Whether ``torch.compile`` traces this call with ``torch.func.grad``/``vjp``/``jacrev`` as the innermost
    transform around it. torch's ``scan`` cannot be traced there (``torch.compile(torch.func.grad(f))`` raised
    "Expected FakeTensor" in ``_collect_fake_inputs``; eager ``torch.func.grad`` of ``scan`` too), nor can Dynamo vmap
    an ``autograd.Function`` (``vmap(grad(f))``): :func:`time_loop` unrolls its loop and functorch differentiates the
    step's plain ops. Under a ``vmap`` inside ``grad`` the scan's batching rule runs first and it traces. Both calls
    below trace in Dynamo with ``fullgraph=True`` (functorch's other accessors do not)."""
    if not torch.compiler.is_compiling():
        return False
    return torch._C._are_functorch_transforms_active() and \
        torch._functorch.pyfunctorch.retrieve_current_functorch_interpreter().key() == TransformType.Grad


def _indexed_scan(step, init, xs, reads, reverse: bool):
    """:func:`time_loop` as an ensemble layer runs it: a ``scan`` (static shapes) over the time indices,
    each step reading its slice of every tensor in ``xs`` by index from the step's closure.

    Scanning over ``xs`` themselves would copy them: Inductor's lowering of ``scan`` clones every
    tensor it scans over before its loop starts, and ``reverse`` (or flipping ``xs``) is another copy,
    which the partitioner computes in the forward and keeps alive until the backward. At E members
    these are E times a member's ``[T, N, ·]`` tensors, allocated (and page-faulted in) on every call.
    Read from the closure, they are the scan's additional inputs, never copied; the per-step read is an
    indexed load Inductor fuses into the step's kernels.
    """
    leaves, spec = pytree.tree_flatten(xs)
    count = leaves[0].shape[0]
    order = torch.arange(count - 1, -1, -1) if reverse else torch.arange(count)
    order = order.to(leaves[0].device)

    def indexed_step(carry, index):  # index: [] (int64)
        at = index.reshape(1)
        return step(carry, pytree.tree_unflatten([t.index_select(0, at).squeeze(0) for t in leaves], spec))

    with torch._dynamo.config.patch(automatic_dynamic_shapes=False, assume_static_by_default=True):
        return _scan(indexed_step, _batched_like_step(init, *reads), order)


@torch._dynamo.assume_constant_result  # runs as plain Python while Dynamo traces: no graph break
def _allow_scan_lowering() -> bool:
    """Let Inductor lower the ``scan`` of the compile in progress (see :func:`_scan`).

    Inductor's ``decompose_scan_to_while_loop`` reads the loop index with ``.item()``, which the
    compile's ``ShapeEnv`` allows only when Dynamo built it for ``fullgraph=True`` (or with the global
    ``capture_scalar_outputs``); under a default ``torch.compile(f)`` every ``scan`` raised
    ``DataDependentOutputException: aten._local_scalar_dense``. Granted here on that compile's
    ``ShapeEnv`` alone, leaving the global config (and so how Dynamo treats the user's own ``.item()``
    calls) as it is. A no-op outside a compile.
    """
    context = torch._guards.TracingContext.try_get()
    shape_env = None if context is None or context.fake_mode is None else context.fake_mode.shape_env
    if shape_env is not None and not shape_env.allow_scalar_outputs:
        shape_env.settings = replace(shape_env.settings, allow_scalar_outputs=True)
    return True


def _scan(step, init, xs):
    """torch's ``scan``, made lowerable by Inductor under a default ``torch.compile`` (:func:`_allow_scan_lowering`)."""
    _allow_scan_lowering()
    return scan(step, init, xs)


def _builder(spec: pytree.TreeSpec):
    """``leaves -> tree``: ``spec`` (dicts and tuples of tensors) filled from an iterator of its leaves;
    built once per loop, cheaper per step than pytree's unflatten."""
    if spec.type is type(None):
        return lambda leaves: None
    if spec.type not in (dict, tuple):
        return next
    parts = [_builder(c) for c in spec.children()]
    if spec.type is tuple:
        return lambda leaves: tuple(part(leaves) for part in parts)
    keys = spec.context
    return lambda leaves: {k: part(leaves) for k, part in zip(keys, parts)}


def _leaves(tree) -> list:
    """The tensors of ``tree`` (dicts and tuples), in pytree's order (dict keys in insertion order)."""
    if tree is None:
        return []
    if isinstance(tree, dict):
        return [t for v in tree.values() for t in _leaves(v)]
    if isinstance(tree, tuple):
        return [t for v in tree for t in _leaves(v)]
    return [tree]


def scan_states(cell: Cell, weights: tuple, carry: Carry, gi: torch.Tensor, mask, reset, keep: str,
                members: Members = Members(), project: bool = False):
    """Run one layer over time-major ``gi [T, N, G*H]`` from ``carry`` (tuple of ``[N, S]``).

    With ``project``, ``gi`` is the layer's input ``[T, N, F]`` and each step applies the input
    projection to its own slice (an ensemble: see :meth:`HandWrittenLayer.forward`).

    ``weights``: :meth:`LayerWeights.tensors`. ``mask [T, N]`` / ``reset`` (tuple of ``[T, N, S]``)
    apply the resets. Returns ``(final carry, ys)``; ``ys`` per ``keep``: ``"h"`` the output
    ``[T, N, P]``, ``"states"`` every per-step carry (tuple of ``[T, N, S]``), ``"saved"`` the
    per-step carries and the activations each step saves for its backward (tuple of ``[T, N, ·]``),
    concatenated. (Ensemble: every ``N`` preceded by the members dim.)
    """
    xs: dict[str, object] = {"gi": gi}
    if mask is not None:
        xs["mask"] = broadcast_mask(mask, gi)  # [T, N, 1]: broadcasts against each step's carry as it is
        if reset is not None:
            xs["reset"] = reset
    # under compile, outputs that alias nothing (scan's rule); eagerly the loop stacks them anyway
    own = contiguous_copy if torch.compiler.is_compiling() or members.static_shapes else (lambda t: t)
    step_saving = lambda gi_t, c, wts: cell.layer_step_saving(gi_t, c, LayerWeights.from_tensors(wts))  # noqa: E731

    def step(layer_carry, xs_t):
        layer_carry = apply_reset(layer_carry, xs_t.get("mask"), xs_t.get("reset"))
        gi_t = members.linear(xs_t["gi"], *weights[:2]) if project else xs_t["gi"]
        new, saved = members.map(step_saving, gi_t, layer_carry, weights)
        out = {"h": new[0], "states": new, "saved": (*new, *saved)}[keep]
        return tuple(own(s) for s in new), (own(out) if keep == "h" else tuple(own(s) for s in out))

    init = tuple(members.expand(s) for s in carry)
    return time_loop(step, init, xs, reads=(gi, *weights[2:], mask, *(reset or ())), members=members)


def split_inputs(rest, n_carry: int, has_reset: bool):
    """``(*carry0, *reset, *weights)`` -> ``(carry0, reset or None, weights)``."""
    carry0 = tuple(rest[:n_carry])
    reset = tuple(rest[n_carry : 2 * n_carry]) if has_reset else None
    weights = tuple(rest[n_carry * (2 if has_reset else 1) :])
    return carry0, reset, weights


def _amp_state(device: str) -> tuple[str, bool, torch.dtype]:
    """``(device, autocast enabled, autocast dtype)`` for ``device``'s type now."""
    return device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)


class HandWrittenLayer(torch.autograd.Function):
    """One layer over time whose backward is a hand-written reverse scan (see :mod:`.scan`).

    ``apply(cell, recompute, members (E, or 0: one model; or a :class:`Members`), n_carry, has_reset, inp [N, T, F], mask [T, N] | None, *carry0 ([N, S] each),
    *reset ([T, N, S] each, if has_reset), *LayerWeights.tensors())`` (absent weights are ``None``;
    with ``members.count``, every tensor has a leading members dim, see :class:`Members`) returns the
    carry after every step, a tuple of time-major ``[T, N, S]`` (ensemble: ``[T, E, N, S]``), followed
    (unless ``recompute``) by the per-step activations of :meth:`~rnn_functional.cells.Cell.layer_step_saving`
    (``[T, (E,) N, ·]`` each, not differentiable). Saved for backward: ``inp``, the carries, the reset
    states and those activations.

    The backward runs in reversed time carrying the cotangent of the carry: each step applies the
    cell's hand-written backward, from the saved activations
    (:meth:`~rnn_functional.cells.Cell.step_backward_saved`) or recomputing them from ``inp`` and
    the saved carry before the step, after its reset (:meth:`~rnn_functional.cells.Cell.step_backward`).
    It emits the cotangents of the input and recurrent projections, from which the weight and input
    gradients are a few whole-sequence GEMMs after the loop, and what each step contributes to the gradients
    of the cell's ``extra`` weights, reduced after the loop (:meth:`~rnn_functional.cells.Cell.reduce_extra_grads`;
    summed in the scan's carry instead, two chained layers under Inductor gave wrong norm-GRU layer-norm
    gradients on torch 2.13). (Hand-written
    rather than ``torch.func.vjp``, which refuses to run while saved-tensor hooks are active, e.g. under
    ``torch.autograd.graph.save_on_cpu`` or when ``torch.compile`` traces this backward there.)
    """

    generate_vmap_rule = True  # eager torch.vmap over stacked params runs forward and backward batched

    @staticmethod
    def forward(cell: Cell, recompute: bool, members: int | Members, n_carry: int, has_reset: bool, inp, mask, *rest):
        carry0, reset, weights = split_inputs(rest, n_carry, has_reset)
        members = Members.of(members)
        # An ensemble projects its input step by step: the whole sequence's projection, [T, E, N, G*H], is
        # E times a member's and would be allocated (and page-faulted in) afresh on every call.
        project = bool(members.count)
        gi = members.time_major(inp if project else members.linear(inp, *weights[:2]), 1)  # [T, (e,) N, F or G*H]
        mask, reset = members.time_major(mask, 0), reset and tuple(members.time_major(r, 0) for r in reset)
        _, outs = scan_states(cell, weights, carry0, gi, mask, reset, "states" if recompute else "saved", members, project)
        return tuple(outs)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        cell, recompute, members, n_carry, has_reset, inp, mask, *rest = inputs
        carry0, reset, weights = split_inputs(rest, n_carry, has_reset)
        saved = output[n_carry:]
        ctx.mark_non_differentiable(*saved)
        ctx.cell, ctx.members, ctx.n_carry, ctx.n_weights, ctx.n_reset = cell, Members.of(members), n_carry, len(weights), len(reset or ())
        ctx.amp = _amp_state(inp.device.type)
        ctx.save_for_backward(inp, mask, *carry0, *weights, *output, *(reset or ()))

    @staticmethod
    def backward(ctx, *grad_outputs):
        # under the autocast state the forward ran in (as torch.amp.custom_bwd): its activations are in autocast's
        # dtype where its ops were, and a backward in another state mixed dtypes ("expected m1 and m2 to have the same
        # dtype", the block GRU under autocast) or rounded differently from reference's autograd (the norm GRU)
        device, enabled, dtype = ctx.amp
        if _amp_state(device) == ctx.amp:
            return HandWrittenLayer._backward(ctx, grad_outputs)
        with torch.autocast(device, dtype=dtype, enabled=enabled):
            return HandWrittenLayer._backward(ctx, grad_outputs)

    @staticmethod
    def _backward(ctx, grad_outputs):
        if torch.is_grad_enabled():  # create_graph=True (or torch.func.grad): this backward is differentiated too
            return _replayed_backward(ctx, grad_outputs[: ctx.n_carry])
        n, n_w, cell, members = ctx.n_carry, ctx.n_weights, ctx.cell, ctx.members
        inp, mask, *rest = ctx.saved_tensors
        carry0, weights, outputs = rest[:n], tuple(rest[n : n + n_w]), rest[n + n_w : len(rest) - ctx.n_reset]
        reset = tuple(members.time_major(r, 0) for r in rest[len(rest) - ctx.n_reset :])
        states, saved, grad_states = outputs[:n], tuple(outputs[n:]), grad_outputs[:n]
        w = LayerWeights.from_tensors(weights)
        extra = any(t is not None for t in w.extra)
        mask_t = members.time_major(mask, 0)
        x = members.time_major(inp, 1)  # [T, (e,) N, F]
        # Eagerly, one model runs the reverse scan a few steps at a time (a span, :func:`_spans`): each span's
        # elementwise factors are computed at once before it and its per-step cotangents reduced into the weight
        # gradients after it, in buffers that stay in cache and come back from the heap for the next span, where
        # [T, N, .] ones were page-faulted in afresh every call (block GRU: docs/model_based.md). Compiled, and for
        # an ensemble, one span, each step's factors computed inside the scan's body, fused into it.
        eager = not members.count and not torch.compiler.is_compiling()
        steps = states[0].shape[0]
        spans = _spans(steps, states[0][0]) if eager else ((0, steps),)
        # what each step reads: its factors (eager), what they are computed from (compiled), or its input (no saved)
        key = "x" if len(saved) == 0 else "factors" if eager else "saved"  # len: Dynamo 2.11 cannot trace bool(tuple)
        # scan needs the carry in init's layout: vmap leaves it in its own, and a block GRU with blocks of one unit
        # computes its cotangent transposed ([N, H] with strides (1, N): "Expected init and carry to have same metadata")
        own = contiguous_copy if members.count or torch.compiler.is_compiling() else (lambda t: t)

        def member_back(inputs, pre_t, wts, d_new):
            wl = LayerWeights.from_tensors(wts)
            if key == "x":
                grads = cell.step_backward(F.linear(inputs, wl.weight_ih, wl.bias_ih), pre_t, wl, d_new)
            else:
                factors = cell.backward_factors(inputs, pre_t, wl) if key == "saved" else inputs
                grads = cell.step_backward_saved(factors, pre_t, wl, d_new)
            d_gh = () if grads.d_gh is None else (grads.d_gh,)  # none: equal to d_gi (vmap returns tensors only)
            return tuple(grads.d_carry), grads.d_gi, d_gh, tuple(d for d in grads.d_extra if d is not None)

        def back_step(acc, xs_t):
            d_new = tuple(a + b for a, b in zip(acc["d_carry"], xs_t["g"]))
            d_pre, d_gi, d_gh, d_extra = members.map(member_back, xs_t[key], xs_t["pre"], weights, d_new)
            out = {"d_gi": members.rows_by_member(d_gi), **{"d_gh": members.rows_by_member(d) for d in d_gh}}
            m = xs_t.get("mask")
            if m is not None:  # where the carry was reset, its cotangent goes to reset_state (or nowhere)
                if reset:
                    out["d_reset"] = tuple(torch.where(broadcast_mask(m, d), d, 0.0) for d in d_pre)
                d_pre = tuple(torch.where(broadcast_mask(m, d), 0.0, d) for d in d_pre)
            if extra:  # under compile, fresh: a cell's per-row factors may be views of the step's inputs (scan's rule)
                out["d_extra"] = tuple(map(contiguous_copy, d_extra)) if torch.compiler.is_compiling() else d_extra
            return {"d_carry": tuple(own(d) for d in d_pre)}, out

        acc = {"d_carry": tuple(torch.zeros_like(s[0]) for s in states)}
        totals, parts = None, []
        for start, end in reversed(spans):
            pre = _carries_before(carry0, states, start, end, members)
            pre = apply_reset(pre, None if mask_t is None else mask_t[start:end], tuple(r[start:end] for r in reset) or None)
            xs = {"pre": pre, "g": tuple(g[start:end] for g in grad_states)}
            if key == "x":
                xs["x"] = x[start:end]
            else:
                span_saved = tuple(s[start:end] for s in saved)
                xs[key] = cell.backward_factors(span_saved, pre, w) if key == "factors" else span_saved
            if mask_t is not None:
                xs["mask"] = broadcast_mask(mask_t[start:end], x)  # [C, N, 1]
            reads = (inp, mask, *pre, *grad_states, *reset, *saved, *(wt for wt in weights if wt is not None))
            # Reversed time: the outputs come back with index 0 = step end - 1 (under compile the scan then needs
            # no ``reverse``, whose flips of its outputs would copy the [T, N, G*H] gate cotangents).
            acc, outs = time_loop(back_step, acc, xs, reads, reverse=True, members=members)
            weight_grads, part = _span_grads(cell, w, members, outs, x[start:end], pre[0])
            totals = weight_grads if totals is None else [None if a is None else a + b for a, b in zip(totals, weight_grads)]
            parts.append(part)
        time_dim = int(bool(members.count))  # of reset_state per member (x: after N)
        d_x = _in_time_order([p[0] for p in parts], 1 + time_dim)
        d_reset = tuple(members.like(_in_time_order([p[i] for p in parts], time_dim), r)
                        for i, r in enumerate(rest[len(rest) - ctx.n_reset :], start=1))
        d_weights = tuple(None if d is None else members.like(d, t) for d, t in zip(totals, weights))
        d_carry0 = tuple(members.like(d, c) for d, c in zip(acc["d_carry"], carry0))
        return (None, None, None, None, None, members.like(d_x, inp), None, *d_carry0, *d_reset, *d_weights)


CHUNK_BYTES = 256 * 1024
SPAN_ROWS = 512


def _spans(steps: int, state_step: torch.Tensor) -> tuple[tuple[int, int], ...]:
    """``(start, end)`` spans of ``steps`` in time order, the last maybe shorter. Each holds as many steps as keep a
    state-wide tensor (one step: ``state_step [N, S]``) within ``CHUNK_BYTES``, so that the dozens of elementwise ops
    of a span work in the core's cache, and at least ``SPAN_ROWS`` rows (steps times ``N``) for the weight-gradient
    products: spans of 256 rows ran the eager GRU at ``N = 256, H = 256`` 10% slower than the whole sequence at once
    (512 rows: 0-4%). Longer spans make longer buffers, which glibc maps and page-faults in afresh on every call: the
    block GRU at ``N = 32, H = 128`` page-faulted 3,500 times per call in spans of 32 steps, 100-700 in spans of 16."""
    row_bytes = state_step.numel() * state_step.element_size()
    size = max(1, CHUNK_BYTES // max(1, row_bytes), -(-SPAN_ROWS // max(1, state_step.shape[0])))
    return tuple((start, min(start + size, steps)) for start in range(0, steps, size))


def _carries_before(carry0: Carry, states: Carry, start: int, end: int, members: Members) -> Carry:
    """The carry each step of ``start:end`` starts from, before its reset: the state after the previous step
    (``carry0`` at step 0); ``[end - start, (E,) N, S]`` each (a view of ``states`` from the second span on)."""
    if start:
        return tuple(s[start - 1 : end - 1] for s in states)
    # one step more, then cut: a traced ``s[: end - 1]`` guards ``T - 1 != 1`` (a compiled T = 2 call recompiled)
    return tuple(torch.cat([members.expand(c0).unsqueeze(0), s[:end]])[:end] for c0, s in zip(carry0, states))


def _span_grads(cell: Cell, w: LayerWeights, members: Members, outs: dict, x: torch.Tensor, pre_h: torch.Tensor):
    """One span's share of the gradients from its reversed-time outputs (``outs``), its input ``x [C, (e,) N, F]`` and
    the carry's first tensor before each step ``pre_h``: ``(weight gradients, (d_x [(E,) N, C, F], *d_reset))``;
    the weight gradients are sums over time, which spans add up."""
    d_gi = members.from_rows_by_member(outs["d_gi"])  # [C, (E,) N, G*H], reversed time
    d_gh = members.from_rows_by_member(outs["d_gh"]) if "d_gh" in outs else d_gi
    d_extra = iter(members.map_time_major(cell.reduce_extra_grads, *outs["d_extra"]) if "d_extra" in outs else ())
    seq = members.map_time_major
    weight_grads = [
        seq(_outer_sum, d_gi, x.flip(0)),
        seq(_sum_rows, d_gi) if w.bias_ih is not None else None,
        seq(_outer_sum, d_gh, pre_h.flip(0)) if w.weight_hh is not None else None,  # none: linear in the state
        seq(_sum_rows, d_gh) if w.bias_hh is not None else None,
        *(None if t is None else next(d_extra) for t in w.extra),
    ]
    d_x = members.map(torch.matmul, members.members_first(d_gi), w.weight_ih)  # [(E,) C, N, F], reversed time
    d_x = members.from_time_major(members.members_first(d_x).flip(0), 1)
    return weight_grads, (d_x, *(members.from_time_major(d.flip(0), 0) for d in outs.get("d_reset", ())))


def _in_time_order(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    """The spans' pieces (last span first) joined along their time ``dim``."""
    return parts[0] if len(parts) == 1 else torch.cat(parts[::-1], dim=dim)


def _replayed_backward(ctx, grad_states: tuple) -> tuple:
    """:class:`HandWrittenLayer`'s backward when autograd records it (``create_graph=True``, ``torch.func``'s
    transforms): :func:`~.base.replayed_vjp` of the layer's plain steps (the eager loop). (The hand-written reverse
    scan reads the saved activations as constants: its own derivative would miss their dependence on the inputs
    and weights.) Not a ``jvp`` method: Dynamo refuses to trace a Function that defines one; forward mode runs
    the plain loop instead (see :mod:`.scan`)."""
    if ctx.members.count:
        raise RuntimeError(
            "backend 'scan' under a compiled torch.vmap ensemble has no higher-order gradients (create_graph=True): "
            "its backward is compiled once. Use backend='reference' for these derivatives of an ensemble."
        )
    n = ctx.n_carry
    inp, mask, *rest = ctx.saved_tensors
    reset = tuple(rest[len(rest) - ctx.n_reset :])

    def states(x, *tensors):  # inp, *carry0, *reset, *weights: the forward's differentiable arguments, in order
        carry0, reset_t, weights = split_inputs(tensors, n, ctx.n_reset > 0)
        gi = F.linear(x, *weights[:2]).transpose(0, 1)  # [T, N, G*H], as the forward projects it
        return scan_states(ctx.cell, weights, carry0, gi, mask, reset_t, "states")[1]

    grads = replayed_vjp(states, (inp, *rest[:n], *reset, *rest[n : n + ctx.n_weights]), grad_states)
    needs = (ctx.needs_input_grad[5], *ctx.needs_input_grad[7:])
    grads = [g if need else None for g, need in zip(grads, needs)]
    return (None, None, None, None, None, grads[0], None, *grads[1:])
