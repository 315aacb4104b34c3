"""``pad``: ATen's fused kernels of a cell with :class:`~rnn_functional.cells.AtenKernels` (cuDNN on CUDA,
oneDNN/native on CPU): one :func:`kernel` call, or with interior resets a layout of the segments (:mod:`.segments`).
Eager only (host-side lengths; no vmap rule): the functional layer routes it to ``scan`` compiled, ``reference``
under eager ``torch.vmap``."""

from __future__ import annotations

from functools import partial

import torch

from ..cells import AtenKernels, Carry, Layout, apply_reset
from .base import SequenceOptions, no_kernel_for

_SWAP = partial(torch.transpose, dim0=0, dim1=1)  # [N, L, S] <-> the kernels' layer-major [L, N, S]


def aten_kernels(layout: Layout) -> AtenKernels:
    """The cell's ATen kernels; ``ValueError`` naming the backends that can serve it when it has none."""
    if layout.cell.aten is None:
        raise no_kernel_for("pad", layout.cell)
    return layout.cell.aten


def kernel(layout: Layout, params, x: torch.Tensor, carry: Carry, opts: SequenceOptions,
           batch_sizes: torch.Tensor | None = None) -> tuple[torch.Tensor, Carry]:
    """ATen's sequence kernel over all layers: ``x [N, T, F]`` (or packed, with ``batch_sizes [Lmax]`` int64 on the
    CPU), ``carry`` ``[N, L, S]`` each -> ``(y, the carry after each row's last step)``. cuDNN keeps what its backward
    needs only in training mode, so a call recording gradients runs in it (dropout only if ``opts.training``)."""
    train = bool(opts.training) or (x.is_cuda and torch.is_grad_enabled())
    hx = tuple(map(torch.Tensor.contiguous, map(_SWAP, carry)))
    run = layout.cell.aten.sequence  # the route checked that the cell has it
    y, hx = run(layout, params, x, hx, float(opts.dropout) if opts.training else 0.0, train, batch_sizes)
    return y, tuple(map(_SWAP, hx))


def sequence(layout: Layout, params, x, carry: Carry, is_init, reset, opts: SequenceOptions):
    """The canonical call (:mod:`.base`) reading ``is_init[:, 0]`` alone; per-step carries: the final one."""
    if is_init is not None:
        carry = apply_reset(carry, is_init[:, 0], None if reset is None else tuple([r[:, 0] for r in reset]))
    y, final = kernel(layout, params, x, carry, opts)
    per_step = tuple([s.unsqueeze(1).expand(-1, x.shape[1], -1, -1) for s in final]) if opts.segment_states else None
    return y, final, per_step


def step(layout: Layout, params, x: torch.Tensor, carry: Carry) -> tuple[torch.Tensor, Carry]:
    """All layers' fused ATen step (``lstm_cell``/``gru_cell``; eager, no projection): ``x [N, F]``, ``[N, L, S]``."""
    run = layout.cell.aten.step  # resolve_step checked that the cell has it
    if layout.num_layers == 1:  # views in and out: a policy step's cost is its op count
        new = run(layout.cell.layer_weights(params, layout, 0), x, tuple(map(partial(torch.squeeze, dim=1), carry)))
        return new[0], tuple(map(partial(torch.unsqueeze, dim=1), new))
    new_layers, inp = [], x
    for k in range(layout.num_layers):
        layer = run(layout.cell.layer_weights(params, layout, k), inp, tuple([s[:, k] for s in carry]))
        new_layers.append(layer)
        inp = layer[0]
    return inp, tuple(map(partial(torch.stack, dim=1), zip(*new_layers)))
