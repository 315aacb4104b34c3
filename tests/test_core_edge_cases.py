"""Edge cases handled once above the backends: empty batches (N = 0), empty sequences
(T = 0) and fresh outputs, on every backend.

A loss over an empty call backpropagates zeros into ``x``, the state, ``reset_state`` and
every parameter (``torch.nn.LSTM`` does at B = 0), and no output shares storage with an
input (``hT.zero_()`` must not zero the caller's ``h0``).
"""

from __future__ import annotations

import pytest
import torch

import rnn_functional as rf

F_IN, H, L = 3, 4, 2
BACKENDS = [*rf.available_backends(cell="gru"), "auto"]
CELLS = {
    "lstm": (rf.init_lstm_params, rf.lstm_step, rf.lstm_sequence, 2),
    "gru": (rf.init_gru_params, rf.gru_step, rf.gru_sequence, 1),
    "norm_gru": (rf.init_norm_gru_params, rf.norm_gru_step, rf.norm_gru_sequence, 1),
}
SERVES_NORM_GRU = ("reference", "scan", "auto")


def _tensors(out) -> list[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else [t for o in out for t in _tensors(o)]


def _state(n_states: int, *shape: int):
    tensors = [torch.randn(*shape, dtype=torch.float64, requires_grad=True) for _ in range(n_states)]
    return tensors, (tensors[0] if n_states == 1 else tuple(tensors))


def _cases():
    for backend in BACKENDS:
        for cell in CELLS:
            if cell == "norm_gru" and backend not in SERVES_NORM_GRU:
                continue
            yield backend, cell


def _assert_fresh(outputs, inputs) -> None:
    """No output with data shares storage with an input (empty tensors hold no data to share)."""
    input_ptrs = {t.untyped_storage().data_ptr() for t in inputs if t.numel()}
    for o in outputs:
        if o.numel():
            assert o.untyped_storage().data_ptr() not in input_ptrs, "an output aliases an input"


def _assert_grads(outputs, leaves, ones=()) -> None:
    """``sum(outputs)`` backpropagates zeros into every leaf but ``ones`` (which it sums as they are)."""
    assert all(o.requires_grad for o in outputs), "an output is not connected to autograd"
    loss = sum(o.sum() for o in outputs)
    grads = torch.autograd.grad(loss, leaves)
    for g, leaf in zip(grads, leaves):
        want = torch.ones_like(leaf) if any(leaf is o for o in ones) else torch.zeros_like(leaf)
        assert torch.equal(g, want)


@pytest.mark.parametrize("backend,cell", list(_cases()))
@pytest.mark.parametrize("empty", ["N=0", "T=0"])
@pytest.mark.parametrize("with_state", [True, False])
def test_empty_sequence_backpropagates_zeros_into_fresh_outputs(backend, cell, empty, with_state) -> None:
    init, _, sequence, n_states = CELLS[cell]
    params = init(F_IN, H, L, dtype=torch.float64).apply(lambda t: t.requires_grad_(True))
    n, t = (0, 5) if empty == "N=0" else (3, 0)
    x = torch.randn(n, t, F_IN, dtype=torch.float64, requires_grad=True)
    state_leaves, state = _state(n_states, n, L, H) if with_state else ([], None)
    reset_leaves, reset = _state(n_states, n, t, L, H)
    is_init = torch.ones(n, t, dtype=torch.bool)
    out = sequence(x, state, params, is_init=is_init, reset_state=reset, backend=backend, return_segment_states=True)
    outputs = _tensors(out)
    y, final = outputs[0], outputs[1 : 1 + n_states]
    assert y.shape == (n, t, H)
    for s, want in zip(final, state_leaves or [torch.zeros(n, L, H, dtype=torch.float64)] * n_states):
        torch.testing.assert_close(s, want)  # T = 0: the carry is the incoming state
    leaves = [x, *state_leaves, *reset_leaves, *params.values()]
    _assert_fresh(outputs, leaves)
    # T = 0: the final state is the incoming one, so the loss holds it once: its gradient is ones
    _assert_grads(outputs, [x, *state_leaves, *params.values()], ones=state_leaves)


@pytest.mark.parametrize("backend,cell", [(b, c) for b, c in _cases() if b != "scan"])  # no scan step
def test_empty_batch_step(backend, cell) -> None:
    init, step, _, n_states = CELLS[cell]
    params = init(F_IN, H, L, dtype=torch.float64).apply(lambda t: t.requires_grad_(True))
    x = torch.randn(0, F_IN, dtype=torch.float64, requires_grad=True)
    state_leaves, state = _state(n_states, 0, L, H)
    y, new_state = step(x, state, params, is_init=torch.zeros(0, dtype=torch.bool), backend=backend)
    assert y.shape == (0, H)
    _assert_grads([y, *_tensors(new_state)], [x, *state_leaves, *params.values()])


def test_t0_final_state_is_a_copy() -> None:
    """The reported bug: ``hT.zero_()`` after a T = 0 call zeroed the caller's ``h0``."""
    params = rf.init_gru_params(F_IN, H, L)
    h0 = torch.randn(2, L, H)
    kept = h0.clone()
    for backend in BACKENDS:
        _, h_T = rf.gru_sequence(torch.randn(2, 0, F_IN), h0, params, backend=backend)
        with torch.no_grad():
            h_T.zero_()
        torch.testing.assert_close(h0, kept)


@pytest.mark.parametrize("backend,cell", list(_cases()))
def test_outputs_are_fresh_for_a_normal_call(backend, cell) -> None:
    init, step, sequence, n_states = CELLS[cell]
    params = init(F_IN, H, L, dtype=torch.float64)
    x = torch.randn(2, 3, F_IN, dtype=torch.float64)
    state_leaves, state = _state(n_states, 2, L, H)
    reset_leaves, reset = _state(n_states, 2, 3, L, H)
    is_init = torch.tensor([[False, True, False], [True, False, True]])
    out = sequence(x, state, params, is_init=is_init, reset_state=reset, backend=backend, return_segment_states=True)
    _assert_fresh(_tensors(out), [x, *state_leaves, *reset_leaves, *params.values()])
    if backend != "scan":
        out = step(x[:, 0], state, params, is_init=is_init[:, 0], backend=backend)
        _assert_fresh(_tensors(out), [x, *state_leaves, *params.values()])


def _nn_oracle(cell: str, params, x, state, is_init_first, reset0):
    """``torch.nn`` over a call whose only resets are at ``t = 0``: ``(y, final carry, segment states)``."""
    n_states = CELLS[cell][3]
    rnn = (torch.nn.LSTM if cell == "lstm" else torch.nn.GRU)(F_IN, H, L, batch_first=True, dtype=torch.float64)
    mask = is_init_first.view(-1, 1, 1)
    carry0 = [torch.where(mask, r if r is not None else torch.zeros_like(s), s) for s, r in zip(state, reset0)]
    hx = tuple(s.transpose(0, 1) for s in carry0)
    y, hn = torch.func.functional_call(rnn, dict(params.items()), (x, hx if n_states == 2 else hx[0]))
    final = [h.transpose(0, 1) for h in (hn if n_states == 2 else (hn,))]
    t_len = x.shape[1]
    seg = [torch.cat([torch.zeros_like(f).unsqueeze(1).expand(-1, t_len - 1, -1, -1), f.unsqueeze(1)], 1) for f in final]
    return [y, *final, *seg]


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("backend", ["auto", "pad", "reference", "scan"])
@pytest.mark.parametrize("first,with_reset", [(f, r) for f in ("all", "none", "mixed") for r in (True, False)] + [(None, False)])
@pytest.mark.parametrize("state_grad", [True, False])
def test_resets_at_t0_only_equal_torch_nn(cell, backend, first, with_reset, state_grad) -> None:
    """A call without interior resets runs reset-free after applying ``is_init[:, 0]`` to the initial carry
    (decided on the host: the stored reset state outright, the carry unchanged, or ``where`` for a mixed
    column or a carry whose gradient is recorded): outputs, final carry, segment states and every gradient
    equal ``torch.nn``'s, and a state that autograd records still receives its (zero) gradient.
    ``first=None``: no ``is_init`` at all (the segment states from the final carry alone)."""
    init, _, sequence, n_states = CELLS[cell]
    g = torch.Generator().manual_seed(3)
    params = init(F_IN, H, L, dtype=torch.float64, generator=g)
    for p in params.values():
        p.requires_grad_(True)
    n, t_len = 3, 4
    x = torch.randn(n, t_len, F_IN, dtype=torch.float64, generator=g, requires_grad=True)
    state = [torch.randn(n, L, H, dtype=torch.float64, generator=g).requires_grad_(state_grad) for _ in range(n_states)]
    reset = [torch.randn(n, t_len, L, H, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(n_states)]
    is_init = torch.zeros(n, t_len, dtype=torch.bool)
    is_init[:, 0] = {"all": True, "none": False, "mixed": torch.tensor([True, False, True]), None: False}[first]
    pack = (lambda ts: ts[0]) if n_states == 1 else tuple
    out = sequence(x, pack(state), params, is_init=None if first is None else is_init,
                   reset_state=pack(reset) if with_reset else None, backend=backend, return_segment_states=True)
    got = _tensors(out)
    want = _nn_oracle(cell, params, x, state, is_init[:, 0], [r[:, 0] for r in reset] if with_reset else [None] * n_states)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    _assert_fresh(got, [x, *state, *reset, *params.values()])
    leaves = [x, *params.values(), *(reset if with_reset else ()), *(state if state_grad else ())]
    weights = [torch.randn(o.shape, dtype=torch.float64, generator=g) for o in got]
    grads = torch.autograd.grad(sum((o * w).sum() for o, w in zip(got, weights)), leaves)
    want_grads = torch.autograd.grad(sum((o * w).sum() for o, w in zip(want, weights)), leaves)
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b)
