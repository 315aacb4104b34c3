"""Compiled training of vmapped ensembles on the ``scan`` backend: one layer of E members at once.

``torch.compile(torch.vmap(fn))`` with gradients cannot differentiate a vmapped ``scan`` on
torch 2.13: scan's vmap rule moves the vmapped dim of the carry last, and scan's compiled
autograd then rejects the carry's strides ("Expected init and carry to have same metadata"),
while Dynamo refuses to vmap an ``autograd.Function`` such as the ``scan`` backend's
recomputing layer ("You tried to vmap over ApplyTemplate"). So, under ``torch.compile``, a
layer whose inputs are vmapped runs here instead, where no ``scan`` is ever vmapped:

* :func:`layer_states` calls the op ``rnn_functional::scan_ensemble_layer`` on tensors with a
  leading ensemble dim (size ``E``, or 1 for a tensor shared by every member). Dynamo records
  the op like any other; when AOTAutograd traces the graph, the op's vmap rule
  (:func:`_fold_vmapped_dim`) moves every vmapped dim into that leading dim and calls the op
  again, until no vmap level is left; then its implementation, :class:`_EnsembleLayer`, runs
  on plain tensors.
* :class:`_EnsembleLayer` is the ``scan`` backend's recomputing layer with an ensemble dim:
  its forward scans over time with the cell's step vmapped over the members (batched matmuls
  with the ``[E, G, H]`` weights), its backward is a reverse scan of the cell's hand-written
  step backward, vmapped likewise, and the weight gradients are batched GEMMs over all
  ``(t, n)``. Inductor compiles both scans like those of a single model.

Shapes (physical, inside the op): ``e`` is ``E`` or 1 (shared); ``inp [e, N, T, F]``,
``mask [e, T, N]``, ``carry0`` ``[e, N, S]`` each, ``reset`` ``[e, T, N, S]`` each, every
weight ``[e, *member_shape]``. Output: the carry after every step, ``[E, T, N, S]`` each.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..cells import Carry, Cell, LayerWeights, apply_reset, broadcast_mask
from .scan_parts import contiguous_copy, outer_sum, scan, sum_rows

__all__ = ["layer_states", "register_cell", "serves"]

_CELLS: dict[str, Cell] = {}  # the op names its cell by name (op schemas hold no Python objects)
_OP = "rnn_functional::scan_ensemble_layer"


def register_cell(cell: Cell) -> None:
    """Make ``cell`` servable by the ensemble op (the functional layer registers every public cell)."""
    _CELLS[cell.name] = cell


def _vmapped(t: torch.Tensor | None) -> bool:
    return t is not None and torch._C._functorch.is_batchedtensor(t)


def serves(recompute: bool, *tensors: torch.Tensor | None) -> bool:
    """True when this layer's call must run here: under ``torch.compile``, with a ``torch.vmap``-ed
    input, when autograd is on or ``recompute`` is asked for. (A vmapped tensor reports
    ``requires_grad=False`` whatever its base, so every vmapped call with grad mode on comes here.)"""
    return torch.compiler.is_compiling() and (recompute or torch.is_grad_enabled()) and any(_vmapped(t) for t in tensors)


def layer_states(cell: Cell, n_carry: int, has_reset: bool, inp, mask, *rest) -> Carry:
    """One layer over time, for one member, through the ensemble op: the per-step carries, ``[T, N, S]`` each.

    The call of the ``scan`` backend's recomputing layer: ``(cell, n_carry, has_reset, inp [N, T, F],
    mask [T, N] | None, *carry0 ([N, S] each), *reset ([T, N, S] each, if has_reset), *LayerWeights.tensors())``.
    """
    if cell.name not in _CELLS:
        raise ValueError(
            f"the {cell.title} cell has no compiled ensemble path: register it with "
            f"rnn_functional.backends.ensemble_scan.register_cell (the public functions do this)."
        )
    lead = lambda t: None if t is None else t.unsqueeze(0)  # noqa: E731 - the one-member ensemble dim
    carry0, reset, weights = _split(rest, n_carry, has_reset)
    states = torch.ops.rnn_functional.scan_ensemble_layer(
        cell.name, lead(inp), lead(mask), [lead(s) for s in carry0],
        [lead(r) for r in reset] if has_reset else None, [lead(t) for t in weights],
    )
    return tuple(s.squeeze(0) for s in states)


# ----------------------------------------------------------------------------- the ensemble layer


def _split(rest: tuple, n_carry: int, has_reset: bool) -> tuple[tuple, tuple, tuple]:
    """``(*carry0, *reset, *weights)`` -> ``(carry0, reset (empty without resets), weights)``."""
    n_states = n_carry * (2 if has_reset else 1)
    return tuple(rest[:n_carry]), tuple(rest[n_carry:n_states]), tuple(rest[n_states:])


def _static_scan(step, init, xs):
    """``scan`` with static shapes. The op's implementation runs while AOTAutograd traces (not under
    Dynamo), where ``scan`` compiles its step with Dynamo itself, once per call site and shape; from the
    second shape on, Dynamo's automatic dynamic shapes would make sizes symbolic, which Inductor's
    subgraph pass then rejects ("A subgraph argument other than striding has been modified")."""
    with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
        return scan(step, init, xs)


def _member_dims(tensors, members: int) -> tuple[tuple, tuple]:
    """``tensors`` (``[e, ...]`` or ``None``) ready for ``torch.vmap`` over the members:
    per-member ones keep their dim (in_dim 0), shared ones (``e = 1 < E``) lose it (in_dim ``None``)."""
    shared = [t is not None and t.shape[0] == 1 and members > 1 for t in tensors]
    args = tuple(t[0] if s else t for t, s in zip(tensors, shared))
    return args, tuple(None if (s or t is None) else 0 for t, s in zip(tensors, shared))


def _over_members(fn, in_dims: tuple):
    """``torch.vmap(fn, in_dims)``, or ``fn`` itself when every input is shared (vmap needs one mapped input)."""
    return fn if all(d is None for d in in_dims) else torch.vmap(fn, in_dims=in_dims)


def _like(grad: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``grad [E, ...]`` summed over the members where ``t`` is shared by all of them (``[1, ...]``)."""
    return grad.sum(0, keepdim=True) if t.shape[0] == 1 and grad.shape[0] != 1 else grad


class _EnsembleLayer(torch.autograd.Function):
    """E members of one layer over time; the backward recomputes every step from the saved carries.

    ``apply(cell, members, n_carry, has_reset, inp, mask, *carry0, *reset, *weights)`` (shapes in
    the module docstring) returns the carries after every step, ``[E, T, N, S]`` each. Saved for
    backward: the inputs and the carries, never the gates (as the ``scan`` backend's layer).
    """

    @staticmethod
    def forward(cell: Cell, members: int, n_carry: int, has_reset: bool, inp, mask, *rest):
        carry0, reset, weights = _split(rest, n_carry, has_reset)
        (inp_m, *w_m), (inp_d, *w_d) = _member_dims((inp, *weights), members)
        project = _over_members(F.linear, (inp_d, *w_d[:2]))
        gi = project(inp_m, *w_m[:2]).expand(members, -1, -1, -1).permute(2, 0, 1, 3)  # [T, E, N, G*H]
        step_members = torch.vmap(lambda gi_t, carry, w: cell.layer_step(gi_t, carry, LayerWeights.from_tensors(w)),
                                  in_dims=(0, 0, tuple(w_d)))
        xs: dict[str, object] = {"gi": gi}
        if mask is not None:
            xs["mask"] = mask.transpose(0, 1)  # [T, e, N]
            if has_reset:
                xs["reset"] = tuple(r.transpose(0, 1) for r in reset)  # [T, e, N, S]

        def step(carry, xs_t):
            carry = apply_reset(carry, xs_t.get("mask"), xs_t.get("reset"))  # broadcasts over shared members
            new = step_members(xs_t["gi"], carry, tuple(w_m))
            return tuple(contiguous_copy(s) for s in new), tuple(contiguous_copy(s) for s in new)

        init = tuple(contiguous_copy(s.expand(members, -1, -1)) for s in carry0)
        _, states = _static_scan(step, init, xs)  # [T, E, N, S] each
        return tuple(s.transpose(0, 1) for s in states)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        cell, members, n_carry, has_reset, inp, mask, *rest = inputs
        ctx.cell, ctx.members, ctx.n_carry, ctx.has_reset = cell, members, n_carry, has_reset
        ctx.save_for_backward(inp, mask, *rest, *output)

    @staticmethod
    def backward(ctx, *grad_states):
        cell, members, n = ctx.cell, ctx.members, ctx.n_carry
        inp, mask, *saved = ctx.saved_tensors
        (carry0, reset, weights), states = _split(saved[:-n], n, ctx.has_reset), saved[-n:]
        (inp_m, *w_m), (inp_d, *w_d) = _member_dims((inp, *weights), members)
        w_m, w_d = tuple(w_m), tuple(w_d)
        w = LayerWeights.from_tensors(weights)
        # The extra weights' per-step gradients leave the scan as outputs and are summed after it: summed
        # in the scan's carry instead, Inductor miscompiles them (a 2-layer norm GRU's norm_bias_l1
        # gradient comes out wrong on torch 2.13; aot_eager is right).
        extra = [i for i, t in enumerate(w.extra) if t is not None]

        # Reversed time-major layout (index 0 = step T - 1), as the scan backend's layer backward.
        x_r = inp_m.movedim(-2, 0).flip(0)  # [T, (E,) N, F]
        x_dim = None if inp_d is None else 1
        mask_r = None if mask is None else mask.transpose(0, 1).flip(0)  # [T, e, N]
        reset_r = tuple(r.transpose(0, 1).flip(0) for r in reset) or None  # [T, e, N, S]
        states_r = tuple(s.transpose(0, 1).flip(0) for s in states)  # [T, E, N, S]
        pre = tuple(torch.cat([s[1:], c0.expand(members, -1, -1).unsqueeze(0)]) for c0, s in zip(carry0, states_r))
        pre = apply_reset(pre, mask_r, reset_r)
        xs = {"x": x_r, "g": tuple(g.transpose(0, 1).flip(0) for g in grad_states), "pre": pre}
        if mask_r is not None:
            xs["mask"] = mask_r

        def member_back(x_t, pre_t, wts, d_new):
            wl = LayerWeights.from_tensors(wts)
            grads = cell.step_backward(F.linear(x_t, wl.weight_ih, wl.bias_ih), pre_t, wl, d_new)
            d_extra = tuple(grads.d_extra[i] for i in extra)
            d_gh = () if grads.d_gh is None else (grads.d_gh,)  # none: equal to d_gi (vmap returns tensors only)
            return grads.d_carry, grads.d_gi, d_gh, d_extra

        back_members = torch.vmap(member_back, in_dims=(0 if x_dim is not None else None, 0, w_d, 0))

        def back_step(acc, xs_t):
            d_new = tuple(a + b for a, b in zip(acc["d_carry"], xs_t["g"]))
            d_pre, d_gi, d_gh, d_extra = back_members(xs_t["x"], xs_t["pre"], w_m, d_new)
            out = {"d_gi": d_gi, **{"d_gh": d for d in d_gh}, "d_extra": d_extra}
            m = xs_t.get("mask")
            if m is not None:  # where the carry was reset, its cotangent goes to reset_state (or nowhere)
                if reset:
                    out["d_reset"] = tuple(torch.where(broadcast_mask(m, d), d, 0.0) for d in d_pre)
                d_pre = tuple(torch.where(broadcast_mask(m, d), 0.0, d) for d in d_pre)
            return {"d_carry": tuple(contiguous_copy(d) for d in d_pre)}, out

        init = {"d_carry": tuple(torch.zeros_like(s[0]) for s in states_r)}
        acc, outs = _static_scan(back_step, init, xs)

        d_gi = outs["d_gi"]
        d_gh = outs.get("d_gh", d_gi)  # [T, E, N, G*H], reversed time
        per_member = lambda fn, *dims: torch.vmap(fn, in_dims=dims)  # noqa: E731
        h_pre = pre[0]
        d_w_ih = per_member(outer_sum, 1, x_dim)(d_gi, x_r)
        d_w_hh = per_member(outer_sum, 1, 1)(d_gh, h_pre)
        d_extra = iter(d.sum(0) for d in outs["d_extra"])  # [T, E, ...] -> [E, ...]
        d_weights = (
            d_w_ih,
            per_member(sum_rows, 1)(d_gi) if w.bias_ih is not None else None,
            d_w_hh,
            per_member(sum_rows, 1)(d_gh) if w.bias_hh is not None else None,
            *(None if t is None else next(d_extra) for t in w.extra),
        )
        d_weights = tuple(None if d is None else _like(d, t) for d, t in zip(d_weights, weights))
        d_inp = per_member(torch.matmul, 1, w_d[0])(d_gi, w_m[0])  # [E, T, N, F], reversed time
        d_inp = _like(d_inp.flip(1).transpose(1, 2), inp)
        d_carry0 = tuple(_like(d, c) for d, c in zip(acc["d_carry"], carry0))
        d_reset = tuple(_like(d.flip(0).transpose(0, 1), r) for d, r in zip(outs.get("d_reset", ()), reset))
        return (None, None, None, None, d_inp, None, *d_carry0, *d_reset, *d_weights)


# ----------------------------------------------------------------------------- the op


def _layer_impl(cell: str, inp, mask, carry0, reset, weights):
    tensors = (inp, mask, *carry0, *(reset or ()), *weights)
    members = max(t.shape[0] for t in tensors if t is not None)
    states = _EnsembleLayer.apply(
        _CELLS[cell], members, len(carry0), reset is not None, inp, mask, *carry0, *(reset or ()), *weights
    )
    return list(states)


def _fold_vmapped_dim(info, in_dims, cell, inp, mask, carry0, reset, weights):
    """vmap rule: every tensor's vmapped dim ``B`` joins its ensemble dim (``[B, e] -> [B * e]``).

    A tensor vmapped at this level but shared inside (``e = 1``) while others are not, or shared
    at this level but not inside, is expanded (a copy; only nested vmaps meet it). A tensor
    shared at both keeps ``e = 1`` (no copy: shared inputs are read once).
    """
    batch = info.batch_size
    inner = max(t.shape[0] if d is None else t.movedim(d, 0).shape[1] for t, d in _pairs(in_dims, inp, mask, carry0, reset, weights))

    def fold(t, d):
        if t is None:
            return None
        if d is None:
            if t.shape[0] == 1:
                return t
            t = t.unsqueeze(0).expand(batch, *t.shape)
        else:
            t = t.movedim(d, 0)
        if t.shape[1] != inner:
            t = t.expand(batch, inner, *t.shape[2:])
        return t.reshape(batch * inner, *t.shape[2:])

    _, in_inp, in_mask, in_carry, in_reset, in_w = (_per_entry(v, d) for v, d in zip((cell, inp, mask, carry0, reset, weights), in_dims))
    states = torch.ops.rnn_functional.scan_ensemble_layer(
        cell, fold(inp, in_inp), fold(mask, in_mask), [fold(s, d) for s, d in zip(carry0, in_carry)],
        None if reset is None else [fold(r, d) for r, d in zip(reset, in_reset)],
        [fold(t, d) for t, d in zip(weights, in_w)],
    )
    return [s.reshape(batch, inner, *s.shape[1:]) for s in states], [0] * len(states)


def _per_entry(value, dim):
    """The vmapped dims of a list argument, one per entry (vmap may give one ``None`` for the whole list)."""
    if isinstance(value, (list, tuple)) and not isinstance(dim, (list, tuple)):
        return [dim] * len(value)
    return dim


def _pairs(in_dims, *values):
    """``(tensor, vmapped dim)`` for every tensor among ``values`` (tensors and lists of tensors, after ``cell``)."""
    for v, d in zip(values, in_dims[1:]):
        if isinstance(v, (list, tuple)):
            yield from ((t, e) for t, e in zip(v, _per_entry(v, d)) if t is not None)
        elif v is not None:
            yield v, d


_LIB = torch.library.Library("rnn_functional", "FRAGMENT")
_LIB.define(
    "scan_ensemble_layer(str cell, Tensor inp, Tensor? mask, Tensor[] carry0, Tensor[]? reset, "
    "Tensor?[] weights) -> Tensor[]"
)
_LIB.impl("scan_ensemble_layer", _layer_impl, "CompositeImplicitAutograd")
torch.library.register_vmap(_OP, _fold_vmapped_dim, lib=_LIB)
