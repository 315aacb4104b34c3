"""Higher-order and forward-mode derivatives: exact on every backend that accepts them, a clear refusal elsewhere.

``gradgradcheck`` / ``gradcheck(check_forward_ad=True)`` compare against finite differences in fp64 on small
calls with interior resets, an initial state and ``reset_state``; every differentiable input is checked
(``x``, the state, ``reset_state`` and every parameter).
"""

from __future__ import annotations

import ast
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torch.autograd import gradcheck, gradgradcheck

import rnn_functional as rf

N, T, F_IN, H = 2, 4, 3, 2
triton = pytest.mark.skipif(not rf.backends.triton_backend.is_available("cpu"),
                            reason="triton runs on CPU only under TRITON_INTERPRET=1")
SEQUENCE = {"lstm": (rf.init_lstm_params, rf.lstm_sequence, rf.lstm_step, 2),
            "gru": (rf.init_gru_params, rf.gru_sequence, rf.gru_step, 1),
            "norm_gru": (rf.init_norm_gru_params, rf.norm_gru_sequence, rf.norm_gru_step, 1)}
# the cells' other sequence functions: linear recurrences (``parallel``) and the block GRU (no ``pad``)
OTHER_SEQUENCE = {"min_gru": (rf.init_min_gru_params, rf.min_gru_sequence, rf.min_gru_step, 1),
                  "rglru": (rf.init_rglru_params, rf.rglru_sequence, rf.rglru_step, 1),
                  "block_gru": (lambda f, h, **k: rf.init_block_gru_params(f, h, projection_size=3, num_blocks=2, **k),
                                rf.block_gru_sequence, rf.block_gru_step, 1)}
# (backend, recompute) pairs that accept a call with autograd; pad has no recompute and no layer-norm GRU kernel
SEQUENCE_PATHS = [("reference", "none"), ("reference", "full"), ("scan", "none"), ("scan", "full"), ("pad", "none"),
                  ("auto", "none"), ("auto", "full")]


def _problem(cell: str, seed: int = 0, t_len: int = T):
    """``(call, inputs)``: ``call(*inputs)`` runs a sequence with resets and returns ``(y, *final state)``."""
    init, _, _, parts = {**SEQUENCE, **OTHER_SEQUENCE}[cell]
    g = torch.Generator().manual_seed(seed)
    params = init(F_IN, H, dtype=torch.float64, generator=g)
    names = list(params.keys())
    x = torch.randn(N, t_len, F_IN, generator=g, dtype=torch.float64)
    state = [torch.randn(N, 1, H, generator=g, dtype=torch.float64) for _ in range(parts)]
    reset = [torch.randn(N, t_len, 1, H, generator=g, dtype=torch.float64) for _ in range(parts)]
    is_init = torch.zeros(N, t_len, dtype=torch.bool)
    is_init[0, 2] = is_init[1, 1] = is_init[1, 3] = True  # interior resets in both rows
    pack = (lambda ts: tuple(ts)) if parts == 2 else (lambda ts: ts[0])

    def call(backend: str, recompute: str):
        def fn(x, *rest):
            st, rs, ps = rest[:parts], rest[parts : 2 * parts], rest[2 * parts :]
            y, final = {**SEQUENCE, **OTHER_SEQUENCE}[cell][1](x, pack(st), TensorDict(dict(zip(names, ps)), []), is_init=is_init,
                                         reset_state=pack(rs), backend=backend, recompute=recompute)
            return (y, *(final if parts == 2 else (final,)))
        return fn

    inputs = tuple(t.requires_grad_(True) for t in (x, *state, *reset, *params.values()))
    return call, inputs


def _serves(cell: str, backend: str) -> bool:
    return not (backend == "pad" and cell == "norm_gru")


# auto runs one of the named backends (its choice does not depend on create_graph), whose double backward is checked
@pytest.mark.parametrize("cell", list(SEQUENCE))
@pytest.mark.parametrize("backend,recompute", [p for p in SEQUENCE_PATHS if p[0] != "auto"])
def test_sequence_double_backward_is_exact(cell, backend, recompute):
    if not _serves(cell, backend):
        pytest.skip("pad has no layer-norm GRU kernel (its refusal is tested in test_errors)")
    call, inputs = _problem(cell)
    assert gradgradcheck(call(backend, recompute), inputs)


@pytest.mark.parametrize("hooks", ["save_on_cpu", "saved_tensors_hooks"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("backend,recompute", [*SEQUENCE_PATHS, ("triton", "none"), ("triton", "full")])
def test_gradient_penalty_under_saved_tensor_hooks_is_exact(backend, recompute, cell, hooks):
    """A gradient penalty (``create_graph=True``) with saved-tensor hooks around the forward and both backwards
    (``save_on_cpu``, as activation offloading wraps a training step) equals ``reference`` without hooks. The
    higher-order backward of ``scan`` and ``triton`` replayed the forward through ``torch.func.vjp``, which refuses
    saved-tensor hooks: "torch.func... don't yet support saved tensor hooks", though the call used no torch.func."""
    if backend == "triton" and not rf.backends.triton_backend.is_available("cpu"):
        pytest.skip("triton is not installed (or TRITON_INTERPRET is unset)")
    call, inputs = _problem(cell)
    packed = []
    context = torch.autograd.graph.save_on_cpu if hooks == "save_on_cpu" else (
        lambda: torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(1) or t.clone(), lambda t: t))

    def penalty(backend, recompute):
        y = call(backend, recompute)(*inputs)[0]
        (gx,) = torch.autograd.grad(y.pow(2).sum(), inputs[0], create_graph=True)
        return torch.autograd.grad(gx.pow(2).sum(), inputs[1:])

    with context():
        got = penalty(backend, recompute)
    want = penalty("reference", "none")
    assert hooks == "save_on_cpu" or packed, "the hooks packed nothing"
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, msg=lambda m, i=i: f"gradient of input {i + 1}: {m}")


@pytest.mark.parametrize("cell", list(SEQUENCE))
@pytest.mark.parametrize("backend,recompute", [p for p in SEQUENCE_PATHS if p != ("reference", "full")])
def test_sequence_forward_mode_is_exact(cell, backend, recompute):
    """Dual tensors (``forward_ad``) against finite differences, then ``torch.func.jvp`` against the same
    directional derivative from reverse mode on ``reference``."""
    if not _serves(cell, backend):
        pytest.skip("pad has no layer-norm GRU kernel")
    call, inputs = _problem(cell)
    fn = call(backend, recompute)
    assert gradcheck(fn, inputs, check_forward_ad=True, check_backward_ad=False, check_undefined_grad=False,
                     check_batched_grad=False)
    tangents = tuple(torch.randn_like(t) for t in inputs)
    primals = tuple(t.detach() for t in inputs)
    out, jvp_out = torch.func.jvp(fn, primals, tangents)
    want_out = call("reference", "none")(*inputs)
    # reverse mode's J^T u, contracted with the tangents: <u, J v> for random u
    u = tuple(torch.randn_like(o) for o in want_out)
    grads = torch.autograd.grad(want_out, inputs, u)
    torch.testing.assert_close(sum((a * b).sum() for a, b in zip(u, jvp_out)),
                               sum((g * v).sum() for g, v in zip(grads, tangents)))
    for got, want in zip(out, want_out):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("cell", [*SEQUENCE, *OTHER_SEQUENCE])
# every named backend (auto runs one of them: its eager choice does not depend on a batched backward)
@pytest.mark.parametrize("backend,recompute", [("reference", "none"), ("scan", "none"), ("scan", "full"),
                                               ("pad", "none"), ("parallel", "none")])
@pytest.mark.parametrize("t_len", [T, 5])
def test_batched_backward_is_exact(cell, backend, recompute, t_len):
    """A batched backward (``torch.autograd.grad(..., is_grads_batched=True)``, as ``jacobian(vectorize=True)`` and
    ``gradcheck(check_batched_grad=True)`` run it) equals one backward per cotangent: torch's legacy vmap runs
    the backends' hand-written backwards, where ``flatten``/``unflatten``, ``out=`` writes and aliases (a slice
    over a whole dim: T=5, whose backward scan of 4 steps is one whole chunked span) have no batching rule."""
    if backend not in rf.available_backends(cell=cell):
        pytest.skip(f"{backend} does not serve {cell}")
    call, inputs = _problem(cell, seed=2, t_len=t_len)
    assert gradcheck(call(backend, recompute), inputs, check_batched_grad=True, check_undefined_grad=False)


def test_reference_full_refuses_torch_func_clearly():
    call, inputs = _problem("gru")
    with pytest.raises(ValueError, match="backend 'reference' cannot serve recompute='full' under an eager torch.func"):
        torch.func.jvp(call("reference", "full"), tuple(t.detach() for t in inputs),
                       tuple(torch.ones_like(t) for t in inputs))


@pytest.mark.parametrize("cell", list(SEQUENCE))
def test_hessian_vector_product_through_scan_matches_reference(cell):
    """The issue's probe: ``grad(grad(y).pow(2).sum(), weight)`` with ``create_graph=True``, scan vs reference."""
    call, inputs = _problem(cell, seed=3)

    def second_order(backend):
        y = call(backend, "none")(*inputs)[0]
        (gx,) = torch.autograd.grad(y.pow(2).sum(), inputs[0], create_graph=True)
        return torch.autograd.grad(gx.pow(2).sum(), inputs[-1])[0]

    torch.testing.assert_close(second_order("scan"), second_order("reference"))


@pytest.mark.parametrize("cell", list(SEQUENCE))
@pytest.mark.parametrize("backend", ["reference", "pad", "auto"])
def test_step_double_backward_and_forward_mode_are_exact(cell, backend):
    if not _serves(cell, backend):
        pytest.skip("pad has no layer-norm GRU kernel")
    init, _, step, parts = SEQUENCE[cell]
    g = torch.Generator().manual_seed(1)
    params = init(F_IN, H, dtype=torch.float64, generator=g)
    names = list(params.keys())
    x = torch.randn(N, F_IN, generator=g, dtype=torch.float64)
    state = [torch.randn(N, 1, H, generator=g, dtype=torch.float64) for _ in range(parts)]
    is_init = torch.tensor([True, False])

    def fn(x, *rest):
        st, ps = rest[:parts], rest[parts:]
        y, new = step(x, tuple(st) if parts == 2 else st[0], TensorDict(dict(zip(names, ps)), []), is_init=is_init,
                      backend=backend)
        return (y, *(new if parts == 2 else (new,)))

    inputs = tuple(t.requires_grad_(True) for t in (x, *state, *params.values()))
    assert gradgradcheck(fn, inputs)
    assert gradcheck(fn, inputs, check_forward_ad=True, check_backward_ad=False, check_undefined_grad=False,
                     check_batched_grad=False)


@pytest.mark.parametrize("backend", ["auto", "scan"])
def test_gru_module_second_order_is_exact(backend):
    """A ``GRUModule`` in recurrent mode (default ``auto``: the cost table picks ``scan`` here) against ``reference``."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    b, t = 16, 48
    is_init = torch.rand(b, t, 1, generator=g) < 0.05
    is_init[:, 0] = True
    data = TensorDict({"x": torch.randn(b, t, F_IN, dtype=torch.float64), "h": torch.zeros(b, t, 1, H, dtype=torch.float64),
                       "is_init": is_init}, [b, t])
    base = rf.GRUModule(F_IN, H, in_keys=["x", "h"], out_keys=["y", ("next", "h")], recurrent_backend=backend).double()
    pinned = rf.GRUModule(gru=base.gru, in_keys=["x", "h"], out_keys=["y", ("next", "h")], recurrent_backend="reference")

    def second_order(module):
        x = data["x"].clone().requires_grad_(True)
        with rf.set_recurrent_mode(True):
            y = module(data.clone(False).set("x", x))["y"]
        (gx,) = torch.autograd.grad(y.pow(2).sum(), x, create_graph=True)
        return torch.autograd.grad(gx.pow(2).sum(), base.gru.weight_hh_l0)[0]

    torch.testing.assert_close(second_order(base), second_order(pinned))


# ----------------------------------------------------------------------------- triton



@triton
@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_triton_double_backward_is_exact(cell, recompute):
    """The fused kernels' backward, when a graph is requested, replays the plain-op reference of the kernels'
    math (``ops.layer_ref``): second order against finite differences, every input."""
    call, inputs = _problem(cell)
    assert gradgradcheck(call("triton", recompute), inputs, fast_mode=True)  # the interpreter is slow: one random projection


@triton
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_triton_refuses_forward_mode(cell):
    call, inputs = _problem(cell)
    fn = call("triton", "none")
    primals = tuple(t.detach() for t in inputs)
    tangents = tuple(torch.ones_like(t) for t in inputs)
    with pytest.raises(ValueError, match=re.escape("reverse-mode backward only. Use one of ['reference', 'scan', 'pad']")):
        torch.func.jvp(fn, primals, tangents)
    with torch.autograd.forward_ad.dual_level(), pytest.raises(ValueError, match="backend 'triton' cannot serve"):
        fn(torch.autograd.forward_ad.make_dual(primals[0], tangents[0]), *primals[1:])
    step = SEQUENCE[cell][2]
    params = rf.init_gru_params(F_IN, H, dtype=torch.float64) if cell == "gru" else rf.init_lstm_params(F_IN, H, dtype=torch.float64)
    with pytest.raises(ValueError, match=re.escape("Use one of ['reference', 'pad'] (exact")):  # no 'scan' for a step
        torch.func.jvp(lambda x: step(x, None, params, backend="triton")[0], (primals[0][:, 0],), (tangents[0][:, 0],))


@triton
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_triton_refuses_torch_func_reverse_mode_and_names_the_fix(cell):
    """``torch.func.grad``/``vjp``/``jacrev`` (alone or with ``vmap``) cannot reach the kernels' registered backward
    (torch's wrapper lacks functorch's ``setup_context``): our error, naming the backends that serve them, not
    torch's; ``auto`` under the same transform takes one of those backends and equals ``reference``."""
    call, inputs = _problem(cell)
    x, *rest = (t.detach() for t in inputs)
    def loss_on(backend):
        return lambda xx: call(backend, "none")(xx, *rest)[0].pow(2).sum()

    loss = {b: loss_on(b) for b in ("triton", "auto", "reference")}
    refusal = re.escape("cannot serve torch.func's reverse-mode transforms (grad, vjp, jacrev)")
    f = loss["triton"]
    for run in (lambda: torch.func.grad(f)(x), lambda: torch.vmap(torch.func.grad(f))(x.unsqueeze(0)),
                lambda: torch.func.vjp(f, x), lambda: torch.func.jacrev(f)(x)):
        with pytest.raises(ValueError, match=refusal + ".*Use one of \\['reference', 'scan', 'pad'\\]"):
            run()
    torch.testing.assert_close(torch.func.grad(loss["auto"])(x), torch.func.grad(loss["reference"])(x))
    step = SEQUENCE[cell][2]
    params = rf.init_gru_params(F_IN, H, dtype=torch.float64) if cell == "gru" else rf.init_lstm_params(F_IN, H, dtype=torch.float64)
    with pytest.raises(ValueError, match=refusal + ".*Use one of \\['reference', 'pad'\\]"):  # no 'scan' for a step
        torch.func.grad(lambda xx: step(xx, None, params, backend="triton")[0].sum())(x[:, 0])


@pytest.mark.parametrize("backend", ["pad", "triton"])
def test_recompute_refusals_under_torch_func_name_backends_that_serve_it(backend):
    """``recompute='full'`` under ``torch.func.grad`` on a backend that refuses it: every backend the error suggests
    serves that very call (``reference``'s checkpointing and ``triton``'s autodiff cannot run there), and equals
    ``reference`` without recompute."""
    if backend == "triton" and not rf.backends.triton_backend.is_available("cpu"):
        pytest.skip("triton is not installed (or TRITON_INTERPRET is unset)")
    call, inputs = _problem("gru")
    x, *rest = (t.detach() for t in inputs)
    def loss(name, recompute="full"):
        return lambda xx: call(name, recompute)(xx, *rest)[0].pow(2).sum()

    with pytest.raises(ValueError, match=r"Use one of \[") as info:
        torch.func.grad(loss(backend))(x)
    suggested = re.search(r"Use one of (\[[^]]*\])", str(info.value)).group(1)
    assert suggested == "['scan']", str(info.value)
    for name in ast.literal_eval(suggested):  # the message's own list, each entry run as suggested
        torch.testing.assert_close(torch.func.grad(loss(name))(x), torch.func.grad(loss("reference", "none"))(x))


def test_compiled_double_backward_is_refused_by_torch():
    """Under ``torch.compile`` the backward is compiled once (AOTAutograd): a ``create_graph`` backward through it
    raises torch's own error rather than returning a first-order-only graph."""
    call, inputs = _problem("gru")
    fn = torch.compile(call("auto", "none"), backend="aot_eager")
    y = fn(*inputs)[0]
    with pytest.raises(RuntimeError, match="double backward"):
        (gx,) = torch.autograd.grad(y.pow(2).sum(), inputs[0], create_graph=True)
        torch.autograd.grad(gx.pow(2).sum(), inputs[-1])


@pytest.mark.parametrize("backend", ["reference", "scan", "pad", "auto"])
def test_torch_func_hessian_is_exact(backend):
    """``torch.func.hessian`` (forward over reverse) against ``torch.autograd.functional.hessian`` of ``reference``."""
    params = rf.init_gru_params(F_IN, H, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    x = torch.randn(1, 3, F_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    is_init = torch.tensor([[False, True, False]])

    def loss(b):
        return lambda xx: rf.gru_sequence(xx, None, params, is_init=is_init, backend=b)[0].pow(2).sum()

    torch.testing.assert_close(torch.func.hessian(loss(backend))(x),
                               torch.autograd.functional.hessian(loss("reference"), x))


@pytest.mark.parametrize("backend", ["scan", "auto", pytest.param("triton", marks=triton)])
def test_vmapped_ensemble_double_backward_is_exact(backend):
    """``torch.vmap`` over stacked members, then a ``create_graph`` backward: each member's second-order gradient."""
    members = [rf.init_gru_params(F_IN, H, dtype=torch.float64, generator=torch.Generator().manual_seed(e)) for e in range(2)]
    x = torch.randn(N, T, F_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    is_init = torch.zeros(N, T, dtype=torch.bool)
    is_init[0, 2] = True

    def second_order(params, run):
        y = run(params)
        (g,) = torch.autograd.grad(y.pow(2).sum(), params["weight_hh_l0"], create_graph=True)
        return torch.autograd.grad(g.pow(2).sum(), params["weight_ih_l0"])[0]

    stacked = rf.stack_params(members).apply(lambda t: t.detach().requires_grad_(True))
    got = second_order(stacked, lambda p: torch.vmap(
        lambda q: rf.gru_sequence(x, None, q, is_init=is_init, backend=backend)[0])(p))
    want = torch.stack([second_order(m.apply(lambda t: t.detach().requires_grad_(True)), lambda p: rf.gru_sequence(
        x, None, p, is_init=is_init, backend="reference")[0]) for m in members])
    torch.testing.assert_close(got, want)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cell=st.sampled_from(["lstm", "gru", "norm_gru"]), backend=st.sampled_from(["scan", "pad", "auto"]),
       recompute=st.sampled_from(["none", "full"]), resets=st.lists(st.booleans(), min_size=N * T, max_size=N * T),
       seed=st.integers(0, 2**16))
def test_hessian_vector_products_match_reference_on_any_reset_pattern(cell, backend, recompute, resets, seed):
    """A Hessian-vector product through every parameter and input (the double-backward of ``<y, u>`` along ``v``)
    equals ``reference``'s, whatever the reset pattern."""
    if backend == "pad" and (recompute == "full" or cell == "norm_gru"):
        return  # refused with a named error (tested in test_errors)
    init, sequence, _, parts = SEQUENCE[cell]
    g = torch.Generator().manual_seed(seed)
    params = init(F_IN, H, dtype=torch.float64, generator=g).apply(lambda t: t.requires_grad_(True))
    x = torch.randn(N, T, F_IN, generator=g, dtype=torch.float64, requires_grad=True)
    is_init = torch.tensor(resets).view(N, T)
    u = torch.randn(N, T, H, generator=g, dtype=torch.float64)
    leaves = [x, *params.values()]
    v = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in leaves]

    def hvp(b, r):
        y = sequence(x, None, params, is_init=is_init, backend=b, recompute=r)[0]
        grads = torch.autograd.grad((y * u).sum(), leaves, create_graph=True)
        return torch.autograd.grad(sum((gr * vv).sum() for gr, vv in zip(grads, v)), leaves)

    torch.testing.assert_close(hvp(backend, recompute), hvp("reference", "none"))
