"""torch.compile(fullgraph=True) of DreamerV3's block-diagonal GRU (issue 29): sequence, vmapped ensemble and
an imagination rollout of the step, forward and backward, fp64 at ``assert_close`` defaults against eager.

``aot_eager`` (``FAST``, see ``compile_helpers``): graph breaks, host syncs and scan's autograd all show at
Dynamo/AOTAutograd; ``fullgraph=True`` turns any graph break into an error and the Dynamo counters are checked.
Sizes are tiny to keep the compiles few and short.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from compile_helpers import FAST, compile_stats
from tensordict import TensorDict
from torch import nn

import rnn_functional as rf

F_IN, H, P, NB, B, T = 3, 8, 4, 2, 2, 4


def _params(seed: int = 0, layers: int = 2) -> TensorDict:
    """Init, then non-trivial norm weights and biases; every leaf requires grad."""
    g = torch.Generator().manual_seed(seed)
    params = rf.init_block_gru_params(F_IN, H, projection_size=P, num_blocks=NB, num_layers=layers,
                                      dtype=torch.float64, generator=g)
    params = params.apply(lambda t: t + 0.2 * torch.randn(t.shape, generator=g, dtype=t.dtype))
    return params.apply(lambda t: t.detach().requires_grad_())


def _case(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, F_IN, generator=g, dtype=torch.float64).requires_grad_()
    h0 = torch.randn(B, 1, H, generator=g, dtype=torch.float64).requires_grad_()
    is_init = torch.zeros(B, T, dtype=torch.bool)
    is_init[0, 0] = is_init[1, 2] = is_init[0, 3] = True
    reset = torch.randn(B, T, 1, H, generator=g, dtype=torch.float64).requires_grad_()
    weights = torch.randn(B, T, H, generator=g, dtype=torch.float64)
    return x, h0, is_init, reset, weights


def _with_grads(fn, leaves, *args):
    out = fn(*args)
    grads = torch.autograd.grad(out[0], leaves)
    return tuple(o.detach() for o in out), grads


# (backend, recompute, resets): scan with both recomputes and reset_state; auto with reset_state and with is_init alone
# (each case is a few seconds of compile on 2 cores)
@pytest.mark.parametrize("backend,recompute,reset", [("scan", "none", "state"), ("scan", "full", "state"),
                                                     ("auto", "none", "state"), ("auto", "full", "zeros")])
def test_sequence_fullgraph_fwd_bwd_fp64(backend: str, recompute: str, reset: str) -> None:
    params = _params()
    x, h0, is_init, reset_state, weights = _case()
    if reset == "zeros":
        reset_state = None

    def fn(x, h0, params, is_init, reset_state):
        y, h = rf.block_gru_sequence(x, h0, params, is_init=is_init, reset_state=reset_state, backend=backend,
                                     recompute=recompute, activation="tanh", update_bias=-0.5)
        return (y * weights).sum() + h.pow(2).sum(), y, h

    leaves = [x, h0, *([reset_state] if reset_state is not None else []), *params.values()]
    want = _with_grads(fn, leaves, x, h0, params, is_init, reset_state)
    compiled = torch.compile(fn, fullgraph=True, backend=FAST)
    with compile_stats() as stats:
        got = _with_grads(compiled, leaves, x, h0, params, is_init, reset_state)
    assert stats.breaks == 0 and stats.graphs == 1, stats
    torch.testing.assert_close(got, want)
    # and equal the eager reference backend
    y_ref, h_ref = rf.block_gru_sequence(x, h0, params, is_init=is_init, reset_state=reset_state,
                                         backend="reference", activation="tanh", update_bias=-0.5)
    torch.testing.assert_close(got[0][1:], (y_ref.detach(), h_ref.detach()))


@pytest.mark.parametrize("backend", ["auto"])  # the default; one case keeps the compile time down
def test_vmap_over_stacked_params_fullgraph_fwd_bwd(backend: str) -> None:
    """``torch.compile(torch.vmap(seq))`` over ``torch.stack`` of two params TensorDicts equals a loop over members."""
    members = [_params(seed=s, layers=1) for s in range(2)]
    stacked = torch.stack([m.detach() for m in members]).apply(lambda t: t.detach().requires_grad_())
    x, h0, is_init, reset_state, weights = _case()

    def seq(x, h0, p):
        return rf.block_gru_sequence(x, h0, p, is_init=is_init, reset_state=reset_state, backend=backend)

    def fn(x, h0, stacked):
        y, h = torch.vmap(seq, in_dims=(None, None, 0))(x, h0, stacked)
        return (y * weights).sum() + h.pow(2).sum(), y, h

    leaves = [x, h0, reset_state, *stacked.values()]
    compiled = torch.compile(fn, fullgraph=True, backend=FAST)
    with compile_stats() as stats:
        got = _with_grads(compiled, leaves, x, h0, stacked)
    assert stats.breaks == 0, stats

    def loop(x, h0, stacked):
        outs = [rf.block_gru_sequence(x, h0, stacked[i], is_init=is_init, reset_state=reset_state, backend="reference")
                for i in range(2)]
        y, h = torch.stack([o[0] for o in outs]), torch.stack([o[1] for o in outs])
        return (y * weights).sum() + h.pow(2).sum(), y, h

    want = _with_grads(loop, leaves, x, h0, stacked)
    torch.testing.assert_close(got, want)


def test_imagination_rollout_fullgraph_fwd_bwd() -> None:
    """A 15-step rollout: ``block_gru_step``, then a tiny MLP maps ``y`` to the next ``x``; compiled equals eager."""
    params = _params(layers=1)
    g = torch.Generator().manual_seed(2)
    w1 = torch.randn(6, H, generator=g, dtype=torch.float64).mul_(0.5).requires_grad_()
    w2 = torch.randn(F_IN, 6, generator=g, dtype=torch.float64).mul_(0.5).requires_grad_()
    x0 = torch.randn(B, F_IN, generator=g, dtype=torch.float64).requires_grad_()
    h0 = torch.randn(B, 1, H, generator=g, dtype=torch.float64).requires_grad_()
    is_init = torch.tensor([True, False])

    def rollout(x0, h0, params, w1, w2):
        x, h, ys = x0, h0, []
        for t in range(15):
            y, h = rf.block_gru_step(x, h, params, is_init=is_init if t == 0 else None)
            ys.append(y)
            x = torch.tanh(torch.relu(y @ w1.T) @ w2.T)
        ys = torch.stack(ys, 1)
        return ys.pow(2).sum() + h.sum(), ys, h

    leaves = [x0, h0, *params.values(), w1, w2]
    want = _with_grads(rollout, leaves, x0, h0, params, w1, w2)
    compiled = torch.compile(rollout, fullgraph=True, backend=FAST)
    with compile_stats() as stats:
        got = _with_grads(compiled, leaves, x0, h0, params, w1, w2)
    assert stats.breaks == 0 and stats.graphs == 1, stats
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize(("num_blocks", "compiler"), [(1, FAST), (8, "inductor")])
def test_one_block_and_one_unit_blocks_compile_on_scan(num_blocks: int, compiler: str) -> None:
    """The two ends of the block structure at ``H = 8``. ``num_blocks=1`` (a plain GRU's): the first dynamics layer's
    shared rows are fresh tensors, not two views of one weight, which ``scan`` refused as aliased inputs ("Encountered
    aliasing"). ``num_blocks=8`` (blocks of one unit): the backward's state cotangent came out transposed and the
    reverse scan refused it ("Expected init and carry to have same metadata"). Both refusals came from tracing
    (Dynamo/AOTAutograd), which ``aot_eager`` runs; the block GRU's one Inductor compile (the default
    ``torch.compile``) is the ``num_blocks=8`` case. Outputs and every parameter's gradient against eager
    ``reference`` (fp64)."""
    g = torch.Generator().manual_seed(0)
    params = {k: v.requires_grad_(True) for k, v in rf.init_block_gru_params(
        4, 8, projection_size=5, num_blocks=num_blocks, dtype=torch.float64, generator=g).items()}
    x = torch.randn(3, 4, 4, dtype=torch.float64, generator=g)
    is_init = torch.zeros(3, 4, dtype=torch.bool)
    is_init[1, 2] = True

    def loss(backend):
        y, h = rf.block_gru_sequence(x, None, params, is_init=is_init, backend=backend)
        return y.pow(2).sum() + h.pow(2).sum()

    want = loss("reference")
    torch._dynamo.reset()
    got = torch.compile(loss, backend=compiler)("scan")
    torch.testing.assert_close(got, want)
    for a, b in zip(torch.autograd.grad(got, list(params.values())), torch.autograd.grad(want, list(params.values()))):
        torch.testing.assert_close(a, b)


_NEW_EPS = itertools.count(1)  # a new norm_eps per case: a cell no other test made


# every kind of activation under fullgraph; the default compile and dynamic=True (its floats: SymFloats) once each
@pytest.mark.parametrize("act,mode", [("tanh", "fullgraph"), ("lambda", "fullgraph"), ("torch.sin", "fullgraph"),
                                      ("Sigmoid", "fullgraph"), ("Sigmoid", "default"), ("lambda", "dynamic")])
def test_cell_first_made_inside_compile_fwd_bwd(act: str, mode: str) -> None:
    """Block GRU and RSSM core, sequence and step, with hyperparameters first seen by a compiled call: their cells are
    made at trace time, one graph without breaks, outputs and gradients equal eager (fp64). A traced table lookup
    ahead of the maker left Dynamo a copy of the table without the cell the maker then made (fullgraph: KeyError;
    default: graph breaks), and under ``dynamic=True`` the floats reached the constant-marked maker as ``SymFloat``
    (refused)."""
    activation = {"tanh": "tanh", "lambda": lambda v: torch.nn.functional.gelu(v), "torch.sin": torch.sin,
                  "Sigmoid": nn.Sigmoid()}[act]
    norm_eps, update_bias = 1e-4 * (1 + next(_NEW_EPS)), -0.5  # closure floats: SymFloats under dynamic=True
    block = _params(layers=1)
    g = torch.Generator().manual_seed(3)
    rssm = rf.init_rssm_core_params(state_dim=2, action_dim=1, hidden_dim=P, belief_dim=H, num_blocks=NB,
                                    dtype=torch.float64, generator=g).apply(lambda t: t.requires_grad_())
    x = _case()[0]
    xr = torch.randn(B, T, 3, generator=g, dtype=torch.float64).requires_grad_()

    def fn(x, xr, block, rssm):
        y, _ = rf.block_gru_sequence(x, None, block, activation=activation, norm_eps=norm_eps, update_bias=update_bias)
        y1, _ = rf.block_gru_step(x[:, 0], None, block, activation=activation, norm_eps=norm_eps,
                                  update_bias=update_bias)
        b, _ = rf.rssm_core_sequence(xr, None, rssm, activation=activation, norm_eps=norm_eps)
        b1, _ = rf.rssm_core_step(xr[:, 0], None, rssm, activation=activation, norm_eps=norm_eps)
        return y.pow(2).sum() + y1.sum() + b.pow(2).sum() + b1.sum(), y, y1, b, b1

    leaves = [x, xr, *block.values(), *rssm.values()]
    compiled = torch.compile(fn, fullgraph=mode != "default", dynamic=mode == "dynamic", backend=FAST)
    with compile_stats() as stats:
        got = [_with_grads(compiled, leaves, x, xr, block, rssm) for _ in range(2)]  # the second: no recompile
    assert stats.breaks == 0 and stats.graphs == 1, stats
    want = _with_grads(fn, leaves, x, xr, block, rssm)
    torch.testing.assert_close(got, [want, want])


def test_modules_cell_first_made_inside_compile_fwd_bwd() -> None:
    """``DreamerV3BlockGRU`` and ``DreamerV3BlockGRUCell`` with activations no call has seen yet, compiled fullgraph
    with ``dynamic=True`` (their ``norm_eps``, ``update_bias``: ``SymFloat`` attributes): one graph, outputs and
    gradients equal eager."""
    torch.manual_seed(0)
    kw = {"projection_size": P, "num_blocks": NB, "norm_eps": 1e-4 * (1 + next(_NEW_EPS))}
    seq = rf.DreamerV3BlockGRU(F_IN, H, activation_class=nn.GELU, **kw).double()
    cell = rf.DreamerV3BlockGRUCell(F_IN, H, activation_class=nn.Softsign(), **kw).double()
    x, h0 = _case()[:2]

    def fn(x, h0):
        y, h = seq(x, h0[:, 0])
        h1 = cell(x[:, 0], h0[:, 0])
        return y.pow(2).sum() + h.sum() + h1.pow(2).sum(), y, h, h1

    leaves = [x, h0, *seq.parameters(), *cell.parameters()]
    with compile_stats() as stats:
        got = _with_grads(torch.compile(fn, fullgraph=True, dynamic=True, backend=FAST), leaves, x, h0)
    assert stats.breaks == 0 and stats.graphs == 1, stats
    torch.testing.assert_close(got, _with_grads(fn, leaves, x, h0))
