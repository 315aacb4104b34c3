"""Compiled ensemble training: ``torch.compile(torch.vmap(seq_fn), fullgraph=True)`` forward AND
backward over stacked params equals a Python loop over the members.

Outputs and the gradients of every input (``x``, state, ``reset_state``) and every stacked
parameter, fp64 at ``assert_close`` defaults; zero graph breaks (``fullgraph=True`` raises on any). The
compiled path is the ``scan`` backend's ensemble layer (``rnn_functional/backends/ensemble_scan.py``);
before it, these calls failed in torch 2.13 ("Expected init and carry to have same metadata",
"You tried to vmap over ApplyTemplate"). Shapes are tiny and most cases use ``aot_eager``
(Dynamo + AOTAutograd, where those failures happened), two ``inductor``, to keep compiles few.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from compile_helpers import FAST
from tensordict import TensorDict

import rnn_functional as rf

E, B, T, F_IN, H = 3, 2, 4, 3, 4
SEQUENCE = {"lstm": rf.lstm_sequence, "gru": rf.gru_sequence, "norm_gru": rf.norm_gru_sequence}


def _ensemble_params(cell: str, layers: int, proj: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(0)
    if cell == "lstm":
        params = rf.ensemble_init_lstm_params(E, F_IN, H, layers, proj_size=proj, dtype=torch.float64, generator=g)
    elif cell == "gru":
        params = rf.ensemble_init_gru_params(E, F_IN, H, layers, dtype=torch.float64, generator=g)
    else:
        members = [rf.init_norm_gru_params(F_IN, H, layers, dtype=torch.float64, generator=g) for _ in range(E)]
        # a non-trivial layer norm (init gives ones and zeros)
        params = rf.stack_params(members).apply(lambda t: t + 0.1 * torch.randn(t.shape, generator=g, dtype=t.dtype))
    return params.apply(lambda t: t.detach().requires_grad_())


def _widths(cell: str, proj: int) -> tuple[int, ...]:
    return (proj or H, H) if cell == "lstm" else (H,)


def _public(cell: str, parts):
    return None if parts is None else (tuple(parts) if cell == "lstm" else parts[0])


def _parts(cell: str, state) -> tuple[torch.Tensor, ...]:
    return tuple(state) if cell == "lstm" else (state,)


# per-argument ensemble dims of (x, state, is_init, reset_state): None = shared by the members, 0 = per member
IN_DIMS = {"shared": (None, None, None, None), "per_member": (0, 0, 0, 0), "mixed": (0, None, None, 0)}


def _inputs(cell: str, layers: int, proj: int, inputs: str) -> dict:
    g = torch.Generator().manual_seed(1)
    x_d, s_d, i_d, r_d = IN_DIMS[inputs]

    def lead(d):
        return (B,) if d is None else (E, B)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()

    widths = _widths(cell, proj)
    is_init = torch.rand(*lead(i_d), T, generator=g) < 0.35
    is_init[..., 0, T // 2] = True  # an interior reset in every member
    return {
        "x": randn(*lead(x_d), T, F_IN),
        "state": tuple(randn(*lead(s_d), layers, w) for w in widths),
        "is_init": is_init,
        "reset": tuple(randn(*lead(r_d), T, layers, w) for w in widths),
        "in_dims": (x_d, s_d, 0, i_d, r_d),
    }


def _member_fn(cell: str) -> Callable:
    """``(x, state parts, params, is_init, reset parts) -> (y, *final state parts)`` for one member."""
    seq = SEQUENCE[cell]

    def member(x, state, params, is_init, reset):
        y, final = seq(x, _public(cell, state), params, is_init=is_init, reset_state=_public(cell, reset))
        return (y, *_parts(cell, final))

    return member


def _loop(member: Callable, args: tuple, in_dims: tuple) -> tuple[torch.Tensor, ...]:
    """The members one after the other (eager), outputs stacked along a leading ``E``."""

    def pick(value, d, e):
        if d is None:
            return value
        if isinstance(value, tuple):
            return tuple(v[e] for v in value)
        return value[e]

    outs = [member(*(pick(a, d, e) for a, d in zip(args, in_dims))) for e in range(E)]
    return tuple(torch.stack(parts) for parts in zip(*outs))


def _grads(outs, leaves) -> tuple[torch.Tensor, ...]:
    """Gradients of a fixed random projection of every output (y and the final states)."""
    g = torch.Generator().manual_seed(7)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outs)
    return torch.autograd.grad(loss, leaves)


CASES = [  # (cell, layers, proj, inputs, compiler)
    ("lstm", 2, 0, "shared", FAST),
    ("lstm", 1, 2, "per_member", FAST),
    ("gru", 2, 0, "per_member", FAST),
    ("gru", 1, 0, "mixed", FAST),
    ("norm_gru", 1, 0, "shared", FAST),
    # Inductor miscompiled the extra weights' gradients summed in the backward scan's carry (norm_bias_l1)
    ("norm_gru", 2, 0, "per_member", "inductor"),
    # Inductor's own lowering of the ensemble layer's per-step projection of a shared input, its
    # time-indexed scans and the weight-gradient GEMMs over member-strided gate cotangents
    ("lstm", 1, 0, "shared", "inductor"),
]


@pytest.mark.parametrize(("cell", "layers", "proj", "inputs", "compiler"), CASES,
                         ids=[f"{c}-L{n}{'-proj' if p else ''}-{i}-{b}" for c, n, p, i, b in CASES])
def test_compiled_vmap_fwd_bwd_equals_loop(cell, layers, proj, inputs, compiler):
    params = _ensemble_params(cell, layers, proj)
    case = _inputs(cell, layers, proj, inputs)
    member = _member_fn(cell)
    args = (case["x"], case["state"], params, case["is_init"], case["reset"])
    leaves = [case["x"], *case["state"], *case["reset"], *params.values()]
    ensemble = torch.vmap(member, in_dims=case["in_dims"])
    want = _loop(member, args, case["in_dims"])
    got = torch.compile(ensemble, fullgraph=True, backend=compiler)(*args)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(_grads(got, leaves), _grads(want, leaves))


def test_compiled_nested_vmap_and_recompute():
    """Ensemble x batch rows (a per-row function vmapped over the rows, then over the members): the
    op's vmap rule folds both levels. Also ``recompute="full"`` under ``no_grad``."""
    params = _ensemble_params("gru", 1)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(B, T, F_IN, generator=g, dtype=torch.float64, requires_grad=True)
    is_init = torch.rand(B, T, generator=g) < 0.4
    per_row = torch.vmap(lambda x, i, p: rf.gru_sequence(x, None, p, is_init=i)[0], in_dims=(0, 0, None))
    ensemble = torch.vmap(per_row, in_dims=(None, None, 0))
    want = torch.stack([rf.gru_sequence(x, None, params[e], is_init=is_init)[0] for e in range(E)])
    got = torch.compile(ensemble, fullgraph=True, backend=FAST)(x, is_init, params)
    leaves = [x, *params.values()]
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(_grads([got], leaves), _grads([want], leaves))

    recomputed = torch.vmap(lambda p: rf.gru_sequence(x, None, p, is_init=is_init, recompute="full")[0])
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(recomputed, fullgraph=True, backend=FAST)(params), want)


@pytest.mark.parametrize(("members", "recompute", "compiler"), [(1, "none", "inductor"), (E, "full", FAST)],
                         ids=["one-member-inductor", "recompute-full"])
def test_compiled_vmap_one_member_and_recompute_full(members: int, recompute: str, compiler: str):
    """A vmap over one member compiles (Inductor once rejected its size-1 carries); ``recompute="full"``
    with gradients recomputes each step in the ensemble layer's backward. LSTM, one layer, resets."""
    params = _ensemble_params("lstm", 1)[:members]
    g = torch.Generator().manual_seed(4)
    x = torch.randn(B, T, F_IN, generator=g, dtype=torch.float64, requires_grad=True)
    is_init = torch.rand(B, T, generator=g) < 0.4

    def member(p):
        return rf.lstm_sequence(x, None, p, is_init=is_init, recompute=recompute)[0]

    want = torch.stack([member(params[e]) for e in range(members)])
    got = torch.compile(torch.vmap(member), fullgraph=True, backend=compiler)(params)
    leaves = [x, *params.values()]
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(_grads([got], leaves), _grads([want], leaves))


# ----------------------------------------------------------------------------- EnsembleModule

HIDDEN = {"lstm": ["recurrent_state_h", "recurrent_state_c"], "gru": ["recurrent_state"], "min_gru": ["recurrent_state"]}
CLASSES = {"lstm": rf.LSTMModule, "gru": rf.GRUModule, "min_gru": rf.MinGRUModule}


def _module(cell: str) -> torch.nn.Module:
    return CLASSES[cell](F_IN, H, 2, in_key="obs", out_key="feat").to(torch.float64)


def _recurrent_td(cell: str) -> TensorDict:
    g = torch.Generator().manual_seed(1)
    data = {
        "obs": torch.randn(B, T, F_IN, generator=g, dtype=torch.float64),
        "is_init": torch.rand(B, T, 1, generator=g) < 0.35,
    }
    for key in HIDDEN[cell]:
        data[key] = torch.randn(B, T, 2, H, generator=g, dtype=torch.float64)
    return TensorDict(data, batch_size=[B, T])


def _module_loss(out: TensorDict, cell: str) -> torch.Tensor:
    ct = torch.randn(out["feat"].shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    return (out["feat"] * ct).sum() + sum(out["next", k].square().sum() for k in HIDDEN[cell])


def test_compiled_vmap_with_dynamic_shapes_fwd_bwd_equals_loop():
    """``torch.compile(torch.vmap(seq_fn), dynamic=True)`` under autograd: sizes symbolic from the first call raised
    Inductor's "A subgraph argument other than striding has been modified" (the ensemble layer's scans must trace
    with static shapes); two batch and time sizes, outputs and every gradient equal a loop."""
    params = _ensemble_params("gru", 1)
    member = _member_fn("gru")
    in_dims = (0, None, 0, None, None)
    compiled = torch.compile(torch.vmap(member, in_dims=in_dims), dynamic=True)
    for batch, time in ((2, 4), (3, 6)):
        g = torch.Generator().manual_seed(batch)
        x = torch.randn(E, batch, time, F_IN, generator=g, dtype=torch.float64).requires_grad_()
        state = (torch.randn(batch, 1, H, generator=g, dtype=torch.float64).requires_grad_(),)
        is_init = torch.rand(batch, time, generator=g) < 0.35
        is_init[0, time // 2] = True
        reset = (torch.randn(batch, time, 1, H, generator=g, dtype=torch.float64).requires_grad_(),)
        args = (x, state, params, is_init, reset)
        leaves = [x, *state, *reset, *params.values()]
        want, got = _loop(member, args, in_dims), compiled(*args)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(_grads(got, leaves), _grads(want, leaves))


@pytest.mark.parametrize("cell", ["lstm", "min_gru"])
def test_ensemble_module_compiled_fwd_bwd_equals_loop(cell):
    """``torch.compile(EnsembleModule, fullgraph=True)`` in recurrent mode, forward and backward, equals
    a loop of plain modules holding each member's params; zero graph breaks. (LSTM: the two-tensor
    state; minGRU: the ``parallel`` backend under vmap; the functional cases above cover every cell.)"""
    ens = rf.EnsembleModule(_module(cell), E, generator=torch.Generator().manual_seed(0))
    td = _recurrent_td(cell)
    params = list(ens.parameters())
    single = _module(cell)
    with rf.set_recurrent_mode(True):
        looped = []
        for e in range(E):
            with ens.params[e].to_module(single):
                looped.append(single(td.copy()))
        want = torch.stack(looped)
        got = torch.compile(ens, fullgraph=True, backend=FAST)(td)
    for key in ["feat", *(("next", k) for k in HIDDEN[cell])]:
        torch.testing.assert_close(got[key], want[key])
    torch.testing.assert_close(
        torch.autograd.grad(_module_loss(got, cell), params), torch.autograd.grad(_module_loss(want, cell), params)
    )


def test_ensemble_module_under_functional_call():
    """Eager ``torch.func.functional_call`` over an EnsembleModule runs the given params (another
    ensemble's) and backpropagates into them."""
    ens = rf.EnsembleModule(_module("gru"), E, generator=torch.Generator().manual_seed(0))
    other = rf.EnsembleModule(_module("gru"), E, generator=torch.Generator().manual_seed(5))
    td = _recurrent_td("gru")
    given = {name: p.detach().clone().requires_grad_() for name, p in other.named_parameters()}
    with rf.set_recurrent_mode(True):
        got = torch.func.functional_call(ens, given, (td,))
        want = other(td)
        mine = ens(td)
    torch.testing.assert_close(got["feat"], want["feat"])
    assert not torch.allclose(got["feat"], mine["feat"])  # the given params were used, not the module's
    grads = torch.autograd.grad(_module_loss(got, "gru"), list(given.values()))
    want_grads = torch.autograd.grad(_module_loss(want, "gru"), list(other.parameters()))
    torch.testing.assert_close(grads, want_grads)
