"""``pad``: ATen's fused kernels of a cell (cuDNN on CUDA, oneDNN/native on CPU).

Serves cells with :class:`~rnn_functional.cells.AtenKernels` (LSTM, GRU). :func:`sequence`
runs a call without interior resets as one kernel call; :func:`packed_sequence` runs rows of
different lengths as one call over a packed sequence. A call with interior resets runs on one of
the layouts of its segments in :mod:`.segments` (packed, length buckets, whole slices), which call these.

Both are eager-only (the lengths are host-side counts; ATen's kernels have no vmap rule): the
dispatcher (:func:`rnn_functional.functional.selection.choose`) routes ``pad`` to
``scan`` under ``torch.compile`` and to ``reference`` under eager ``torch.vmap``.
"""

from __future__ import annotations

import torch

from ..cells import AtenKernels, Carry, Layout, apply_reset
from .base import SequenceOptions, no_kernel_for


def aten_kernels(layout: Layout) -> AtenKernels:
    """The cell's ATen kernels; ``ValueError`` naming the backends that can serve it when it has none."""
    if layout.cell.aten is None:
        raise no_kernel_for("pad", layout.cell)
    return layout.cell.aten


def to_layer_major(carry: Carry) -> Carry:
    return tuple([s.transpose(0, 1).contiguous() for s in carry])


def to_batch_major(carry: Carry) -> Carry:
    return tuple([s.transpose(0, 1) for s in carry])


def kernel_mode(x: torch.Tensor, opts: SequenceOptions) -> tuple[float, bool]:
    """``(dropout, train)`` for ATen's kernel. cuDNN keeps what its backward needs only in training mode
    ("cudnn RNN backward can only be called in training mode"), so a call that records gradients runs in it,
    with dropout only where ``opts.training`` asks for it."""
    train = bool(opts.training) or (x.is_cuda and torch.is_grad_enabled())
    return (float(opts.dropout) if opts.training else 0.0), train


def sequence(layout: Layout, params, x, carry: Carry, is_init, reset, opts: SequenceOptions):
    """``x [N, T, F]`` -> ``(y [N, T, P], carry, per-step carries)``; see :mod:`.base`.

    Serves resets at ``t = 0`` only: it reads ``is_init[:, 0]`` alone (a call with interior resets runs on
    one of the layouts of :mod:`.segments`, which :class:`.route.Route` picks). The per-step carries hold
    the final carry at every step.
    """
    run = aten_kernels(layout).sequence
    n, t_len = x.shape[0], x.shape[1]
    if is_init is not None:
        carry = apply_reset(carry, is_init[:, 0], None if reset is None else tuple([r[:, 0] for r in reset]))
    y, hx = run(layout, params, x, to_layer_major(carry), *kernel_mode(x, opts), None)
    final = to_batch_major(hx)
    per_step = tuple([s.unsqueeze(1).expand(n, t_len, *s.shape[1:]) for s in final]) if opts.segment_states else None
    return y, final, per_step


def packed_sequence(layout: Layout, params, data: torch.Tensor, batch_sizes: torch.Tensor, carry: Carry,
                    opts: SequenceOptions) -> tuple[torch.Tensor, Carry]:
    """Rows of different lengths, no resets, in one kernel call over their steps packed time-major.

    Args:
        data: ``[sum of lengths, F]``: step 0 of every row, then step 1 of the rows longer than 1, ...:
            the rows sorted by decreasing length, ``batch_sizes[t]`` (the first) rows at step ``t``.
        batch_sizes: ``[Lmax]`` int64 on the CPU, non-increasing, ``batch_sizes[0]`` the row count.
        carry: tuple of ``[S, L, ·]``, each row's carry before its first step (in the same row order).

    Returns:
        ``(out [sum of lengths, P], final)``: the outputs in ``data``'s order and each row's carry after
        its last step (tuple of ``[S, L, ·]``).
    """
    run = aten_kernels(layout).sequence
    out, hx = run(layout, params, data, to_layer_major(carry), *kernel_mode(data, opts), batch_sizes)
    return out, to_batch_major(hx)


def step(layout: Layout, params, x: torch.Tensor, carry: Carry) -> tuple[torch.Tensor, Carry]:
    """One step over all layers with the cell's fused ATen step (``lstm_cell`` / ``gru_cell``).

    ``x [N, F]``, carry tensors ``[N, L, S]``. Eager only (no vmap rule); no projection.
    """
    run = layout.cell.aten.step  # resolve_step checked that the cell has it
    if layout.num_layers == 1:  # views in and out: a policy step's cost is its op count
        squeezed, out = [], []
        for s in carry:
            squeezed.append(s.squeeze(1))
        new = run(layout.cell.layer_weights(params, layout, 0), x, tuple(squeezed))
        for s in new:
            out.append(s.unsqueeze(1))
        return new[0], tuple(out)
    new_layers = []
    inp = x
    for k in range(layout.num_layers):
        layer = run(layout.cell.layer_weights(params, layout, k), inp, tuple([s[:, k] for s in carry]))
        new_layers.append(layer)
        inp = layer[0]
    return inp, tuple([torch.stack(parts, dim=1) for parts in zip(*new_layers)])
