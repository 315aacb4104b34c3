"""minGRU and RG-LRU (issue 30) against independent plain-PyTorch loops, on every backend.

fp64 at ``assert_close`` defaults: outputs and gradients w.r.t. ``x``, the state, ``reset_state`` and every
parameter, on ``reference``, ``scan`` (``recompute`` none/full), ``parallel`` (none/full) and ``auto``; resets at
t = 0, at every step, none and random; one and two layers. The loops follow the issue's equations literally (the
RG-LRU's ``a = sigmoid(Λ)^(c r)`` as a power, ``sqrt(1 - a^2)`` as written), step by step. Stability: fp32 and
bf16 ``parallel`` over T = 4096 against the fp64 loop, with the error bounds stated at the test. Flat ragged
batches equal per-segment runs; ``torch.vmap`` equals a loop; every order of derivative is exact.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rnn_functional as rf
from test_host_reads import HostReads

F_IN, H, B, T = 3, 4, 3, 9
BACKENDS = [("reference", "none"), ("scan", "none"), ("scan", "full"), ("parallel", "none"), ("parallel", "full"),
            ("auto", "none")]


# ----------------------------------------------------------------------------- the independent loops


def min_gru_cell(x, h, w, b):
    z, c = (x @ w.T + b).chunk(2, -1)
    z = torch.sigmoid(z)
    return (1 - z) * h + z * c


def rglru_cell(x, h, w, b, log_lambda):
    u, r, i = (x @ w.T + b).chunk(3, -1)
    r, i = torch.sigmoid(r), torch.sigmoid(i)
    a = torch.sigmoid(log_lambda) ** (8 * r)
    return a * h + torch.sqrt(1 - a * a) * (i * u)


def loop(cell: str, x, h0, params, is_init=None, reset=None):
    """``x [N, T, F]``, ``h0 [N, L, H]`` (or None), ``is_init [N, T]``, ``reset [N, T, L, H]`` -> ``(y, h_T)``."""
    layers = sum(1 for k in params.keys() if k.startswith("weight_l"))
    n, t_len = x.shape[:2]
    h = [torch.zeros(n, H, dtype=x.dtype) if h0 is None else h0[:, k] for k in range(layers)]
    ys = []
    for t in range(t_len):
        inp = x[:, t]
        for k in range(layers):
            if is_init is not None:
                start = torch.zeros_like(h[k]) if reset is None else reset[:, t, k]
                h[k] = torch.where(is_init[:, t, None], start, h[k])
            w, b = params[f"weight_l{k}"], params[f"bias_l{k}"]
            h[k] = min_gru_cell(inp, h[k], w, b) if cell == "min_gru" else rglru_cell(inp, h[k], w, b, params[f"log_lambda_l{k}"])
            inp = h[k]
        ys.append(inp)
    return torch.stack(ys, 1), torch.stack(h, 1)


FUNCS = {"min_gru": (rf.init_min_gru_params, rf.min_gru_step, rf.min_gru_sequence),
         "rglru": (rf.init_rglru_params, rf.rglru_step, rf.rglru_sequence)}


def make_case(cell: str, layers: int, resets: str, seed: int = 0, t_len: int = T, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    params = FUNCS[cell][0](F_IN, H, layers, dtype=dtype, generator=g)
    x = torch.randn(B, t_len, F_IN, generator=g, dtype=dtype)
    h0 = torch.randn(B, layers, H, generator=g, dtype=dtype)
    is_init = {"none": torch.zeros(B, t_len, dtype=torch.bool),
               "t0": torch.zeros(B, t_len, dtype=torch.bool).index_fill(1, torch.tensor([0]), True),
               "every": torch.ones(B, t_len, dtype=torch.bool),
               "random": torch.rand(B, t_len, generator=g) < 0.3}[resets]
    reset = torch.randn(B, t_len, layers, H, generator=g, dtype=dtype)
    return params, x, h0, is_init, reset


def _leaves(params, *tensors):
    leaves = [t.detach().requires_grad_() for t in tensors]
    p = params.clone().apply(lambda t: t.detach().requires_grad_())
    return p, leaves


def _grads(y, h, leaves):
    g = torch.Generator().manual_seed(7)
    loss = (y * torch.randn(y.shape, generator=g, dtype=y.dtype)).sum() + (h * torch.randn(h.shape, generator=g, dtype=h.dtype)).sum()
    return torch.autograd.grad(loss, leaves)


# ----------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("cell", list(FUNCS))
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("resets", ["none", "t0", "every", "random"])
@pytest.mark.parametrize("backend,recompute", BACKENDS)
def test_sequence_equals_the_loop(cell, layers, resets, backend, recompute):
    params, x, h0, is_init, reset = make_case(cell, layers, resets)
    p, (x, h0, reset) = _leaves(params, x, h0, reset)
    leaves = [x, h0, reset, *p.values()]
    y, h = FUNCS[cell][2](x, h0, p, is_init=is_init, reset_state=reset, backend=backend, recompute=recompute)
    y_ref, h_ref = loop(cell, x, h0, p, is_init, reset)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(h, h_ref)
    for got, want in zip(_grads(y, h, leaves), _grads(y_ref, h_ref, leaves)):
        torch.testing.assert_close(got, want)


def _non_finite_case(cell: str):
    """T = 13 (``parallel``: chunks of 4 steps, then one), two layers. Row 0 starts from a NaN state (reset at t = 0),
    has a NaN input before its reset at 5 and one after it, in the same chunk (the chunk's product of ``a`` is NaN),
    erased by the reset at 9; row 1 an inf input before its reset at 4; row 2 a NaN input at its reset at 7, a
    one-step segment before the reset at 8. ``reset_state`` is NaN wherever ``is_init`` is False (never read).
    Returns the finite ``x``, the poisoned one and the first clean step of each row."""
    t_len = 13
    params, x, h0, _, reset = make_case(cell, 2, "none", seed=11, t_len=t_len)
    is_init = torch.zeros(B, t_len, dtype=torch.bool)
    is_init[:, 0] = is_init[0, 5] = is_init[0, 9] = is_init[1, 4] = is_init[2, 7] = is_init[2, 8] = True
    h0[0] = float("nan")
    reset[~is_init] = float("nan")
    bad_x = x.clone()
    bad_x[0, 2], bad_x[0, 6], bad_x[1, 3], bad_x[2, 7] = float("nan"), float("nan"), float("inf"), float("nan")
    return params, x, bad_x, h0, is_init, reset, (9, 4, 8)


@pytest.mark.parametrize("cell", list(FUNCS))
@pytest.mark.parametrize("backend,recompute", BACKENDS)
def test_non_finite_values_do_not_cross_a_reset(cell, backend, recompute):
    """A reset erases what came before it, NaN and inf included (a diverged episode, a corrupt observation): the steps
    after it equal the loop's and are finite; a ``reset_state`` never read may hold NaN; the gradients equal the loop's,
    NaN exactly where its are (a NaN input's local derivatives are NaN on any backend, and reach no step before the
    reset that precedes it). ``parallel`` once folded a reset in as ``0 * h``: NaN crossed it both ways."""
    params, x, bad_x, h0, is_init, reset, clean = _non_finite_case(cell)
    seq = FUNCS[cell][2]
    for grad in (False, True):  # eagerly without autograd the scan writes into buffers
        with torch.set_grad_enabled(grad):
            y, h = seq(bad_x, h0, params, is_init=is_init, reset_state=reset, backend=backend, recompute=recompute)
        y_ref, h_ref = loop(cell, bad_x, h0, params, is_init, reset)
        torch.testing.assert_close(y, y_ref, equal_nan=True)
        torch.testing.assert_close(h, h_ref)
        for row, t0 in enumerate(clean):
            assert torch.isfinite(y[row, t0:]).all(), (row, y[row])
    for inputs, finite in ((x, True), (bad_x, False)):
        p, (xs, h0s, rs) = _leaves(params, inputs, h0, reset)
        leaves = [xs, h0s, rs, *p.values()]
        y, h = seq(xs, h0s, p, is_init=is_init, reset_state=rs, backend=backend, recompute=recompute)
        y_ref, h_ref = loop(cell, xs, h0s, p, is_init, rs)
        got, want = _grads(y, h, leaves), _grads(y_ref, h_ref, leaves)
        torch.testing.assert_close(got[0], want[0], equal_nan=True)  # x
        for row, t0 in enumerate(clean):
            assert torch.isfinite(got[0][row, t0:]).all(), (row, got[0][row])
        assert torch.isfinite(got[0][2, :7]).all(), got[0][2]  # before the reset at a NaN input
        if finite:
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b)


@pytest.mark.parametrize("cell", list(FUNCS))
@pytest.mark.parametrize("backend", ["reference", "scan", "parallel"])
def test_without_state_or_reset_state(cell, backend):
    """``state=None`` starts from zeros; ``is_init`` without ``reset_state`` resets to zeros."""
    params, x, _, is_init, _ = make_case(cell, 2, "random", seed=1)
    y, h = FUNCS[cell][2](x, None, params, is_init=is_init, backend=backend)
    y_ref, h_ref = loop(cell, x, None, params, is_init)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(h, h_ref)


@pytest.mark.parametrize("cell", list(FUNCS))
@pytest.mark.parametrize("backend", ["auto", "reference", "parallel"])
def test_step_equals_the_loop(cell, backend):
    params, x, h0, is_init, _ = make_case(cell, 2, "random", seed=2)
    y, h = FUNCS[cell][1](x[:, 0], h0, params, is_init=is_init[:, 0], backend=backend)
    y_ref, h_ref = loop(cell, x[:, :1], h0, params, is_init[:, :1])
    torch.testing.assert_close(y, y_ref[:, 0])
    torch.testing.assert_close(h, h_ref)


@pytest.mark.parametrize("cell", list(FUNCS))
def test_segment_states_and_batch_dims(cell):
    """``return_segment_states`` as ``gru_sequence``'s; ``*B`` with two dims equals the flattened call."""
    params, x, h0, is_init, reset = make_case(cell, 2, "random", seed=3)
    y, h, seg = FUNCS[cell][2](x, h0, params, is_init=is_init, reset_state=reset, backend="parallel",
                               return_segment_states=True)
    _, _, seg_ref = FUNCS[cell][2](x, h0, params, is_init=is_init, reset_state=reset, backend="reference",
                                   return_segment_states=True)
    torch.testing.assert_close(seg, seg_ref)
    ends = torch.cat([is_init[:, 1:], torch.ones(B, 1, dtype=torch.bool)], 1)
    assert (seg[~ends] == 0).all() and (seg[ends] != 0).any()
    y2, h2 = FUNCS[cell][2](x.reshape(1, B, T, F_IN), h0.reshape(1, B, 2, H), params, is_init=is_init.reshape(1, B, T),
                            reset_state=reset.reshape(1, B, T, 2, H), backend="parallel")
    torch.testing.assert_close(y2[0], y)
    torch.testing.assert_close(h2[0], h)


@pytest.mark.parametrize("cell", list(FUNCS))
@pytest.mark.parametrize("backend", ["reference", "scan", "parallel"])
def test_strided_inputs(cell, backend):
    """Non-contiguous ``x``, state and ``reset_state`` (transposed and sliced views) give the contiguous call's
    outputs and gradients."""
    params, x, h0, is_init, reset = make_case(cell, 2, "random", seed=10)
    p, (x, h0, reset) = _leaves(params, x, h0, reset)
    xs = x.transpose(0, 1).contiguous().transpose(0, 1)  # [B, T, F] with time-major strides
    h0s = torch.cat([h0, h0], -1)[..., :H]
    rs = reset.transpose(0, 1).contiguous().transpose(0, 1)
    is_init_s = is_init.t().contiguous().t()
    assert not (xs.is_contiguous() or h0s.is_contiguous() or rs.is_contiguous() or is_init_s.is_contiguous())
    leaves = [x, h0, reset, *p.values()]
    y, h = FUNCS[cell][2](xs, h0s, p, is_init=is_init_s, reset_state=rs, backend=backend)
    y_ref, h_ref = loop(cell, x, h0, p, is_init, reset)
    torch.testing.assert_close((y, h), (y_ref, h_ref))
    for got, want in zip(_grads(y, h, leaves), _grads(y_ref, h_ref, leaves)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("cell", list(FUNCS))
@pytest.mark.parametrize("backend", ["auto", "reference", "scan", "parallel"])
@pytest.mark.parametrize("empty", ["batch", "time"])
def test_empty_batch_or_time_backpropagates_zeros(cell, backend, empty):
    n, t_len = (0, T) if empty == "batch" else (B, 0)
    p, (x, h0) = _leaves(FUNCS[cell][0](F_IN, H, 2, dtype=torch.float64),
                         torch.randn(n, t_len, F_IN, dtype=torch.float64), torch.randn(n, 2, H, dtype=torch.float64))
    y, h = FUNCS[cell][2](x, h0, p, is_init=torch.zeros(n, t_len, dtype=torch.bool), backend=backend)
    assert y.shape == (n, t_len, H) and h.shape == (n, 2, H)
    torch.testing.assert_close(h, h0)
    grads = torch.autograd.grad(y.sum() + h.sum(), [x, h0, *p.values()])
    assert all((g == 0).all() for g in (grads[0], *grads[2:])) and (grads[1] == 1).all()


# ----------------------------------------------------------------------------- stability over long sequences


@pytest.mark.parametrize("cell", list(FUNCS))
def test_parallel_fp32_and_bf16_over_4096_steps(cell):
    """Over T = 4096 (two layers, 1% resets), against the fp64 loop on the same (rounded) params and inputs: fp32
    ``parallel`` within 1e-6 (minGRU, states up to ~2) and 1e-4 (RG-LRU, states up to ~13) absolute, gradients within
    1e-3 relative; in fp32 and bf16 no further from fp64 than the sequential ``reference`` loop in that dtype (x1.5).
    Measured: fp32 1.6e-7 / 1.1e-5; bf16 7.3e-3 (minGRU) and 3.6 (RG-LRU, where ``reference`` is off by 4.3: bf16
    cannot hold ``a`` near 0.999, its spacing below 1 is 2^-8). Products of ``a`` underflow over these lengths
    (minGRU's ``a ~ 1/2``): a scan dividing by them would return inf/NaN."""
    t_len = 4096
    params, x, h0, _, reset = make_case(cell, 2, "random", seed=4, t_len=t_len)
    is_init = torch.rand(B, t_len, generator=torch.Generator().manual_seed(0)) < 0.01
    for dtype, atol in ((torch.float32, 1e-6 if cell == "min_gru" else 1e-4), (torch.bfloat16, None)):
        p, (xl, h0l, rl) = _leaves(params.to(dtype), x.to(dtype), h0.to(dtype), reset.to(dtype))
        y64, h64 = loop(cell, xl.double(), h0l.double(), p.double(), is_init, rl.double())
        y, h = FUNCS[cell][2](xl, h0l, p, is_init=is_init, reset_state=rl, backend="parallel")
        assert torch.isfinite(y).all()
        error = (y.double() - y64).abs().max()
        y_seq, _ = FUNCS[cell][2](xl.detach(), h0l, p.detach(), is_init=is_init, reset_state=rl, backend="reference")
        assert error <= 1.5 * (y_seq.double() - y64).abs().max() + 1e-7
        if atol is not None:
            torch.testing.assert_close(y.double(), y64, atol=atol, rtol=0)
            torch.testing.assert_close(h.double(), h64, atol=atol, rtol=0)
            y.sum().backward()
            p64, (x64,) = _leaves(p.double(), xl.double())
            loop(cell, x64, h0l.double(), p64, is_init, rl.double())[0].sum().backward()
            for key in p.keys():
                torch.testing.assert_close(p[key].grad.double(), p64[key].grad, rtol=1e-3, atol=1e-3)
            torch.testing.assert_close(xl.grad.double(), x64.grad, rtol=1e-3, atol=1e-4)


# ----------------------------------------------------------------------------- segments, vmap, derivatives


@given(lengths=st.lists(st.integers(1, 12), min_size=1, max_size=6), seed=st.integers(0, 2**16),
       backend=st.sampled_from(["parallel", "scan", "auto"]), cell=st.sampled_from(list(FUNCS)))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_flat_ragged_batch_equals_per_segment_runs(lengths, seed, backend, cell):
    """A flat ``[1, sum(lengths)]`` row with a reset at every segment start (a SliceSampler batch) equals each
    segment run alone from its ``reset_state``: nothing leaks across a boundary, in either direction of AD."""
    g = torch.Generator().manual_seed(seed)
    params = FUNCS[cell][0](F_IN, H, 2, dtype=torch.float64, generator=g)
    total = sum(lengths)
    x = torch.randn(1, total, F_IN, generator=g, dtype=torch.float64, requires_grad=True)
    reset = torch.randn(1, total, 2, H, generator=g, dtype=torch.float64)
    is_init = torch.zeros(1, total, dtype=torch.bool)
    starts = torch.tensor([0, *torch.tensor(lengths).cumsum(0)[:-1].tolist()])
    is_init[0, starts] = True
    y, _ = FUNCS[cell][2](x, torch.randn(1, 2, H, dtype=torch.float64), params, is_init=is_init, reset_state=reset,
                          backend=backend)
    (d_x,) = torch.autograd.grad(y[0, -1].sum(), x)
    last = starts[-1].item()
    assert (d_x[0, :last] == 0).all()  # the last segment's output reads nothing before its start
    for s, n in zip(starts.tolist(), lengths):
        seg_y, _ = FUNCS[cell][2](x[:, s : s + n], reset[:, s, :, :], params, backend="reference")
        torch.testing.assert_close(y[:, s : s + n], seg_y)


@pytest.mark.parametrize("cell", list(FUNCS))
@pytest.mark.parametrize("backend", ["parallel", "scan", "auto"])
def test_vmap_over_stacked_params_equals_a_loop(cell, backend):
    members = [FUNCS[cell][0](F_IN, H, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    stacked = rf.stack_params(members).apply(lambda t: t.requires_grad_())
    _, x, h0, is_init, reset = make_case(cell, 2, "random", seed=5)
    run = torch.vmap(lambda p: FUNCS[cell][2](x, h0, p, is_init=is_init, reset_state=reset, backend=backend))
    y, h = run(stacked)
    (y.sum() + h.square().sum()).backward()
    for i, m in enumerate(members):
        m = m.clone().apply(lambda t: t.requires_grad_())
        y_i, h_i = loop(cell, x, h0, m, is_init, reset)
        torch.testing.assert_close(y[i], y_i)
        (y_i.sum() + h_i.square().sum()).backward()
        for key in m.keys():
            torch.testing.assert_close(stacked[key].grad[i], m[key].grad)


@pytest.mark.parametrize("cell", list(FUNCS))
@pytest.mark.parametrize("backend", ["parallel", "auto"])
@pytest.mark.parametrize("mapped", ["state", "reset_state", "is_init"])
def test_vmap_over_one_argument_alone_equals_a_loop(cell, backend, mapped):
    """``torch.vmap`` over the initial state alone (several starts of the same rows), ``reset_state`` alone or
    ``is_init`` alone: the scan's result is batched though ``a`` and ``b`` are not (it wrote into an unbatched
    buffer: "Batching rule not implemented for aten::where.self_out"); outputs and the mapped argument's gradient."""
    params, x, h0, is_init, reset = make_case(cell, 2, "random", seed=7)
    g = torch.Generator().manual_seed(8)
    stacked = {"state": torch.randn(3, *h0.shape, generator=g, dtype=h0.dtype),
               "reset_state": torch.randn(3, *reset.shape, generator=g, dtype=reset.dtype),
               "is_init": torch.rand(3, *is_init.shape, generator=g) < 0.3}[mapped]

    def run(value, backend):
        args = {"state": h0, "reset_state": reset, "is_init": is_init, mapped: value}
        return FUNCS[cell][2](x, args["state"], params, is_init=args["is_init"], reset_state=args["reset_state"],
                              backend=backend)[0]

    y = torch.vmap(lambda v: run(v, backend))(stacked)
    torch.testing.assert_close(y, torch.stack([loop(cell, x, *{"state": (s, params, is_init, reset),
                                                               "reset_state": (h0, params, is_init, s),
                                                               "is_init": (h0, params, s, reset)}[mapped])[0]
                                               for s in stacked]))
    if mapped != "is_init":
        grad = torch.func.grad(lambda v: torch.vmap(lambda u: run(u, backend))(v).square().sum())(stacked)
        torch.testing.assert_close(grad, torch.func.grad(lambda v: torch.vmap(lambda u: run(u, "reference"))(v)
                                                         .square().sum())(stacked))


@pytest.mark.parametrize("cell", list(FUNCS))
@pytest.mark.parametrize("backend", ["parallel", "scan", "reference"])
def test_second_order_and_forward_mode_are_exact(cell, backend):
    params, x, h0, is_init, reset = make_case(cell, 1, "random", seed=6, t_len=5)
    x, h0, reset = (t[:2] for t in (x, h0, reset))
    is_init = is_init[:2]
    log_lambda = params.get("log_lambda_l0")

    def f(x, h0, reset, w):
        p = params.clone()
        p["weight_l0"] = w
        y, h = FUNCS[cell][2](x, h0, p, is_init=is_init, reset_state=reset, backend=backend)
        return y.sin().sum() + h.sum()

    args = tuple(t.detach().requires_grad_() for t in (x, h0, reset, params["weight_l0"]))
    assert torch.autograd.gradgradcheck(f, args)
    tangents = tuple(torch.randn_like(t) for t in args)
    _, jvp = torch.func.jvp(f, args, tangents)
    grads = torch.autograd.grad(f(*args), args)
    torch.testing.assert_close(jvp, sum((g * t).sum() for g, t in zip(grads, tangents)))
    assert log_lambda is None or log_lambda.shape == (H,)


@pytest.mark.parametrize("backend", ["parallel", "scan", "reference"])
def test_rglru_gradients_stay_finite_where_the_decay_rounds_to_one(backend):
    """A saturated recurrence gate (``r = sigmoid(-1000) = 0`` in fp64) or an underflowing ``softplus(-Λ)`` makes
    ``a = 1`` and ``sqrt(1 - a^2) = 0``, whose derivative is infinite: every gradient came back NaN (inf * 0), on
    every backend. The true gradients there are 0 (see ``rglru._parts``): first and second order against finite
    differences, with both channels saturated among normal ones."""
    g = torch.Generator().manual_seed(0)
    params = rf.init_rglru_params(2, H, dtype=torch.float64, generator=g)
    with torch.no_grad():
        params["bias_l0"][H] = -1000.0  # channel 0's recurrence gate r: saturated at 0
        params["log_lambda_l0"][1] = 800.0  # channel 1: softplus(-800) underflows to 0
    x = torch.randn(2, 4, 2, dtype=torch.float64, generator=g)

    def f(x, w, b, log_lambda):
        p = {"weight_l0": w, "bias_l0": b, "log_lambda_l0": log_lambda}
        y, h = rf.rglru_sequence(x, None, p, backend=backend)
        return y.sin().sum() + h.sum()

    keys = ("weight_l0", "bias_l0", "log_lambda_l0")
    args = tuple(t.detach().clone().requires_grad_() for t in (x, *(params[k] for k in keys)))
    grads = torch.autograd.grad(f(*args), args)
    assert all(gr.isfinite().all() for gr in grads)
    assert torch.autograd.gradcheck(f, args) and torch.autograd.gradgradcheck(f, args)


def test_linear_scan_is_exact_to_second_order_in_both_directions():
    """The parallel backend's primitive, ``h_t = a_t h_{t-1} + b_t`` (or from the end; ``b_t`` alone at a cut), at
    lengths that leave a partial chunk, with and without a start, with and without cuts (one at the first step)."""
    from rnn_functional.backends.parallel import linear_scan

    g = torch.Generator().manual_seed(0)
    for t_len in (1, 2, 5, 17):
        for reverse in (False, True):
            for cut in (None, torch.rand(2, t_len, 1, generator=g) < 0.3):
                a, b = (torch.rand(2, t_len, 3, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
                init = torch.randn(2, 3, generator=g, dtype=torch.float64, requires_grad=True)
                if cut is not None:
                    cut[0, -1 if reverse else 0] = True
                h, out = init, [None] * t_len
                for t in (range(t_len - 1, -1, -1) if reverse else range(t_len)):
                    h = a[:, t] * h + b[:, t] if cut is None else torch.where(cut[:, t], b[:, t], a[:, t] * h + b[:, t])
                    out[t] = h
                torch.testing.assert_close(linear_scan(a, b, init, reverse, cut), torch.stack(out, 1))
                assert torch.autograd.gradgradcheck(lambda a, b, i: linear_scan(a, b, i, reverse, cut), (a, b, init))
                assert torch.autograd.gradcheck(lambda a, b: linear_scan(a, b, None, reverse, cut), (a, b))


# ----------------------------------------------------------------------------- init, errors, host reads


def test_init_follows_the_papers():
    p = rf.init_rglru_params(64, 256, 2, generator=torch.Generator().manual_seed(0))
    decay = torch.sigmoid(p["log_lambda_l1"].double()) ** 8
    assert decay.min() >= 0.9 - 1e-6 and decay.max() <= 0.999 + 1e-6 and decay.std() > 0.02
    assert p["weight_l0"].shape == (768, 64) and p["weight_l1"].shape == (768, 256)
    assert p["weight_l0"].abs().max() <= 1 / 64**0.5 and p["weight_l1"].abs().max() <= 1 / 256**0.5
    m = rf.init_min_gru_params(5, 7, dtype=torch.float64)
    assert set(m.keys()) == {"weight_l0", "bias_l0"} and m["weight_l0"].shape == (14, 5) and m["bias_l0"].dtype == torch.float64


def test_errors_name_the_backend_the_key_and_the_fix():
    x = torch.randn(2, 4, 3)
    with pytest.raises(ValueError, match=r"backend 'parallel' cannot serve the GRU cell: .*linear in the state.*'scan'"):
        rf.gru_sequence(x, None, rf.init_gru_params(3, 5), backend="parallel")
    with pytest.raises(ValueError, match=r"backend 'parallel' cannot serve the LSTM"):
        rf.lstm_step(x[:, 0], None, rf.init_lstm_params(3, 5), backend="parallel")
    params = rf.init_min_gru_params(3, 5)
    for backend in ("pad", "triton"):
        with pytest.raises(ValueError, match=rf"backend '{backend}' cannot serve the minGRU cell.*'parallel'"):
            rf.min_gru_sequence(x, None, params, backend=backend)
    with pytest.raises(KeyError, match=r"missing key\(s\) \['log_lambda_l0'\]"):
        rf.rglru_sequence(x, None, {k: v for k, v in rf.init_rglru_params(3, 5).items() if k != "log_lambda_l0"})
    with pytest.raises(ValueError, match=r"params\['weight_l0'\]: expected shape \[3\*H, F\]"):
        rf.rglru_sequence(x, None, {**rf.init_min_gru_params(3, 5), "log_lambda_l0": torch.zeros(5)})
    with pytest.raises(ValueError, match=r"x: expected shape \[\*B, T, F\] with F=4"):
        rf.min_gru_sequence(x, None, rf.init_min_gru_params(4, 5))
    with pytest.raises(ValueError, match=r"segment_layout='aligned' is not a layout of backend 'parallel'"):
        rf.min_gru_sequence(x, None, params, backend="parallel", segment_layout="aligned")


@pytest.mark.parametrize("backend", ["parallel", "auto"])
def test_no_host_reads_with_resets(backend):
    params, x, h0, is_init, reset = make_case("rglru", 2, "random", seed=8)
    with HostReads() as reads:
        y, _ = rf.rglru_sequence(x, h0, params, is_init=is_init, reset_state=reset, backend=backend)
        y.sum().backward() if y.requires_grad else None
    assert reads.seen == []
    assert rf.sequence_route("rglru", x, params, is_init=is_init).backend == "parallel"


def test_outputs_do_not_alias_inputs_or_each_other():
    params, x, h0, is_init, reset = make_case("min_gru", 1, "none", seed=9)
    y, h = rf.min_gru_sequence(x, h0, params, backend="parallel")
    assert y.untyped_storage().data_ptr() != h.untyped_storage().data_ptr()
    assert all(t.untyped_storage().data_ptr() != x.untyped_storage().data_ptr() for t in (y, h))
