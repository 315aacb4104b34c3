"""Compiled training of vmapped ensembles on the ``scan`` backend: one layer of E members at once. Under
``torch.compile`` with gradients, a vmapped ``scan`` cannot be differentiated ("Expected init and carry to have same
metadata") nor Dynamo vmap the hand-written layer ("You tried to vmap over ApplyTemplate"). So such a layer calls the
op ``rnn_functional::scan_ensemble_layer``, whose vmap rule folds every vmapped dim into a leading ensemble dim (``e``:
``E`` or 1, shared), and which runs :class:`~.scan_parts.HandWrittenLayer` over the members on plain tensors."""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from ..cells import CELLS, Carry, Cell
from .scan_parts import HandWrittenLayer, Members, split_inputs

__all__ = ["layer_states", "serves"]


def serves(recompute: bool, *tensors: torch.Tensor | None) -> bool:
    """Compiled: a vmapped input, and autograd on or ``recompute`` (vmapped tensors report no ``requires_grad``)."""
    return (recompute or torch.is_grad_enabled()) and any(
        t is not None and torch._C._functorch.is_batchedtensor(t) for t in tensors)


def layer_states(cell: Cell, recompute: bool, n_carry: int, has_reset: bool, inp, mask, *rest) -> Carry:
    """:class:`~.scan_parts.HandWrittenLayer`'s arguments without ``members`` -> the per-step carries."""
    if CELLS.get(cell.name) is not cell:
        raise ValueError(f"the {cell.title} cell has no compiled ensemble path: register it where it is made "
                         f"(rnn_functional.cells.register).")
    lead = lambda t: None if t is None else t.unsqueeze(0)
    carry0, reset, weights = split_inputs(rest, n_carry, has_reset)
    states = torch.ops.rnn_functional.scan_ensemble_layer(cell.name, recompute, lead(inp), lead(mask),
        [lead(s) for s in carry0], None if reset is None else [lead(r) for r in reset], [lead(t) for t in weights])
    return tuple(s.squeeze(0) for s in states)


def _layer_impl(cell: str, recompute: bool, inp, mask, carry0, reset, weights):
    """The op: ``inp [e, T, N, F]``, ``mask [e, T, N]``, ``carry0 [e, N, S]``, ``reset [e, T, N, S]``, weights
    ``[e, ...]`` -> the carry after every step, ``[E, T, N, S]`` each."""
    args = (inp, mask, reset, carry0, weights)
    count = max(t.shape[0] for t in pytree.tree_leaves(args) if t is not None)
    if count == 1:  # one model (size-1 members dims in a scan's carry break Inductor's stride checks)
        inp, mask, reset, carry0, weights = pytree.tree_map(lambda t: None if t is None else t.squeeze(0), args)
    else:  # the layer's members dim is after time; every member has its carry
        inp, mask, reset = pytree.tree_map(lambda t: None if t is None else t.movedim(1, 0), (inp, mask, reset))
        carry0 = [s.expand(count, *s.shape[1:]) for s in carry0]
    outs = HandWrittenLayer.apply(CELLS[cell], recompute, Members(0 if count == 1 else count, static_shapes=True),
                                  len(carry0), reset is not None, inp, mask, *carry0, *(reset or ()), *weights)
    # [T, N, S] -> [1, T, N, S], or [T, E, N, S] -> [E, T, N, S]
    return [s.unsqueeze(0) if count == 1 else s.transpose(0, 1) for s in outs[: len(carry0)]]


def _fold_vmapped_dim(info, in_dims, cell, recompute, inp, mask, carry0, reset, weights):
    """vmap rule: ``[B, e] -> [B * e]``; a tensor shared at one level only is expanded, at both stays ``e = 1``."""
    batch = info.batch_size
    args = (inp, mask, carry0, reset, weights)
    # a list argument's dims, one per entry (vmap may give one None for the list)
    dims = tuple([d] * len(v) if isinstance(v, (list, tuple)) and not isinstance(d, (list, tuple)) else d
                 for v, d in zip(args, in_dims[2:]))
    (leaves, spec), dims = pytree.tree_flatten(args), pytree.tree_leaves(dims)
    inner = max(t.shape[0] if d is None else t.movedim(d, 0).shape[1] for t, d in zip(leaves, dims) if t is not None)

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

    folded = pytree.tree_unflatten([fold(t, d) for t, d in zip(leaves, dims)], spec)
    states = torch.ops.rnn_functional.scan_ensemble_layer(cell, recompute, *folded)
    return [s.reshape(batch, inner, *s.shape[1:]) for s in states], [0] * len(states)


_LIB = torch.library.Library("rnn_functional", "FRAGMENT")
_LIB.define("scan_ensemble_layer(str cell, bool recompute, Tensor inp, Tensor? mask, Tensor[] carry0, Tensor[]? reset, "
            "Tensor?[] weights) -> Tensor[]")
_LIB.impl("scan_ensemble_layer", _layer_impl, "CompositeImplicitAutograd")
torch.library.register_vmap("rnn_functional::scan_ensemble_layer", _fold_vmapped_dim, lib=_LIB)
