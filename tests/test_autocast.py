"""Under ``torch.autocast`` the LSTM and GRU run in autocast's dtype (as ``torch.nn.LSTM`` and TorchRL's LSTM module
do on CPU; ``nn.GRU`` keeps its input's dtype there, docs/migrating.md): a mixed-precision policy (a ``Linear`` handing the recurrent module autocast's dtype) runs, eagerly and
compiled, in both modes. The call equals the same call made outside autocast with its params and inputs cast to that
dtype (autograd records the casts: gradients reach the fp32 params in fp32). Cells ``torch.nn`` does not have keep
the params' dtype (the block GRU, as TorchRL's)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential

import rnn_functional as rf

BF16 = torch.bfloat16
N, T, F_IN, H = 3, 6, 4, 5
CELLS = {"lstm": (rf.init_lstm_params, rf.lstm_sequence, rf.lstm_step, 2),
         "gru": (rf.init_gru_params, rf.gru_sequence, rf.gru_step, 1)}


def _problem(cell: str):
    init, _, _, parts = CELLS[cell]
    g = torch.Generator().manual_seed(0)
    params = init(F_IN, H, 2, generator=g).apply(lambda p: p.requires_grad_())
    x = torch.randn(N, T, F_IN, generator=g, requires_grad=True)
    state = [torch.randn(N, 2, H, generator=g, requires_grad=True) for _ in range(parts)]
    is_init = torch.rand(N, T, generator=g) < 0.3
    is_init[0, 3] = True  # an interior reset
    return params, x, state, is_init, (tuple if parts == 2 else (lambda s: s[0]))


def _outputs(y, final) -> list[torch.Tensor]:
    return [y, *(final if isinstance(final, tuple) else (final,))]


@pytest.mark.parametrize("backend", rf.available_backends(cell="gru"))
@pytest.mark.parametrize("cell", list(CELLS))
def test_sequence_runs_in_autocast_dtype(cell, backend):
    params, x, state, is_init, pack = _problem(cell)
    seq = CELLS[cell][1]
    leaves = [x, *state, *params.values()]
    with torch.autocast("cpu", dtype=BF16):
        got = _outputs(*seq(x, pack(state), params, is_init=is_init, backend=backend))
    want = _outputs(*seq(x.to(BF16), pack([s.to(BF16) for s in state]), params.apply(lambda p: p.to(BF16)),
                         is_init=is_init, backend=backend))
    assert all(t.dtype == BF16 for t in got)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    loss = lambda outs: sum((o.float() ** 2).sum() for o in outs)  # noqa: E731
    grads = torch.autograd.grad(loss(got), leaves)
    assert all(g.dtype == torch.float32 for g in grads)  # the fp32 leaves' own dtype
    for a, b in zip(grads, torch.autograd.grad(loss(want), leaves), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("cell", list(CELLS))
def test_step_runs_in_autocast_dtype(cell):
    params, x, state, is_init, pack = _problem(cell)
    step = CELLS[cell][2]
    with torch.autocast("cpu", dtype=BF16):
        got = _outputs(*step(x[:, 0], pack(state), params, is_init=is_init[:, 0]))
    want = _outputs(*step(x[:, 0].to(BF16), pack([s.to(BF16) for s in state]), params.apply(lambda p: p.to(BF16)),
                          is_init=is_init[:, 0]))
    assert all(t.dtype == BF16 for t in got)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def _policy(cell: str):
    """A mixed-precision policy: under autocast the Linear hands the recurrent module bf16 features."""
    torch.manual_seed(0)
    cls = rf.LSTMModule if cell == "lstm" else rf.GRUModule
    keys = ["h", "c"] if cell == "lstm" else ["h"]
    rnn = cls(input_size=H, hidden_size=H, in_keys=["emb", *keys], out_keys=["y", *(("next", k) for k in keys)])
    return TensorDictSequential(TensorDictModule(torch.nn.Linear(F_IN, H), ["x"], ["emb"]), rnn), rnn, keys


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("recurrent", [False, True], ids=["step", "recurrent"])
@pytest.mark.parametrize("cell", list(CELLS))
def test_mixed_precision_policy(cell, recurrent, compiled):
    """The policy under autocast equals its recurrent module called outside autocast on the bf16 features with its
    weights cast to bf16. Compiled (aot_eager), ``auto`` runs ``scan`` where the eager module runs ATen's kernels:
    the two round differently in bf16 (about 2^-8 per op, over 6 steps), hence 1e-2 there."""
    policy, rnn, keys = _policy(cell)
    batch = (N, T) if recurrent else (N,)
    g = torch.Generator().manual_seed(1)
    data = TensorDict({"x": torch.randn(*batch, F_IN, generator=g),
                       "is_init": torch.rand(*batch, 1, generator=g) < 0.3,
                       **{k: torch.randn(*batch, 1, H, generator=g) for k in keys}}, batch)
    run = torch.compile(policy, backend="aot_eager") if compiled else policy
    with rf.set_recurrent_mode(recurrent):
        with torch.autocast("cpu", dtype=BF16):
            out = run(data.clone())
        cast = rnn.to(BF16)  # the same module in bf16, outside autocast, on the features autocast made
        want = cast(out.select("emb", "is_init", *keys).apply(lambda t: t.to(BF16) if t.is_floating_point() else t))
    for key in ["y", *(("next", k) for k in keys)]:
        assert out[key].dtype == BF16, key
        torch.testing.assert_close(out[key], want[key], **({"atol": 1e-2, "rtol": 1e-2} if compiled else {}))


def test_block_gru_keeps_the_params_dtype_as_torchrl():
    """TorchRL's block GRU (RMS norms autocast keeps in fp32) returns fp32 under autocast; so does ours."""
    cell = rf.DreamerV3BlockGRUCell(F_IN, 8, projection_size=4, num_blocks=2)
    with torch.autocast("cpu", dtype=BF16):
        h = cell(torch.randn(N, F_IN), torch.randn(N, 8))
    assert h.dtype == torch.float32


LINEAR = {"min_gru": (rf.init_min_gru_params, rf.min_gru_sequence), "rglru": (rf.init_rglru_params, rf.rglru_sequence)}


@pytest.mark.parametrize("cell", list(LINEAR))
def test_linear_cells_keep_the_params_dtype_on_every_backend(cell):
    """minGRU and RG-LRU (no ``torch.nn`` counterpart) project in autocast's dtype and run their recurrence in the
    params' dtype, on every backend alike: outputs fp32, equal to ``reference`` up to bf16 rounding (the projection's
    products differ by an ulp of bf16, 2^-8, between a per-step and a whole-sequence GEMM; hence 2e-2)."""
    init, seq = LINEAR[cell]
    g = torch.Generator().manual_seed(0)
    params = init(F_IN, H, 2, generator=g).apply(lambda p: p.requires_grad_())
    x = torch.randn(N, T, F_IN, generator=g, requires_grad=True)
    state = torch.randn(N, 2, H, generator=g, requires_grad=True)
    is_init = torch.rand(N, T, generator=g) < 0.3
    leaves = [x, state, *params.values()]
    results = {}
    for backend in rf.available_backends(cell=cell):
        with torch.autocast("cpu", dtype=BF16):
            y, final = seq(x, state, params, is_init=is_init, backend=backend)
        assert y.dtype == final.dtype == torch.float32, backend
        results[backend] = [y, final, *torch.autograd.grad((y ** 2).sum() + (final ** 2).sum(), leaves)]
    for backend, got in results.items():
        for a, b in zip(got, results["reference"], strict=True):
            torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2, msg=lambda m: f"{backend}: {m}")


NO_NN = {"block_gru": (lambda f, h, L, generator: rf.init_block_gru_params(f, h, projection_size=4, num_blocks=2,
                                                                           num_layers=L, generator=generator),
                       rf.block_gru_sequence),
         "norm_gru": (lambda f, h, L, generator: rf.init_norm_gru_params(f, h, L, generator=generator),
                      rf.norm_gru_sequence)}


@pytest.mark.parametrize("backward_in_autocast", [False, True], ids=["backward-after", "backward-inside"])
@pytest.mark.parametrize("cell", list(NO_NN))
def test_cells_without_nn_counterpart_train_under_autocast_on_every_backend(cell, backward_in_autocast):
    """The block GRU and the norm GRU keep the params' dtype under autocast (their matmuls autocast, their norms in
    fp32) and train on every backend, ``recompute`` none and full: ``scan``'s hand-written backward runs under the
    autocast state its forward saw (it once mixed the forward's bf16 activations with fp32 ones: "expected m1 and m2
    to have the same dtype"), whether ``backward()`` is called inside the autocast block or after it. Gradients equal
    ``reference``'s up to bf16 rounding (2e-2, as above)."""
    init, seq = NO_NN[cell]
    g = torch.Generator().manual_seed(0)
    params = init(F_IN, 8, 2, generator=g).apply(lambda p: p.requires_grad_())
    x = torch.randn(N, T, F_IN, generator=g, requires_grad=True)
    state = torch.randn(N, 1 if cell == "block_gru" else 2, 8, generator=g, requires_grad=True)
    is_init = torch.rand(N, T, generator=g) < 0.3
    is_init[0, 3] = True
    leaves = [x, state, *params.values()]
    results = {}
    for backend in rf.available_backends(cell=cell):
        for recompute in ("none", "full"):
            with torch.autocast("cpu", dtype=BF16):
                y, final = seq(x, state, params, is_init=is_init, backend=backend, recompute=recompute)
                loss = (y.float() ** 2).sum() + (final.float() ** 2).sum()
                grads = torch.autograd.grad(loss, leaves) if backward_in_autocast else None
            assert y.dtype == final.dtype == torch.float32, backend
            results[backend, recompute] = [y, final, *(grads or torch.autograd.grad(loss, leaves))]
    for key, got in results.items():
        for a, b in zip(got, results["reference", "none"], strict=True):
            assert a.dtype == b.dtype
            torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2, msg=lambda m: f"{key}: {m}")
