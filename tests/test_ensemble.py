"""Ensembles: stacked params under ``torch.vmap`` equal a Python loop over the members.

Every sequence backend (``rf.available_backends()`` plus ``auto``) and every step backend,
shared (``in_dims=None``) and per-member (``in_dims=0``) inputs, with resets and
``reset_state``; outputs and gradients w.r.t. every input and every stacked parameter, in
fp64 with ``assert_close`` defaults. Also: nested vmap (ensemble x batch),
``torch.func.grad`` / ``vjp`` inside vmap, dropout under ``randomness=``, compiled vmap,
and the activation memory of shared inputs.
"""

from __future__ import annotations

import pytest
import torch
from helpers import CELLS, flat, pack_state, state_sizes
from torch._subclasses.fake_tensor import FakeTensor
from torch.autograd.graph import saved_tensors_hooks

import rnn_functional as rf
from rnn_functional import ensemble_init_gru_params, ensemble_init_lstm_params, stack_params, unstack_params

SEQ_BACKENDS = rf.available_backends(cell="gru") + ["auto"]
STEP_BACKENDS = ["reference", "auto"] + (["triton"] if "triton" in rf.available_backends() else [])
ENSEMBLE_INIT = {"lstm": ensemble_init_lstm_params, "gru": ensemble_init_gru_params}
B, T, F, H, L = 3, 5, 4, 5, 2


# ----------------------------------------------------------------------------- helpers


def _problem(cell: str, members: int, shared: bool, *, time: int = T, step: bool = False, seed: int = 0) -> dict:
    """Stacked params and inputs; per-member inputs carry a leading dim ``E``. All leaves require grad."""
    g = torch.Generator().manual_seed(seed)
    params = ENSEMBLE_INIT[cell](members, F, H, L, dtype=torch.float64, generator=g)
    lead = (B,) if shared else (members, B)
    tdim = () if step else (time,)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_(True)

    sizes = state_sizes(cell, H, 0)
    problem = {
        "cell": cell,
        "params": params.requires_grad_(True),
        "x": randn(*lead, *tdim, F),
        "state": pack_state(cell, [randn(*lead, L, s) for s in sizes]),
        "is_init": torch.rand(*lead, *tdim, generator=g) < 0.35,
        "reset_state": None if step else pack_state(cell, [randn(*lead, time, L, s) for s in sizes]),
    }
    problem["leaves"] = [problem["x"], *flat(problem["state"]), *(flat(problem["reset_state"]) if not step else []), *params.values()]
    return problem


def _member(value, e: int, shared: bool):
    """Member ``e``'s slice of a per-member input (a tensor or a state tuple)."""
    if value is None or shared:
        return value
    if isinstance(value, tuple):
        return tuple(v[e] for v in value)
    return value[e]


def _caller(problem: dict, backend: str, step: bool, **kwargs):
    fn = CELLS[problem["cell"]][1 if step else 2]
    if step:
        return lambda x, state, params, is_init: fn(x, state, params, is_init=is_init, backend=backend)
    return lambda x, state, params, is_init, reset: fn(
        x, state, params, is_init=is_init, reset_state=reset, backend=backend, **kwargs
    )


def _args(problem: dict, step: bool) -> tuple:
    base = (problem["x"], problem["state"], problem["params"], problem["is_init"])
    return base if step else base + (problem["reset_state"],)


def _grads(outs: list[torch.Tensor], leaves: list[torch.Tensor]) -> list[torch.Tensor]:
    """Gradients of a fixed random projection of ``outs`` (stacked over members) w.r.t. ``leaves``."""
    g = torch.Generator().manual_seed(7)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outs)
    return list(torch.autograd.grad(loss, leaves, allow_unused=True, materialize_grads=True))


def _vmapped(problem: dict, backend: str, shared: bool, step: bool = False, **kwargs):
    d = None if shared else 0
    args = _args(problem, step)
    in_dims = (d, d, 0) + (d,) * (len(args) - 3)
    return flat(torch.vmap(_caller(problem, backend, step, **kwargs), in_dims=in_dims)(*args))


def _looped(problem: dict, shared: bool, step: bool = False, **kwargs) -> list[torch.Tensor]:
    """The ground truth: one ``reference`` call per member, stacked."""
    members = problem["params"].batch_size[0]
    fn = _caller(problem, "reference", step, **kwargs)
    args = _args(problem, step)
    per_member = [
        flat(fn(*(_member(a, e, shared) if i != 2 else a[e] for i, a in enumerate(args)))) for e in range(members)
    ]
    return [torch.stack(parts) for parts in zip(*per_member)]


# ----------------------------------------------------------------------------- stack / unstack / init


def test_stack_unstack_roundtrip_and_gradients() -> None:
    members = [rf.init_lstm_params(F, H, L, proj_size=2, dtype=torch.float64) for _ in range(3)]
    stacked = stack_params(members)
    assert stacked.batch_size == torch.Size([3])
    assert stacked["weight_hr_l1"].shape == (3, 2, H)
    for original, back in zip(members, unstack_params(stacked)):
        assert set(back.keys()) == set(original.keys())
        for key in original.keys():
            torch.testing.assert_close(back[key], original[key], rtol=0, atol=0)
    # unstacked members are views: a gradient through member 1 lands in the stacked leaf's row 1
    stacked.requires_grad_(True)
    views = unstack_params(stacked)
    views[1]["bias_hh_l0"].sum().backward()
    grad = stacked["bias_hh_l0"].grad
    assert torch.equal(grad[1], torch.ones_like(grad[1])) and not grad[[0, 2]].any()


def test_ensemble_init_is_generator_aware_and_members_independent() -> None:
    stacked = ensemble_init_gru_params(3, F, H, L, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)
    expected = [rf.init_gru_params(F, H, L, dtype=torch.float64, generator=g) for _ in range(3)]
    for e, member in enumerate(unstack_params(stacked)):
        for key in member.keys():
            torch.testing.assert_close(member[key], expected[e][key], rtol=0, atol=0)
    w = stacked["weight_hh_l0"]
    assert not torch.equal(w[0], w[1]) and not torch.equal(w[1], w[2])
    lstm = ensemble_init_lstm_params(4, F, H, proj_size=2, bias=False, dtype=torch.float32)
    assert lstm.batch_size == torch.Size([4]) and lstm["weight_hr_l0"].shape == (4, 2, H)
    assert "bias_ih_l0" not in lstm.keys() and lstm["weight_ih_l0"].dtype == torch.float32


def test_stack_params_errors_name_the_problem() -> None:
    a = rf.init_gru_params(F, H)
    with pytest.raises(ValueError, match="at least one member"):
        stack_params([])
    with pytest.raises(TypeError, match=r"stack_params\(\[params\]\)"):
        stack_params(a)
    with pytest.raises(ValueError, match=r"params_list\[1\]: keys differ.*missing \['bias_hh_l0', 'bias_ih_l0'\]"):
        stack_params([a, rf.init_gru_params(F, H, bias=False)])
    with pytest.raises(ValueError, match=r"params_list\[1\]\['bias_hh_l0'\]: expected shape \[15\].*got shape \[18\]"):
        stack_params([a, rf.init_gru_params(F, H + 1)])
    with pytest.raises(ValueError, match="batch_size \\[E\\]"):
        unstack_params(a)
    with pytest.raises(ValueError, match="num_members: expected a positive int, got 0"):
        ensemble_init_gru_params(0, F, H)


# ----------------------------------------------------------------------------- vmap == loop


@pytest.mark.parametrize("backend", SEQ_BACKENDS)
@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("members,shared", [(1, True), (3, True), (3, False)], ids=["E1-shared", "E3-shared", "E3-per-member"])
def test_sequence_vmap_equals_loop(backend: str, cell: str, members: int, shared: bool) -> None:
    problem = _problem(cell, members, shared)
    got = _vmapped(problem, backend, shared, return_segment_states=True)
    expected = _looped(problem, shared, return_segment_states=True)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(_grads(got, problem["leaves"]), _grads(expected, problem["leaves"]))


@pytest.mark.parametrize("backend", STEP_BACKENDS)
@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("members,shared", [(1, False), (3, True), (3, False)], ids=["E1-per-member", "E3-shared", "E3-per-member"])
def test_step_vmap_equals_loop(backend: str, cell: str, members: int, shared: bool) -> None:
    problem = _problem(cell, members, shared, step=True)
    got = _vmapped(problem, backend, shared, step=True)
    expected = _looped(problem, shared, step=True)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(_grads(got, problem["leaves"]), _grads(expected, problem["leaves"]))


@pytest.mark.parametrize("backend", SEQ_BACKENDS)
def test_nested_vmap_ensemble_by_batch(backend: str) -> None:
    """vmap over members of a vmap over batch rows (each row is a ``*B = ()`` call) == the loop."""
    problem = _problem("gru", 3, shared=True)
    x, h, params, is_init, reset = _args(problem, step=False)
    seq = CELLS["gru"][2]

    def one_row(x_r, h_r, is_init_r, reset_r, p):
        return seq(x_r, h_r, p, is_init=is_init_r, reset_state=reset_r, backend=backend)

    per_row = torch.vmap(one_row, in_dims=(0, 0, 0, 0, None))
    got = flat(torch.vmap(per_row, in_dims=(None, None, None, None, 0))(x, h, is_init, reset, params))
    expected = _looped(problem, shared=True)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(_grads(got, problem["leaves"]), _grads(expected, problem["leaves"]))


# triton refuses torch.func.grad/vjp with our error (tests/test_higher_order.py, the vmapped calls included)
FUNC_BACKENDS = [b for b in SEQ_BACKENDS if b != "triton"]


@pytest.mark.parametrize("backend", FUNC_BACKENDS)
def test_func_grad_and_vjp_inside_vmap(backend: str) -> None:
    """Per-member ``torch.func.grad`` and ``torch.func.vjp`` under vmap == per-member autograd."""
    problem = _problem("lstm", 3, shared=True)
    x, state, params, is_init, reset = _args(problem, step=False)
    seq = CELLS["lstm"][2]
    ct = torch.randn(3, B, T, H, dtype=torch.float64, generator=torch.Generator().manual_seed(3))

    def output(p, x_in):
        return seq(x_in, state, p, is_init=is_init, reset_state=reset, backend=backend)[0]

    def loss(p, x_in, ct_e):
        return (output(p, x_in) * ct_e).sum()

    def member_vjp(p, ct_e):
        _, pullback = torch.func.vjp(output, p, x)
        return pullback(ct_e)

    grad_p = torch.vmap(torch.func.grad(loss), in_dims=(0, None, 0))(params.detach(), x.detach(), ct)
    vjp_p, vjp_x = torch.vmap(member_vjp)(params.detach(), ct)
    for e, member in enumerate(unstack_params(params)):
        keys = list(member.keys())
        expected = torch.autograd.grad(loss(member, x, ct[e]), [member[k] for k in keys] + [x])
        for key, g in zip(keys, expected):
            torch.testing.assert_close(grad_p[key][e], g)
            torch.testing.assert_close(vjp_p[key][e], g)
        torch.testing.assert_close(vjp_x[e], expected[-1])


@pytest.mark.parametrize("cell", ["lstm", "gru", "norm_gru"])
def test_scan_under_eager_func_grad_of_vmap_equals_loop(cell: str) -> None:
    """``torch.func.grad`` of a vmapped ensemble loss with eager ``scan`` (its Python time loop and
    hand-written backward) == autograd through a loop over the members on ``reference``."""
    g = torch.Generator().manual_seed(7)
    init, seq = {
        "lstm": (rf.init_lstm_params, rf.lstm_sequence),
        "gru": (rf.init_gru_params, rf.gru_sequence),
        "norm_gru": (rf.init_norm_gru_params, rf.norm_gru_sequence),
    }[cell]
    members = [init(F, H, L, dtype=torch.float64, generator=g) for _ in range(2)]
    stacked = stack_params(members)
    x = torch.randn(B, T, F, dtype=torch.float64, generator=g)
    is_init = torch.rand(B, T, generator=g) < 0.3

    def loss(p, backend):
        return seq(x, None, p, is_init=is_init, backend=backend)[0].sin().sum()

    grads = torch.func.grad(lambda p: torch.vmap(lambda q: loss(q, "scan"))(p).sum())(stacked)
    for e, member in enumerate(members):
        member = member.clone().requires_grad_(True)
        keys = list(member.keys())
        expected = torch.autograd.grad(loss(member, "reference"), [member[k] for k in keys])
        for key, want in zip(keys, expected):
            torch.testing.assert_close(grads[key][e], want)


# ----------------------------------------------------------------------------- dropout under vmap


@pytest.mark.parametrize("backend", ["auto"])
def test_dropout_between_layers_under_vmap_randomness(backend: str) -> None:
    """``randomness="different"``: each member draws its own masks; ``"same"``: one mask for all;
    the default ``"error"`` refuses random ops (torch's vmap rule)."""
    same_params = stack_params([rf.init_lstm_params(F, H, 3, dtype=torch.float64)] * 3)
    x = torch.randn(B, T, F, dtype=torch.float64)

    def run(p):
        return rf.lstm_sequence(x, None, p, backend=backend, dropout=0.5, training=True)[0]

    different = torch.vmap(run, randomness="different")(same_params)
    assert not torch.equal(different[0], different[1]) and not torch.equal(different[1], different[2])
    same = torch.vmap(run, randomness="same")(same_params)
    assert torch.equal(same[0], same[1]) and torch.equal(same[1], same[2])
    with pytest.raises(RuntimeError, match="randomness"):
        torch.vmap(run)(same_params)
    # training=False: dropout is off, members with equal params agree exactly even with "different"
    quiet = torch.vmap(
        lambda p: rf.lstm_sequence(x, None, p, backend=backend, dropout=0.5, training=False)[0], randomness="different"
    )(same_params)
    expected = rf.lstm_sequence(x, None, unstack_params(same_params)[0], backend="reference")[0]
    for e in range(3):
        torch.testing.assert_close(quiet[e], expected)


# ----------------------------------------------------------------------------- memory


def _saved_bytes(fn) -> int:
    """Bytes of the distinct storages autograd saves for backward while running ``fn``."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, FakeTensor):  # scan traces its step with fake tensors: no memory
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


@pytest.mark.parametrize("backend", ["auto"])
def test_shared_input_is_not_copied_per_member(backend: str) -> None:
    """An ensemble of E with a shared input costs at most E x one member's activations plus the
    input once. The input is made much larger than the activations (F >> H), so a per-member
    copy of it (E x its bytes) would break the bound by far."""
    members, batch, time, feat, hidden = 4, 2, 6, 256, 3
    x = torch.randn(batch, time, feat, dtype=torch.float64)
    params = ensemble_init_gru_params(members, feat, hidden, 2, dtype=torch.float64).requires_grad_(True)
    one = unstack_params(params.detach().clone())[0].requires_grad_(True)  # its own storage

    def run(p):
        return rf.gru_sequence(x, None, p, backend=backend)[0]

    single = _saved_bytes(lambda: run(one))
    ensemble = _saved_bytes(lambda: torch.vmap(run, in_dims=0)(params))
    x_bytes = x.untyped_storage().nbytes()
    assert single >= x_bytes  # the member saves its input for the weight gradient
    assert ensemble <= x_bytes + members * (single - x_bytes), (ensemble, single, x_bytes)


# ----------------------------------------------------------------------------- compile


def _graph_breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


def test_compiled_vmap_sequence_equals_eager_vmap() -> None:
    """torch.compile(torch.vmap(gru_sequence), fullgraph=True) == eager vmap, zero graph breaks.

    ``auto`` (``scan`` under compile), forward under ``no_grad`` (scan's own vmapped forward).
    Forward+backward (the ensemble layer) is tested in compile_tests/test_compile_ensemble_train.py."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    problem = _problem("gru", 2, shared=True, time=3)
    x, h, params, is_init, reset = _args(problem, step=False)

    def ensemble(x, h, params, is_init, reset):
        return torch.vmap(
            lambda p: rf.gru_sequence(x, h, p, is_init=is_init, reset_state=reset, ), in_dims=0
        )(params)

    with torch.no_grad():
        expected = flat(ensemble(x, h, params, is_init, reset))
        got = flat(torch.compile(ensemble, fullgraph=True)(x, h, params, is_init, reset))
    torch.testing.assert_close(got, expected)
    assert _graph_breaks() == 0


def test_compiled_vmap_step_equals_eager_vmap() -> None:
    """torch.compile(torch.vmap(lstm_step), fullgraph=True), per-member state, forward and
    backward == eager vmap, zero graph breaks. ``aot_eager``: vmap and autograd are traced before Inductor runs;
    Inductor compiles vmapped layers in compile_tests/test_compile_ensemble_train.py and LSTM steps in
    compile_tests/test_compile_as_called.py."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    problem = _problem("lstm", 3, shared=False, step=True)
    step = torch.vmap(lambda x, s, p, i: rf.lstm_step(x, s, p, is_init=i))
    args = _args(problem, step=True)
    got = flat(torch.compile(step, fullgraph=True, backend="aot_eager")(*args))
    expected = flat(step(*args))
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(_grads(got, problem["leaves"]), _grads(expected, problem["leaves"]))
    assert _graph_breaks() == 0
