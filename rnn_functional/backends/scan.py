"""``scan``: ``torch._higher_order_ops.scan`` over time, one layer at a time.

Each layer projects its whole input sequence in one GEMM, then scans the recurrent part.
The scanned step returns cloned carries: scan forbids outputs that alias its inputs
(inductor's backward otherwise fails with "scan might be aliasing").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._higher_order_ops import scan as _scan

from .._layout import layer_weights
from ..functional._core import Carry, CellSpec, SequenceOptions, apply_reset, between_layers, keep_segment_ends


def _contiguous_copy(t: torch.Tensor) -> torch.Tensor:
    return t.clone(memory_format=torch.contiguous_format)


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
        gi = F.linear(inp, w.weight_ih, w.bias_ih).transpose(0, 1)  # [T, N, G*H]
        xs: dict[str, object] = {"gi": gi}
        if mask_t is not None:
            xs["mask"] = mask_t
            if reset is not None:
                xs["reset"] = tuple(r[:, :, k].transpose(0, 1) for r in reset)  # [T, N, S]

        def step(layer_carry, xs_t, w=w):
            layer_carry = apply_reset(layer_carry, xs_t.get("mask"), xs_t.get("reset"))
            new = cell.layer_step(xs_t["gi"], layer_carry, w)
            out = tuple(_contiguous_copy(s) for s in new) if opts.segment_states else new[0]
            return tuple(_contiguous_copy(s) for s in new), out

        final, ys = _scan(step, tuple(s[:, k].contiguous() for s in carry), xs)
        finals.append(final)
        if opts.segment_states:
            per_step.append(tuple(s.transpose(0, 1) for s in ys))  # [N, T, S]
            ys = ys[0]
        inp = between_layers(ys.transpose(0, 1), k, layout, opts.dropout, opts.training)
    seg = None
    if opts.segment_states:
        seg = keep_segment_ends(tuple(torch.stack(parts, dim=2) for parts in zip(*per_step)), is_init)
    return inp, tuple(torch.stack(parts, dim=1) for parts in zip(*finals)), seg
