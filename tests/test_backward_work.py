"""A sequence's backward does work linear in its length.

Counted, not timed: a dispatch mode adds up the elements of every tensor the backward's operators return.
Four times ``T`` must about quadruple it. Indexing ``x[:, t]`` at every step made it quadratic (each index's
backward is a zero-filled gradient of the whole ``[N, T, F]`` input, summed over the steps): a GRU
``reference`` backward over ``[512, 256]`` took 4.6 s instead of 0.8 s. ATen's packed kernel zero-fills its
whole input gradient at every step itself (the cost table prices it, ``docs/backends.md``), and ``pad``'s length
buckets are cut by the cost table (more calls at a larger ``T``), so ``pad`` runs the call as it is here (no
interior reset) and the loop following the LSTM's ``c`` in a length bucket is counted on its own.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import rnn_functional as rf
from rnn_functional.cells import Cell
from rnn_functional.cells.lstm import LSTM

N, F_IN, HIDDEN = 8, 16, 16  # wide: a per-step copy of the input or of the gates would dominate the count
SEQUENCES = {"lstm": (rf.init_lstm_params, rf.lstm_sequence), "gru": (rf.init_gru_params, rf.gru_sequence),
             "norm_gru": (rf.init_norm_gru_params, rf.norm_gru_sequence)}
ROUTES = [("reference", "rows"), ("reference", "aligned"), ("scan", "rows"), ("scan", "aligned"), ("pad", "auto")]


class _Elements(TorchDispatchMode):
    """The elements of every tensor the operators run under it return."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.count += sum(t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        return out


def _backward_elements(cell: str, backend: str, layout: str, t_len: int, reset_state: bool) -> int:
    """Elements the backward of one call over ``[N, t_len]`` returns, with a reset on every row (``pad``: none),
    a step apart from row to row (the segments' number is fixed: a padded layout's block grows with ``t_len``
    only), every output in the loss, two layers."""
    g, layers = torch.Generator().manual_seed(0), 2
    init, sequence = SEQUENCES[cell]
    params = {k: v.requires_grad_(True) for k, v in init(F_IN, HIDDEN, layers, generator=g, dtype=torch.float64).items()}
    x = torch.randn(N, t_len, F_IN, generator=g, dtype=torch.float64, requires_grad=True)
    is_init = torch.zeros(N, t_len, dtype=torch.bool)
    if backend != "pad":
        is_init[torch.arange(N), t_len // 2 + torch.arange(N)] = True  # one reset a row, a step apart from row to row
    kw = {}
    if reset_state:
        shape = (N, t_len, layers, HIDDEN)
        kw["reset_state"] = ((torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True),) * 2
                             if cell == "lstm" else torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True))
    y, final = sequence(x, None, params, is_init=is_init, backend=backend, segment_layout=layout, **kw)
    loss = y.square().sum() + sum(s.square().sum() for s in (final if isinstance(final, tuple) else (final,)))
    with _Elements() as counted:
        loss.backward()
    return counted.count


@pytest.mark.parametrize("reset_state", [False, True])
@pytest.mark.parametrize(("backend", "layout"), ROUTES)
@pytest.mark.parametrize("cell", list(SEQUENCES))
def test_backward_work_is_linear_in_the_sequence_length(cell, backend, layout, reset_state):
    if backend == "pad" and cell == "norm_gru":
        pytest.skip("the layer-norm GRU has no ATen kernel")
    if backend == "pad" and reset_state:
        pytest.skip("reset_state is read at resets only, and pad runs none here")
    short, long = (_backward_elements(cell, backend, layout, t, reset_state) for t in (32, 128))
    assert long <= 4.6 * short, f"the backward's work grew {long / short:.2f}x when T grew 4x"


@pytest.mark.parametrize("follow", ["lstm", "default"])
def test_following_the_lstm_cell_state_is_linear_in_the_sequence_length(follow):
    """``Cell.carry_rest_given_h``, which a length bucket runs for the LSTM's ``c`` of its shorter segments: the
    LSTM's own (the gates in one batch, then ``c``'s recurrence) and the default loop over ``layer_step``, which
    agree, each with a backward linear in ``T``."""
    def run(t_len: int, fn):
        g = torch.Generator().manual_seed(0)
        params = {k: v.requires_grad_(True) for k, v in rf.init_lstm_params(F_IN, HIDDEN, generator=g,
                                                                            dtype=torch.float64).items()}
        w = LSTM.layer_weights(params, LSTM.read_layout(params), 0)
        gi, h_prev = (torch.randn(N, t_len, size, generator=g, dtype=torch.float64, requires_grad=True)
                      for size in (4 * HIDDEN, HIDDEN))
        c0 = torch.randn(N, HIDDEN, generator=g, dtype=torch.float64, requires_grad=True)
        (c,) = fn(gi, h_prev, (c0,), w)
        with _Elements() as counted:
            c.square().sum().backward()
        return c.detach(), counted.count

    follows = {"lstm": LSTM.carry_rest_given_h, "default": lambda *a: Cell.carry_rest_given_h(LSTM, *a)}
    (c_short, short), (_, long) = (run(t, follows[follow]) for t in (32, 128))
    torch.testing.assert_close(c_short, run(32, follows["lstm" if follow == "default" else "default"])[0])
    assert long <= 4.6 * short, f"the backward's work grew {long / short:.2f}x when T grew 4x"


def test_length_buckets_backward_work_does_not_grow_with_their_number():
    """``pad``'s length buckets over a batch whose segments have many lengths (many buckets, LSTM in fp32: oneDNN's
    fused layer, whose own work is small in the count): the backward returns no more elements than the forward
    (0.27 of them). Slicing each bucket's input out of the shared buffer made that 3.8: a zero-filled gradient
    of the whole buffer per bucket (200 buckets over [256, 256]: 84% of an LSTM's backward)."""
    g = torch.Generator().manual_seed(0)
    params = {k: v.requires_grad_(True) for k, v in rf.init_lstm_params(128, 8, generator=g).items()}
    x = torch.randn(64, 96, 128, generator=g, requires_grad=True)
    is_init = torch.zeros(64, 96, dtype=torch.bool)
    is_init[torch.arange(64), 95 - torch.arange(64)] = True  # a long and a short segment a row, every length once
    with _Elements() as forward:
        y, _ = rf.lstm_sequence(x, None, params, is_init=is_init, backend="pad", segment_layout="buckets")
    with _Elements() as backward:
        y.square().sum().backward()
    assert backward.count <= forward.count, f"backward {backward.count} elements, forward {forward.count}"
