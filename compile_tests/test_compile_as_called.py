"""torch.compile as users call it: ``torch.compile(f)`` with no arguments, and the options they add.

The other contract tests pass ``fullgraph=True``, which hid a failure of every default compile:
Inductor lowers ``scan`` to a ``while_loop`` whose index is read with ``.item()``, and Dynamo's
shape environment allows that only for ``fullgraph=True`` (see ``backends/scan_parts.py``,
``_scan``). Here the functions and modules are compiled with the configurations
users write (defaults; ``fullgraph``; ``dynamic`` True/False/None; ``max-autotune-no-cudagraphs``;
``aot_eager``; ``reduce-overhead`` on CUDA; compiled autograd), under grad, ``no_grad`` and ``inference_mode``, and
compared with the eager call on outputs and gradients. ``capture_scalar_outputs`` is False in
every test (``conftest.py``), as in a process where TorchRL never built a ``scan`` module.

Inductor compiles take seconds each on CI's cores, so the long tail of the matrix runs one
representative per configuration (the GRU with interior resets); every cell and every module
backend runs under the default ``torch.compile``. Float32 tolerances: ``FP32_TOL`` (see
``compile_helpers``).
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from tensordict import TensorDict

import rnn_functional as rf
from compile_helpers import FAST, FP32_TOL, SEQUENCE, STEP, compile_stats, hidden_keys, reset_mask

B, T, F_IN, H = 3, 6, 4, 5
GRAD_MODES = {"grad": contextlib.nullcontext, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="mode='reduce-overhead' needs CUDA graphs")
TRITON = pytest.mark.skipif("triton" not in rf.available_backends(torch.device("cpu")),
                            reason="triton needs CUDA or TRITON_INTERPRET=1")

# the configurations users write; "default" is torch.compile(f)
CONFIGS = {
    "default": {},
    "fullgraph": {"fullgraph": True},
    "dynamic-true": {"dynamic": True},
    "dynamic-false": {"dynamic": False},
    "dynamic-none": {"dynamic": None},
    "max-autotune-no-cudagraphs": {"mode": "max-autotune-no-cudagraphs"},
    "aot_eager": {"backend": "aot_eager"},
}


def _params(cell: str, requires_grad: bool = True) -> TensorDict:
    g = torch.Generator().manual_seed(0)
    init = {"lstm": rf.init_lstm_params, "gru": rf.init_gru_params, "norm_gru": rf.init_norm_gru_params}[cell]
    params = init(F_IN, H, generator=g)
    return params.apply(lambda t: t.detach().requires_grad_(requires_grad))


def _sequence_inputs(batch: int = B, seed: int = 0):
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, T, F_IN, generator=g)
    is_init = reset_mask(batch, T, seed)
    assert is_init[:, 1:].any(), "the inputs must hold interior resets"
    return x, is_init


def _first(state):
    return state[0] if isinstance(state, tuple) else state


def _loss_and_grads(fn, x, is_init, params, grad: bool):
    """``fn(x, is_init, params) -> (y, h_T)``; with ``grad``, also the grads of a loss wrt x and the params."""
    x = x.clone().requires_grad_(grad)
    y, h = fn(x, is_init, params)
    if not grad:
        return (y, h), ()
    loss = (y * torch.linspace(-1, 1, y.shape[-1])).sum() + h.pow(2).sum()
    return (y.detach(), h.detach()), torch.autograd.grad(loss, [x, *params.values()])


def _check(fn, cell: str, config: dict, grad_mode: str, x=None, is_init=None) -> int:
    """Compiled ``fn`` (a user function of x, is_init, params) equals eager on outputs (and grads under
    grad). Returns the number of graphs compiled (graph breaks add graphs)."""
    grad = grad_mode == "grad"
    params = _params(cell, requires_grad=grad)
    if x is None:
        x, is_init = _sequence_inputs()
    with GRAD_MODES[grad_mode]():
        want, want_grads = _loss_and_grads(fn, x, is_init, params, grad)
    compiled = torch.compile(fn, **config)
    with compile_stats() as stats, GRAD_MODES[grad_mode]():
        got, got_grads = _loss_and_grads(compiled, x, is_init, params, grad)
    for a, b in zip((*got, *got_grads), (*want, *want_grads)):
        torch.testing.assert_close(a, b, **FP32_TOL)
    assert stats.breaks == 0, f"graph breaks under {config}: {stats}"
    return stats.graphs


def _user_sequence(cell: str, backend: str = "auto"):
    def fn(x, is_init, params):
        y, state = SEQUENCE[cell](x, None, params, is_init=is_init, backend=backend)
        return y, _first(state)

    return fn


def _user_step_loop(cell: str):
    """A user's own loop of step calls, resets through ``is_init`` (acting code)."""

    def fn(x, is_init, params):
        state, ys = None, []
        for t in range(x.shape[1]):
            y, state = STEP[cell](x[:, t], state, params, is_init=is_init[:, t])
            ys.append(y)
        return torch.stack(ys, 1), _first(state)

    return fn


# ----------------------------------------------------------------------------- functions


@pytest.mark.parametrize("cell", ["lstm", "gru", "norm_gru"])
def test_default_compile_sequence_every_cell(cell):
    """``torch.compile(f)`` with no arguments, forward and backward, one graph, equal to eager."""
    assert _check(_user_sequence(cell), cell, {}, "grad") == 1


@pytest.mark.parametrize("cell", ["lstm", "gru", "norm_gru"])
def test_default_compile_step_every_cell(cell):
    """The loop is unrolled into the graph, so its compile grows with T: three steps hold interior resets."""
    x, is_init = _sequence_inputs()
    x, is_init = x[:, :3], is_init[:, :3]
    assert is_init[:, 1:].any()
    assert _check(_user_step_loop(cell), cell, {}, "grad", x, is_init) == 1


# (configuration, grad mode) pairs. Left out, as the same compile as a case run elsewhere: "dynamic-none" is the
# default (test_default_compile_sequence_every_cell under grad, test_default_compile_module_grad_modes under
# inference_mode); "fullgraph" under grad is test_compile_functional.py::test_sequence_inductor_fp32[gru-L1]; one
# call of "dynamic-false" compiles the default's graph, run under grad here; "max-autotune-no-cudagraphs" runs
# under grad, a forward and a backward (inference_mode would compile a forward alone).
CONFIG_CASES = [("fullgraph", "inference_mode"), ("dynamic-true", "grad"), ("dynamic-true", "inference_mode"),
                ("dynamic-false", "grad"), ("max-autotune-no-cudagraphs", "grad"), ("aot_eager", "grad"),
                ("aot_eager", "inference_mode")]


@pytest.mark.parametrize(("config", "grad_mode"), [pytest.param(CONFIGS[c], m, id=f"{c}-{m}") for c, m in CONFIG_CASES])
def test_configurations(config, grad_mode):
    """One representative (GRU sequence with interior resets) per configuration and grad mode."""
    assert _check(_user_sequence("gru"), "gru", config, grad_mode) == 1


FUNC_CELLS = {
    "lstm": (rf.init_lstm_params, rf.lstm_sequence), "gru": (rf.init_gru_params, rf.gru_sequence),
    "norm_gru": (rf.init_norm_gru_params, rf.norm_gru_sequence),
    "block_gru": (lambda f, h, **kw: rf.init_block_gru_params(f, h, projection_size=4, num_blocks=h, **kw),
                  rf.block_gru_sequence),
    "min_gru": (rf.init_min_gru_params, rf.min_gru_sequence),
}


@pytest.mark.parametrize("transform", ["grad", "vmap(grad)"])
@pytest.mark.parametrize("cell", list(FUNC_CELLS))
def test_compiled_torch_func_grad(cell, transform):
    """``torch.compile(torch.func.grad(loss))`` and ``torch.compile(torch.vmap(torch.func.grad(loss)))`` (per-sample
    gradients), ``fullgraph=True``, ``scan`` and ``auto``: equal to the eager ``reference`` transform. torch's
    ``scan`` could not be traced under ``grad`` ("Expected FakeTensor"), nor the hand-written layer under
    ``vmap(grad)``; there the loop is unrolled (``scan_parts.traced_under_grad``). Those were tracing failures,
    which ``aot_eager`` shows; the LSTM runs the default compiler (Inductor) on both transforms."""
    init, sequence = FUNC_CELLS[cell]
    params = init(F_IN, H, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    x, is_init = _sequence_inputs(batch=2)
    x = x.double()

    def transformed(backend):
        def loss(xx):
            mask = is_init if xx.ndim == 3 else is_init[0]
            return sequence(xx, None, params, is_init=mask, backend=backend)[0].pow(2).sum()
        return torch.func.grad(loss) if transform == "grad" else torch.vmap(torch.func.grad(loss))

    want = transformed("reference")(x)
    compiler = "inductor" if cell == "lstm" else FAST
    for backend in ("scan", "auto"):
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(transformed(backend), fullgraph=True, backend=compiler)(x), want)


COMPILED_AUTOGRAD_CASES = [*((cell, "auto") for cell in FUNC_CELLS), ("gru", "pad"),
                           pytest.param("lstm", "triton", marks=TRITON)]


@pytest.mark.parametrize(("cell", "backend"), COMPILED_AUTOGRAD_CASES)
def test_compiled_autograd_train_step(cell, backend):
    """A compiled training step, ``loss.backward()`` inside, with ``torch._dynamo.config.compiled_autograd``: it traces
    the backward graph, which cannot hold a ``scan`` (torch's own autograd of ``scan`` fails there too), so ``auto``
    and ``pad`` run ``reference``'s loop; every parameter's gradient equals eager (fp64, defaults)."""
    init, sequence = FUNC_CELLS[cell]
    params = init(F_IN, H, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    params = {k: v.detach().requires_grad_() for k, v in params.items()}
    x, is_init = _sequence_inputs(batch=2)
    x = x.double()

    def train(params, x):
        loss = sequence(x, None, params, is_init=is_init, backend=backend)[0].pow(2).sum()
        loss.backward()
        return loss.detach()

    want = train(params, x)
    want_grads = {k: v.grad for k, v in params.items()}
    for v in params.values():
        v.grad = None
    with torch._dynamo.config.patch(compiled_autograd=True):
        got = torch.compile(train, backend=FAST)(params, x)
    torch.testing.assert_close(got, want)
    for k, v in params.items():
        torch.testing.assert_close(v.grad, want_grads[k])


def test_compiled_autograd_refuses_scan():
    """A named ``scan`` says it cannot serve compiled autograd and names what can; without grad it still runs."""
    params = _params("gru")
    x, is_init = _sequence_inputs()

    def train(params, x):
        loss = rf.gru_sequence(x, None, params, is_init=is_init, backend="scan")[0].sum()
        loss.backward()
        return loss

    with torch._dynamo.config.patch(compiled_autograd=True):
        with pytest.raises(ValueError, match=r"backend 'scan' cannot serve torch's compiled autograd.*'reference'"):
            torch.compile(train, backend=FAST)(params, x)
        with torch.no_grad():
            got = torch.compile(_user_sequence("gru", "scan"), backend=FAST)(x, is_init, params)
    torch.testing.assert_close(got, _user_sequence("gru", "reference")(x, is_init, params), **FP32_TOL)


def test_compiled_autograd_module_and_ensemble_train_step():
    """TorchRL's way of training a recurrent policy with compiled autograd (its modules run there): our modules in
    recurrent mode and a vmapped ensemble, one compiled step each with ``backward()`` inside, equal to eager."""
    module = _module("lstm", "auto")
    ens = rf.EnsembleModule(_module("gru", "auto"), 3, generator=torch.Generator().manual_seed(0))
    td = _module_input("lstm", (B, T), reset_mask(B, T)).exclude("recurrent_state_h", "recurrent_state_c")
    for net, params in ((module, list(module.parameters())), (ens, list(ens.params.values(True, True)))):
        def train(td):
            out = net(td.clone())["feat"]
            (out * torch.linspace(-1, 1, H)).sum().backward()
            return out.detach()

        want = train(td)
        want_grads = [p.grad.clone() for p in params]
        for p in params:
            p.grad = None
        torch._dynamo.reset()
        with torch._dynamo.config.patch(compiled_autograd=True):
            got = torch.compile(train, backend=FAST)(td)
        torch.testing.assert_close(got, want, **FP32_TOL)
        for p, w in zip(params, want_grads, strict=True):
            torch.testing.assert_close(p.grad, w, **FP32_TOL)


@CUDA
@pytest.mark.gpu
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_reduce_overhead_cuda(cell):
    params = _params(cell, requires_grad=False).to("cuda")
    x, is_init = (t.to("cuda") for t in _sequence_inputs())
    fn = _user_sequence(cell)
    compiled = torch.compile(fn, mode="reduce-overhead")
    with torch.inference_mode():
        want = fn(x, is_init, params)
        for _ in range(3):  # recorded, then replayed from the CUDA graph
            got = compiled(x, is_init, params)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **FP32_TOL)


def test_recompiles_stay_bounded():
    """Default ``torch.compile``: new values and reset patterns reuse the graph; a second batch size
    compiles once more (automatic dynamic shapes), later batch sizes reuse that dynamic graph."""
    fn = torch.compile(_user_sequence("gru"))
    params = _params("gru", requires_grad=False)
    with compile_stats() as same_shape, torch.no_grad():
        for seed in range(3):  # same shapes, other values and other resets
            fn(*_sequence_inputs(seed=seed), params)
    with compile_stats() as new_batch, torch.no_grad():
        for batch in (5, 7, 9):
            x, is_init = _sequence_inputs(batch)
            torch.testing.assert_close(fn(x, is_init, params)[0], _user_sequence("gru")(x, is_init, params)[0],
                                       **FP32_TOL)
    assert (same_shape.graphs, new_batch.graphs) == (1, 1), (same_shape, new_batch)


# ----------------------------------------------------------------------------- modules


def _module(cell: str, backend: str, recurrent: bool = True):
    torch.manual_seed(0)
    cls = rf.LSTMModule if cell == "lstm" else rf.GRUModule
    return cls(input_size=F_IN, hidden_size=H, in_key="obs", out_key="feat", recurrent_backend=backend,
               default_recurrent_mode=recurrent)


def _module_input(cell: str, shape: tuple, is_init: torch.Tensor) -> TensorDict:
    g = torch.Generator().manual_seed(3)
    data = {"obs": torch.randn(*shape, F_IN, generator=g), "is_init": is_init.reshape(*shape, 1)}
    data.update({k: torch.randn(*shape, 1, H, generator=g) for k in hidden_keys(cell)})
    return TensorDict(data, batch_size=shape)


def _module_outputs(module, td: TensorDict, grad: bool):
    out = module(td.clone())
    keys = ["feat", *(("next", k) for k in out["next"].keys())]
    outs = [out[k] for k in keys]
    if not grad:
        return outs, ()
    loss = sum((o * (i + 1)).sum() for i, o in enumerate(outs))
    return [o.detach() for o in outs], torch.autograd.grad(loss, list(module.parameters()))


def _check_module(cell: str, backend: str, grad_mode: str, layout: str = "batch", config: dict | None = None):
    module = _module(cell, backend, recurrent=layout != "step")
    if layout == "step":
        td = _module_input(cell, (B,), torch.tensor([True, False, True]))
    else:
        td = _module_input(cell, (B, T), reset_mask(B, T))
        if layout == "flat":  # SliceSampler's layout: trajectories along the only batch dim
            td = td.reshape(-1)
    grad = grad_mode == "grad"
    with GRAD_MODES[grad_mode]():
        want, want_grads = _module_outputs(module, td, grad)
    compiled = torch.compile(module, **(config or {}))
    with compile_stats() as stats, GRAD_MODES[grad_mode]():
        got, got_grads = _module_outputs(compiled, td, grad)
    for a, b in zip((*got, *got_grads), (*want, *want_grads)):
        torch.testing.assert_close(a, b, **FP32_TOL)
    assert stats.breaks == 0 and stats.graphs == 1, stats


MODULE_BACKEND_CASES = [*(("lstm", b) for b in ("auto", "scan", "pad", "reference")), ("gru", "reference"),
                        pytest.param("lstm", "triton", marks=TRITON), pytest.param("gru", "triton", marks=TRITON)]


@pytest.mark.parametrize(("cell", "backend"), MODULE_BACKEND_CASES)
def test_default_compile_module_recurrent_every_backend(cell, backend):
    """The issue's failing call: ``torch.compile(module)`` in recurrent mode with resets, under no_grad. Every backend
    with the LSTM; the GRU where its compiled code is its own (``reference``'s loop, its Triton kernel): under
    compile ``auto`` and ``pad`` run ``scan``, whose GRU graph test_default_compile_module_grad_modes compiles."""
    _check_module(cell, backend, "no_grad")


# no_grad: test_default_compile_module_recurrent_every_backend; the LSTM module under grad in recurrent mode: its
# flat layout below and test_compile_policy.py::test_policy_inductor[batch] (fullgraph)
@pytest.mark.parametrize(("cell", "grad_mode"), [("gru", "grad"), ("lstm", "inference_mode")])
def test_default_compile_module_grad_modes(cell, grad_mode):
    _check_module(cell, "auto", grad_mode)


# sequential mode (one env step, no scan: the default compile is fullgraph's) under Inductor with grad:
# test_compile_policy.py::test_policy_inductor[step]
@pytest.mark.parametrize("layout", ["flat"])
def test_default_compile_module_layouts(layout):
    """A flat ``SliceSampler``-style batch in recurrent mode."""
    _check_module("lstm", "auto", "grad", layout)


def test_default_compile_ensemble_module_fwd_bwd():
    """``torch.compile(EnsembleModule(GRUModule, 3))`` in recurrent mode: the vmapped members' layer (a ``scan``
    inside the ensemble op), forward and backward, equal to the eager ensemble."""
    ens = rf.EnsembleModule(_module("gru", "auto"), 3, generator=torch.Generator().manual_seed(0))
    td = _module_input("gru", (B, T), reset_mask(B, T))
    params = list(ens.params.values(True, True))

    def run(module):
        out = module(td.clone())["feat"]
        return out.detach(), torch.autograd.grad((out * out.detach().sign()).sum(), params)

    want, want_grads = run(ens)
    with compile_stats() as stats:
        got, got_grads = run(torch.compile(ens))
    assert stats.breaks == 0, stats  # (the ensemble op's scans are compiled as graphs of their own)
    for a, b in zip((got, *got_grads), (want, *want_grads), strict=True):
        torch.testing.assert_close(a, b, **FP32_TOL)


def test_default_compile_lstm_net():
    torch.manual_seed(0)
    net = rf.LSTMNet(2, {"input_size": 6, "hidden_size": H}, {"in_features": F_IN, "out_features": 6})
    x = torch.randn(B, T, F_IN, generator=torch.Generator().manual_seed(2))
    want = net(x)
    with compile_stats() as stats:
        got = torch.compile(net)(x)
    assert stats.breaks == 0, stats
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, **FP32_TOL)
