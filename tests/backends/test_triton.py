"""The ``triton`` backend against ``reference``: outputs and gradients (x, state, reset_state,
every param), resets, recompute, segment states, compile, vmap, the fused step, and its limits.

CPU runs use the Triton interpreter (``TRITON_INTERPRET=1``); shapes are small (N=3, T=5,
H=48 -- not a power of two, so the padded lanes are exercised -- F=7).

Tolerances:
* fp64: ``assert_close`` defaults (the kernel accumulates in fp64).
* fp32: rtol=1e-4, atol=1e-5, as for the other backends: the kernel sums the gate terms in
  another order than the reference (``gx + h @ W^T + b`` in one pass), a few ulps per step,
  compounding over T steps.
* bf16: compared with the fp64 reference on the same (bf16-representable) values; error
  <= 2e-2 of the largest magnitude. bf16 keeps 8 significant bits (~4e-3 relative per rounding);
  inputs, weights, matmul operands and outputs are each rounded once per step, over T=5 steps.
"""

from __future__ import annotations

import pytest
import torch
from helpers import flat, make_problem, outputs_and_grads, run_sequence

import rnn_functional as rf
from rnn_functional.backends import triton as tb

pytestmark = pytest.mark.skipif(
    not tb.is_available("cpu"), reason="triton on CPU needs TRITON_INTERPRET=1 (set before import)"
)

SIZES = dict(batch_shape=(3,), time=5, input_size=7, hidden=48)


def _launches() -> int:
    from rnn_functional.backends.triton import kernels

    return kernels.LAUNCHES["count"]


def _assert_all_close(actual: list, expected: list, **tol) -> None:
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        torch.testing.assert_close(a, e, msg=lambda m, i=i: f"tensor #{i}: {m}", **tol)


# ----------------------------------------------------------------------------- fp64 / fp32


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("resets", ["reset_state", "zeros", "none"])
def test_matches_reference_fp64(cell: str, layers: int, resets: str) -> None:
    problem = make_problem(
        cell, **SIZES, layers=layers, reset_prob=0.0 if resets == "none" else 0.35,
        with_reset_state=resets == "reset_state", seed=layers,
    )
    out, grads = outputs_and_grads(problem, "triton")
    ref_out, ref_grads = outputs_and_grads(problem, "reference")
    _assert_all_close(out, ref_out)
    _assert_all_close(grads, ref_grads)


@pytest.mark.parametrize(("cell", "layers"), [("lstm", 1), ("gru", 1), ("gru", 2)])
def test_non_finite_segment_does_not_reach_the_one_before(cell: str, layers: int) -> None:
    """A NaN input inside a segment (resets at 0, 5, 9; NaN at t = 6) leaves the earlier segment's gradients finite,
    as ``reference``'s: the backward kernel's padding lanes (H=48 in a 64-wide tile) once carried the NaN that the
    segment's products put there across the reset, and the next step's product (0 * NaN) brought it back. Each
    cell's kernels at one layer; a second layer (NaN in every lane of its input) once, with the GRU."""
    init, seq = (rf.init_lstm_params, rf.lstm_sequence) if cell == "lstm" else (rf.init_gru_params, rf.gru_sequence)
    g = torch.Generator().manual_seed(5)
    params = init(7, 48, layers, dtype=torch.float64, generator=g)
    x = torch.randn(2, 13, 7, dtype=torch.float64, generator=g)
    x[0, 6] = float("nan")
    is_init = torch.zeros(2, 13, dtype=torch.bool)
    is_init[:, 0] = is_init[0, 5] = is_init[0, 9] = is_init[1, 3] = True
    weights = torch.randn(2, 13, 48, dtype=torch.float64, generator=g)
    results = []
    for backend in ("triton", "reference"):
        xs = x.clone().requires_grad_()
        y, _ = seq(xs, None, params, is_init=is_init, backend=backend)
        results.append((y.detach(), *torch.autograd.grad((y * weights).sum(), xs)))
    torch.testing.assert_close(results[0], results[1], equal_nan=True)
    assert torch.isfinite(results[0][1][0, :5]).all() and torch.isfinite(results[0][1][1]).all()


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_matches_reference_fp32_nobias_2d_batch(cell: str) -> None:
    """*B = (4, 5): N = 20 rows span two programs of 16 rows, the second one partly masked."""
    problem = make_problem(
        cell, batch_shape=(4, 5), time=5, input_size=7, hidden=48, layers=2, bias=False, dtype=torch.float32
    )
    out, grads = outputs_and_grads(problem, "triton", matmul_precision="ieee")
    ref_out, ref_grads = outputs_and_grads(problem, "reference")
    _assert_all_close(out, ref_out, rtol=1e-4, atol=1e-5)
    _assert_all_close(grads, ref_grads, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_hidden_smaller_than_a_block(cell: str) -> None:
    """H=5: the kernels pad H to their minimum block of 16 lanes."""
    problem = make_problem(cell, batch_shape=(2,), time=4, input_size=3, hidden=5, layers=2)
    out, grads = outputs_and_grads(problem, "triton")
    ref_out, ref_grads = outputs_and_grads(problem, "reference")
    _assert_all_close(out, ref_out)
    _assert_all_close(grads, ref_grads)


def test_every_step_resets() -> None:
    """is_init everywhere: no state crosses any step, every carry comes from reset_state."""
    problem = make_problem("lstm", **SIZES, layers=2, reset_prob=1.0)
    out, grads = outputs_and_grads(problem, "triton")
    ref_out, ref_grads = outputs_and_grads(problem, "reference")
    _assert_all_close(out, ref_out)
    _assert_all_close(grads, ref_grads)
    assert all(g.abs().sum() == 0 for g in grads[1:3])  # the initial state is never read


# ----------------------------------------------------------------------------- bf16


def _grads_vs_fp64(problem: dict, backend: str, **kwargs) -> tuple[list, list]:
    """Outputs and grads with a loss whose weights are drawn in fp64 (same for every dtype)."""
    outs = flat(run_sequence(problem, backend, **kwargs))
    g = torch.Generator().manual_seed(7)
    weights = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in outs]
    loss = sum((o.double() * w).sum() for o, w in zip(outs, weights))
    grads = torch.autograd.grad(loss, problem["leaves"], materialize_grads=True)
    return [o.detach().double() for o in outs], [gr.double() for gr in grads]


def _cast_problem(problem: dict, dtype: torch.dtype) -> dict:
    def conv(v):
        if v is None:
            return None
        return tuple(conv(t) for t in v) if isinstance(v, tuple) else v.detach().to(dtype).requires_grad_(True)

    new = dict(problem, x=conv(problem["x"]), state=conv(problem["state"]), reset_state=conv(problem["reset_state"]))
    new["params"] = problem["params"].detach().to(dtype)
    for t in new["params"].values():
        t.requires_grad_(True)
    new["leaves"] = flat([new["x"], new["state"], *([new["reset_state"]] if new["reset_state"] is not None else [])])
    new["leaves"] += list(new["params"].values())
    return new


def _assert_rel_max(actual: list, expected: list, tol: float) -> None:
    for i, (a, e) in enumerate(zip(actual, expected)):
        err = (a - e).abs().max().item()
        scale = e.abs().max().item()
        assert err <= tol * max(scale, 1e-3), f"tensor #{i}: max error {err:.3g} > {tol} * max |expected| {scale:.3g}"


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_bf16_params_close_to_fp64(cell: str) -> None:
    """bf16 params: fp32 state and accumulation in the kernel; compared with fp64 on the same values."""
    bf16 = _cast_problem(make_problem(cell, **SIZES, layers=2, requires_grad=False), torch.bfloat16)
    exact = _cast_problem(bf16, torch.float64)
    out, grads = _grads_vs_fp64(bf16, "triton")
    ref_out, ref_grads = _grads_vs_fp64(exact, "reference")
    assert out[0].shape == ref_out[0].shape
    _assert_rel_max(out, ref_out, 2e-2)
    _assert_rel_max(grads, ref_grads, 2e-2)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_compute_dtype_bf16_with_fp32_params(cell: str) -> None:
    """compute_dtype=bf16 rounds only the recurrent matmul operands: bf16 tolerance vs fp32 reference."""
    problem = make_problem(cell, **SIZES, layers=2, dtype=torch.float32)
    out, grads = _grads_vs_fp64(problem, "triton", compute_dtype=torch.bfloat16)
    ref_out, ref_grads = _grads_vs_fp64(problem, "reference")
    _assert_rel_max(out, ref_out, 2e-2)
    _assert_rel_max(grads, ref_grads, 2e-2)
    exact_out, _ = _grads_vs_fp64(problem, "triton", compute_dtype=torch.float32)
    assert max((a - b).abs().max() for a, b in zip(out, exact_out)) > 0  # the option is honoured


def test_inter_layer_dropout() -> None:
    """Dropout comes from the core's between_layers: off when not training, applied when training."""
    problem = make_problem("gru", **SIZES, layers=2)
    out_eval, _ = outputs_and_grads(problem, "triton", dropout=0.5, training=False)
    ref_eval, _ = outputs_and_grads(problem, "reference")
    _assert_all_close(out_eval, ref_eval)
    torch.manual_seed(0)
    out_train, grads_train = outputs_and_grads(problem, "triton", dropout=0.5, training=True)
    assert not torch.allclose(out_train[0], out_eval[0])
    assert all(torch.isfinite(g).all() for g in grads_train)


# ----------------------------------------------------------------------------- recompute, segments


def _saved_bytes(fn) -> int:
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_recompute_full_equals_none_and_saves_less(cell: str) -> None:
    problem = make_problem(cell, **SIZES, layers=2)
    runs = {}  # the bytes saved for backward are counted on the runs whose gradients are compared
    saved_full = _saved_bytes(lambda: runs.setdefault("full", outputs_and_grads(problem, "triton", recompute="full")))
    saved_none = _saved_bytes(lambda: runs.setdefault("none", outputs_and_grads(problem, "triton", recompute="none")))
    _assert_all_close(runs["full"][0], runs["none"][0])
    _assert_all_close(runs["full"][1], runs["none"][1])
    assert saved_full < saved_none


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_segment_states_match_reference(cell: str) -> None:
    problem = make_problem(cell, **SIZES, layers=2, reset_prob=0.4)
    out, grads = outputs_and_grads(problem, "triton", return_segment_states=True)
    ref_out, ref_grads = outputs_and_grads(problem, "reference", return_segment_states=True)
    _assert_all_close(out, ref_out)
    _assert_all_close(grads, ref_grads)


def test_empty_sequence() -> None:
    """T = 0: no step runs; the carry is the initial state, outputs and segment states are empty."""
    problem = make_problem("lstm", batch_shape=(2,), time=0, input_size=3, hidden=8, layers=2, reset_prob=0.0,
                           requires_grad=False)
    out = flat(run_sequence(problem, "triton", return_segment_states=True))
    _assert_all_close(out, flat(run_sequence(problem, "reference", return_segment_states=True)))
    assert out[0].shape == (2, 0, 8)


# ----------------------------------------------------------------------------- compile, vmap


# Inductor with the LSTM; the GRU with recompute="full" checks the capture (aot_eager; its Inductor compile is
# compile_tests/test_compile_as_called.py::test_default_compile_module_recurrent_every_backend[gru-triton])
@pytest.mark.parametrize("cell, recompute, compiler", [("lstm", "none", "inductor"), ("gru", "full", "aot_eager")])
def test_compile_fullgraph_no_graph_break_matches_eager(cell: str, recompute: str, compiler: str) -> None:
    problem = make_problem(cell, **SIZES, layers=2, dtype=torch.float32)
    params, is_init, reset = problem["params"], problem["is_init"], problem["reset_state"]
    seq = rf.lstm_sequence if cell == "lstm" else rf.gru_sequence

    def fn(x, state):
        y, carry = seq(x, state, params, is_init=is_init, reset_state=reset, backend="triton", recompute=recompute)
        return (y, *flat(carry))

    compiled = torch.compile(fn, fullgraph=True, backend=compiler)  # fullgraph: a graph break raises
    outs = compiled(problem["x"], problem["state"])
    grads = torch.autograd.grad(sum(o.sum() for o in outs), problem["leaves"])
    ref_outs = fn(problem["x"], problem["state"])
    ref_grads = torch.autograd.grad(sum(o.sum() for o in ref_outs), problem["leaves"])
    _assert_all_close(list(outs), list(ref_outs), rtol=1e-5, atol=1e-6)
    _assert_all_close(list(grads), list(ref_grads), rtol=1e-5, atol=1e-6)


# one vmap rule (ops._fold_ensemble) serves every op: each cell once, each in_dims of x once
@pytest.mark.parametrize(("cell", "x_batched"), [("lstm", False), ("gru", True)],
                         ids=["lstm-in_dims=(None,0,0)", "gru-in_dims=(0,0,0)"])
def test_vmap_over_stacked_params_one_launch(cell: str, x_batched: bool) -> None:
    E, L, (N, T, F, H) = 3, 2, (3, 5, 7, 48)
    init, _, seq = {"lstm": (rf.init_lstm_params, None, rf.lstm_sequence), "gru": (rf.init_gru_params, None, rf.gru_sequence)}[cell]
    g = torch.Generator().manual_seed(0)
    members = [init(F, H, L, dtype=torch.float64, generator=g) for _ in range(E)]
    stacked = torch.stack(members)
    x = torch.randn((E, N, T, F) if x_batched else (N, T, F), generator=g, dtype=torch.float64)
    n_states = 2 if cell == "lstm" else 1
    states = [torch.randn(E, N, L, H, generator=g, dtype=torch.float64) for _ in range(n_states)]
    is_init = torch.rand(N, T, generator=g) < 0.3
    for t in [*stacked.values(), *states]:
        t.requires_grad_(True)

    def fn(x, p, state):
        y, carry = seq(x, state, p, is_init=is_init, backend="triton")
        return y, carry

    state_arg = tuple(states) if cell == "lstm" else states[0]
    before = _launches()
    y, carry = torch.vmap(fn, in_dims=(0 if x_batched else None, 0, 0))(x, stacked, state_arg)
    assert _launches() - before == L  # one launch per layer for the whole ensemble
    (y.sum() + sum(c.sum() for c in flat(carry))).backward()

    for e, member in enumerate(members):
        member = member.clone().apply(lambda t: t.detach().requires_grad_(True))
        st = tuple(s[e].detach() for s in states)
        ye, ce = seq(x[e] if x_batched else x, st if cell == "lstm" else st[0], member, is_init=is_init, backend="reference")
        torch.testing.assert_close(y[e], ye)
        _assert_all_close([c[e] for c in flat(carry)], flat(ce))
        (ye.sum() + sum(c.sum() for c in flat(ce))).backward()
        for key, value in member.items():
            torch.testing.assert_close(stacked[key].grad[e], value.grad, msg=lambda m, k=key: f"{k}: {m}")


@pytest.mark.skipif(
    tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) < (2, 13),
    reason="torch 2.11's wrap_triton refuses the interpreter's kernels (triton 3.6 hands it an InterpretedFunction); "
           "compiled, this registration ran on an H200 (docs/gpu.md)")
def test_triton_op_registration_matches_opaque_eager() -> None:
    """The CUDA registration (``triton_op`` + ``wrap_triton``) runs eagerly in the interpreter:
    forward, autograd and the vmap rule agree with the opaque registration used on CPU."""
    from rnn_functional.backends.triton import ops

    g = torch.Generator().manual_seed(5)
    E, N, T, F, H = 2, 3, 5, 7, 48

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).requires_grad_(True)

    args = [rnd(E, N, T, F), rnd(E, 4 * H, F, scale=0.1), rnd(E, 4 * H, scale=0.1), rnd(E, 4 * H, H, scale=0.1),
            rnd(E, 4 * H, scale=0.1), rnd(E, N, H), rnd(E, N, H), torch.rand(E, N, T, generator=g) < 0.3,
            rnd(E, N, T, H), rnd(E, N, T, H)]
    tensors = [a for a in args if a.requires_grad]
    results = []
    for layer in (ops.TRITON_OPS, ops.OPAQUE_OPS):
        hs, cs, _ = layer.fwd(*args, True, True, "float64", "ieee")
        grads = torch.autograd.grad(hs.sum() + (cs * cs).sum(), tensors)
        stacked = [torch.stack([a.detach(), a.detach().flip(0)]) for a in args]  # a vmapped dim over [E, ...]
        batched = torch.vmap(layer.fwd, in_dims=(0,) * 10 + (None,) * 4)(*stacked, True, True, "float64", "ieee")
        torch.testing.assert_close(batched[0][0], hs.detach())  # member 0 of the vmapped call is `args`
        results.append([hs, cs, *grads, *batched[:2]])
    _assert_all_close(results[0], results[1])


# ----------------------------------------------------------------------------- step


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_fused_step_matches_reference_step(cell: str) -> None:
    init, step, _ = {"lstm": (rf.init_lstm_params, rf.lstm_step, None), "gru": (rf.init_gru_params, rf.gru_step, None)}[cell]
    g = torch.Generator().manual_seed(3)
    params = init(7, 48, 2, dtype=torch.float64, generator=g)
    x = torch.randn(2, 3, 7, generator=g, dtype=torch.float64)
    states = [torch.randn(2, 3, 2, 48, generator=g, dtype=torch.float64) for _ in range(2 if cell == "lstm" else 1)]
    state = tuple(states) if cell == "lstm" else states[0]
    is_init = torch.tensor([[True, False, False], [False, True, False]])
    before = _launches()
    out = step(x, state, params, is_init=is_init, backend="triton")
    assert _launches() - before == 2  # one fused launch per layer
    _assert_all_close(flat(out), flat(step(x, state, params, is_init=is_init, backend="reference")))
    # "auto" never picks triton off CUDA
    before = _launches()
    step(x, state, params, is_init=is_init)
    assert _launches() == before


def test_step_rejects_unknown_backend() -> None:
    params = rf.init_gru_params(7, 48)
    with pytest.raises(ValueError, match="backend: expected one of"):
        rf.gru_step(torch.randn(3, 7), None, params, backend="scan")


# ----------------------------------------------------------------------------- limits


def test_is_available() -> None:
    assert tb.is_available("cpu")
    assert tb.is_available(torch.device("cuda")) == torch.cuda.is_available()
    assert "triton" in rf.available_backends("cpu")


@pytest.mark.parametrize(
    "kind, kwargs, match",
    [
        ("proj", {}, r"backend 'triton' does not support proj_size.*reference, scan, pad"),
        ("fp16", {}, r"backend 'triton' does not support params of dtype torch.float16.*reference, scan, pad"),
        ("fp32", {"compute_dtype": torch.float64}, r"compute_dtype: backend 'triton' with torch.float32 params accepts"),
        ("fp64", {"compute_dtype": torch.bfloat16}, r"compute_dtype: backend 'triton' with torch.float64 params accepts"),
        ("fp32", {"matmul_precision": "tf16"}, r"matmul_precision: expected one of"),
    ],
)
def test_unsupported_configurations_raise(kind: str, kwargs: dict, match: str) -> None:
    hidden = 8
    dtype = {"fp16": torch.float16, "fp64": torch.float64}.get(kind, torch.float32)
    params = rf.init_lstm_params(3, hidden, proj_size=4 if kind == "proj" else 0, dtype=dtype)
    x = torch.randn(2, 4, 3, dtype=dtype)
    with pytest.raises(ValueError, match=match):
        rf.lstm_sequence(x, None, params, backend="triton", **kwargs)
    if not kwargs:  # the step refuses alike (it ran proj_size silently wrong, fp16 to a bare KeyError)
        with pytest.raises(ValueError, match=match):
            rf.lstm_step(x[:, 0], None, params, backend="triton")


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_output_is_contiguous_and_takes_in_place_ops(cell: str) -> None:
    """``y`` is contiguous as on every backend (it was a strided view of the buffer the kernel's backward saves):
    ``y.view(-1, H)`` works and an in-place op on ``y`` before the backward gives ``reference``'s gradients."""
    problem = make_problem(cell, dtype=torch.float64, seed=4, requires_grad=False, **SIZES)
    grads = []
    for backend in ("triton", "reference"):
        x = problem["x"].clone().requires_grad_()
        y, _ = {"lstm": rf.lstm_sequence, "gru": rf.gru_sequence}[cell](
            x, None, problem["params"], is_init=problem["is_init"], backend=backend)
        assert y.is_contiguous() and y.view(-1, y.shape[-1]).shape[0] == y.shape[0] * y.shape[1]
        y.mul_(2)
        grads.append(torch.autograd.grad(y.sin().sum(), x)[0])
    torch.testing.assert_close(grads[0], grads[1])


def test_too_large_for_32bit_indexing_raises(monkeypatch) -> None:
    from rnn_functional.backends.triton import ops

    monkeypatch.setattr(ops, "MAX_ELEMENTS", 3 * 6 * 4 * 8)  # N * (T+1) * 4 * H of this call
    with pytest.raises(ValueError, match=r"backend 'triton': E\*N\*\(T\+1\)\*4\*H = 576 exceeds .*reference, scan, pad"):
        rf.lstm_sequence(torch.randn(3, 5, 2), None, rf.init_lstm_params(2, 8), backend="triton")


# ----------------------------------------------------------------------------- kernel variants


def test_kernel_variant_forces_a_variant() -> None:
    """``kernel_variant`` switches the launcher's choice (the tests rely on it) and restores it."""
    assert tb.variant_for(64, 4, 4, batch=64) == "streamed"  # the interpreter: auto keeps the streamed kernels
    with tb.kernel_variant("persistent"):
        assert tb.variant_for(64, 4, 4, batch=64) == "persistent"
        with tb.kernel_variant("streamed"):
            assert tb.variant_for(64, 4, 4, batch=64, sms=132) == "streamed"
        assert tb.variant_for(48, 4, 4, batch=64) == "streamed"  # where the persistent kernels cannot serve
    assert tb.variant_for(64, 4, 4, batch=64, sms=132) == "persistent"  # on a GPU
    with pytest.raises(ValueError, match=r"variant: expected one of \['auto', 'streamed', 'persistent'\], got 'tiled'"):
        with tb.kernel_variant("tiled"):
            pass


# ----------------------------------------------------------------------------- GPU (realistic sizes)

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("hidden", [128, 256])
def test_gpu_realistic_fp32_ieee(cell: str, hidden: int) -> None:
    problem = make_problem(cell, batch_shape=(256,), time=64, input_size=32, hidden=hidden, layers=1,
                           dtype=torch.float32, reset_prob=0.03, requires_grad=False)
    problem = {k: (v.cuda() if hasattr(v, "cuda") else v) for k, v in problem.items() if k != "leaves"}
    problem["state"] = tuple(s.cuda() for s in problem["state"]) if cell == "lstm" else problem["state"]
    problem["reset_state"] = (tuple(s.cuda() for s in problem["reset_state"]) if cell == "lstm"
                              else problem["reset_state"])
    problem["leaves"] = flat([problem["x"], problem["state"], problem["reset_state"]]) + list(problem["params"].values())
    for t in problem["leaves"]:
        t.requires_grad_(True)
    out, grads = outputs_and_grads(problem, "triton", matmul_precision="ieee")
    ref_out, ref_grads = outputs_and_grads(problem, "reference")
    _assert_all_close(out, ref_out, rtol=1e-4, atol=1e-4)
    _assert_all_close(grads, ref_grads, rtol=1e-3, atol=1e-3)
