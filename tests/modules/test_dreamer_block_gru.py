"""``rf.DreamerV3BlockGRUCell`` / ``rf.DreamerV3BlockGRU`` against TorchRL's modules of the same name.

Both are built in fp64 and share weights through ``load_state_dict`` (strict, both ways). TorchRL's
RMS norm upcasts to float32 (``value.float()``), which would cap an fp64 comparison at float32
precision; the autouse fixture patches ``torchrl.modules.models.model_based._dreamer_v3_rms_norm``
with the same formula in the input's dtype, so that the comparison holds at ``assert_close``'s fp64
defaults (``test_float32_matches_unpatched_torchrl`` compares against the unpatched TorchRL in fp32).
TorchRL's ``reference`` backend (a Python loop over its cell) is the oracle for every backend of ours.
"""

from __future__ import annotations

import pytest
import torch
from helpers import exec_as_module
from torch import nn

torchrl = pytest.importorskip("torchrl")
import torchrl.modules as trm  # noqa: E402
import torchrl.modules.models.model_based as mb  # noqa: E402

import rnn_functional as rf  # noqa: E402

F_IN, H, P, NB, B, T = 3, 8, 4, 2, 3, 5
ACTIVATIONS = [nn.SiLU, nn.Tanh, nn.ReLU]


def _rms_norm_in_dtype(value, weight, eps):
    return value * torch.rsqrt(value.square().mean(-1, keepdim=True) + eps) * weight


@pytest.fixture(autouse=True)
def _fp64_torchrl_rms_norm(request, monkeypatch):
    if "unpatched" not in request.node.name:
        monkeypatch.setattr(mb, "_dreamer_v3_rms_norm", _rms_norm_in_dtype)


def _kwargs(layers=1, act=nn.SiLU, **extra):
    return dict(projection_size=P, num_blocks=NB, num_layers=layers, activation_class=act, **extra)


def _perturb(module: nn.Module, seed: int = 0) -> None:
    """Non-trivial norm weights and biases (the init's ones/zeros would hide their gradients)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))


def make_pair(layers=1, act=nn.SiLU, backend="reference", seed=0, **extra):
    """``(ours, torchrl's)`` sequence modules in fp64 with the same weights (TorchRL's loaded into ours)."""
    torch.manual_seed(seed)
    theirs = trm.DreamerV3BlockGRU(F_IN, H, **_kwargs(layers, act, **extra)).double()
    _perturb(theirs, seed)
    ours = rf.DreamerV3BlockGRU(F_IN, H, **_kwargs(layers, act, **extra), recurrent_backend=backend).double()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    return ours, theirs


def make_inputs(seed=1, batch=B, time=T):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, time, F_IN, generator=g, dtype=torch.float64)
    h0 = torch.randn(batch, H, generator=g, dtype=torch.float64)
    is_init = torch.rand(batch, time, generator=g) < 0.35
    is_init[0, 0] = is_init[1, 2] = True
    return x, h0, is_init


def _loss(outputs, seed=7):
    g = torch.Generator().manual_seed(seed)
    return sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outputs)


def run_with_grads(module, x, h0, is_init, **kw):
    """Outputs and grads of a random-weighted loss wrt ``x``, ``h0`` and every parameter (a name -> grad dict)."""
    x = x.detach().requires_grad_(True)
    h0 = h0.detach().requires_grad_(True)
    out = module(x, h0, is_init, **kw) if is_init is not None else module(x, h0, **kw)
    named = dict(module.named_parameters())
    grads = torch.autograd.grad(_loss(out if isinstance(out, tuple) else (out,)), [x, h0, *named.values()])
    return out, grads[0], grads[1], dict(zip(named, grads[2:]))


# ----------------------------------------------------------------------------- state dicts


@pytest.mark.parametrize("layers", [1, 2])
def test_state_dict_keys_and_shapes_match_torchrl(layers: int) -> None:
    ours, theirs = make_pair(layers)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    assert isinstance(ours.cell, rf.DreamerV3BlockGRUCell)
    cell_ours = rf.DreamerV3BlockGRUCell(F_IN, H, **_kwargs(layers))
    cell_theirs = trm.DreamerV3BlockGRUCell(F_IN, H, **_kwargs(layers))
    assert ({k: v.shape for k, v in cell_ours.state_dict().items()}
            == {k: v.shape for k, v in cell_theirs.state_dict().items()})
    # defaults (projection 512, 8 blocks) too
    assert ({k: v.shape for k, v in rf.DreamerV3BlockGRU(F_IN, 16).state_dict().items()}
            == {k: v.shape for k, v in trm.DreamerV3BlockGRU(F_IN, 16).state_dict().items()})


def test_state_dict_loads_both_ways() -> None:
    ours, theirs = make_pair(2)
    fresh = trm.DreamerV3BlockGRU(F_IN, H, **_kwargs(2)).double()
    fresh.load_state_dict(ours.state_dict(), strict=True)
    for k, v in theirs.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[k], v, rtol=0, atol=0)
    x, h0, is_init = make_inputs()
    torch.testing.assert_close(ours(x, h0, is_init), fresh(x, h0, is_init))
    cell = rf.DreamerV3BlockGRUCell(F_IN, H, **_kwargs(2)).double()
    cell.load_state_dict(theirs.cell.state_dict(), strict=True)
    torch.testing.assert_close(cell(x[:, 0], h0), theirs.cell(x[:, 0], h0))


@pytest.mark.parametrize("cls", ["DreamerV3BlockGRUCell", "DreamerV3BlockGRU"])
@pytest.mark.parametrize("layers", [1, 2])
def test_seeded_construction_matches_torchrl(cls: str, layers: int) -> None:
    """The same seed builds TorchRL's weights and leaves the global generator where TorchRL's constructor does, so a
    seeded experiment is the same after the swap (as for the LSTM/GRU modules)."""
    torch.manual_seed(3)
    theirs, after_theirs = getattr(trm, cls)(F_IN, H, **_kwargs(layers)), torch.rand(4)
    torch.manual_seed(3)
    ours, after_ours = getattr(rf, cls)(F_IN, H, **_kwargs(layers)), torch.rand(4)
    for (key, mine), (_, want) in zip(ours.state_dict().items(), theirs.state_dict().items(), strict=True):
        torch.testing.assert_close(mine, want, rtol=0, atol=0, msg=key)
    torch.testing.assert_close(after_ours, after_theirs, rtol=0, atol=0)


def test_init_by_module_type_reaches_the_same_weights_as_torchrl() -> None:
    """``module.apply(fn)`` keyed on ``nn.Linear`` (a custom init, TorchRL's own ``_dreamer_v3_init``) reaches the
    input and hidden projections as in TorchRL's cell, which are ``nn.Linear``; the block layers expose TorchRL's
    ``in_features``/``out_features``/``num_blocks``."""
    ours, theirs = rf.DreamerV3BlockGRUCell(F_IN, H, **_kwargs(2)), trm.DreamerV3BlockGRUCell(F_IN, H, **_kwargs(2))
    ours.load_state_dict(theirs.state_dict())

    def init(module):
        if isinstance(module, nn.Linear):
            nn.init.constant_(module.weight, 0.01 * module.in_features)

    ours.apply(init)
    theirs.apply(init)
    for (key, mine), (_, want) in zip(ours.state_dict().items(), theirs.state_dict().items(), strict=True):
        torch.testing.assert_close(mine, want, rtol=0, atol=0, msg=key)
    for name in ("dynamic_linears.0", "dynamic_linears.1", "gates"):
        mine, want = ours.get_submodule(name), theirs.get_submodule(name)
        assert (mine.in_features, mine.out_features, mine.num_blocks) == (want.in_features, want.out_features, want.num_blocks)


# ----------------------------------------------------------------------------- exactness against TorchRL


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("act", ACTIVATIONS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("backend", ["reference", "scan", "auto"])
def test_sequence_matches_torchrl(backend: str, act, layers: int) -> None:
    ours, theirs = make_pair(layers, act, backend)
    x, h0, is_init = make_inputs()
    (y, h), gx, gh, gp = run_with_grads(ours, x, h0, is_init)
    (wy, wh), wgx, wgh, wgp = run_with_grads(theirs, x, h0, is_init)
    assert y.shape == (B, T, H) and h.shape == (B, H)
    torch.testing.assert_close((y, h), (wy, wh))
    torch.testing.assert_close((gx, gh), (wgx, wgh))
    assert gp.keys() == wgp.keys()
    for name in wgp:
        torch.testing.assert_close(gp[name], wgp[name], msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("backend", ["reference", "scan", "auto"])
def test_sequence_options_match_torchrl(backend: str) -> None:
    """Non-default ``norm_eps``/``update_bias``, an activation instance, ``is_init [B, T, 1]``, no hidden."""
    ours, theirs = make_pair(2, nn.Tanh(), backend, seed=3, norm_eps=0.3, update_bias=0.5)
    x, h0, is_init = make_inputs(seed=4)
    torch.testing.assert_close(ours(x, h0, is_init[..., None]), theirs(x, h0, is_init[..., None]))
    torch.testing.assert_close(ours(x), theirs(x))
    torch.testing.assert_close(ours(x, None, is_init), theirs(x, None, is_init))


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("act", ACTIVATIONS, ids=lambda c: c.__name__)
def test_cell_matches_torchrl(act, layers: int) -> None:
    _, theirs = make_pair(layers, act)
    cell = rf.DreamerV3BlockGRUCell(F_IN, H, **_kwargs(layers, act)).double()
    cell.load_state_dict(theirs.cell.state_dict(), strict=True)
    x, h0, _ = make_inputs()
    got, gx, gh, gp = run_with_grads(cell, x[:, 0], h0, None)
    want, wgx, wgh, wgp = run_with_grads(theirs.cell, x[:, 0], h0, None)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close((gx, gh), (wgx, wgh))
    assert gp.keys() == wgp.keys()
    for name in wgp:
        torch.testing.assert_close(gp[name], wgp[name])
    # hidden None (zeros), batch dims [2, 3] and none
    torch.testing.assert_close(cell(x[:, 0]), theirs.cell(x[:, 0]))
    xb = x[:2, :3]
    torch.testing.assert_close(cell(xb, torch.ones(2, 3, H, dtype=torch.float64)),
                               theirs.cell(xb, torch.ones(2, 3, H, dtype=torch.float64)))
    torch.testing.assert_close(cell(x[0, 0], h0[0]), theirs.cell(x[0, 0], h0[0]))


def test_float32_matches_unpatched_torchrl() -> None:
    """fp32 against TorchRL as shipped (its RMS norm in float32, like ours in fp32): only rounding differs, ~1e-7
    relative per op over 5 steps; ``rtol=1e-5, atol=1e-6`` leaves a wide margin, a wrong term is O(1e-2)."""
    torch.manual_seed(0)
    theirs = trm.DreamerV3BlockGRU(F_IN, H, **_kwargs(2))
    _perturb(theirs)
    ours = rf.DreamerV3BlockGRU(F_IN, H, **_kwargs(2), recurrent_backend="scan")
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x, h0, is_init = (t.float() if t.is_floating_point() else t for t in make_inputs())
    torch.testing.assert_close(ours(x, h0, is_init), theirs(x, h0, is_init), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- errors


def _error_class(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return type(e)
    return None


CONSTRUCTOR_MISTAKES = {
    "hidden_not_divisible": dict(hidden_size=8, num_blocks=3),
    "num_blocks_0": dict(hidden_size=8, num_blocks=0),
    "num_layers_0": dict(hidden_size=8, num_blocks=2, num_layers=0),
    "parametric_activation": dict(hidden_size=8, num_blocks=2, activation_class=nn.PReLU),
    "activation_name": dict(hidden_size=8, num_blocks=2, activation_class="silu"),
    "activation_number": dict(hidden_size=8, num_blocks=2, activation_class=3),
}


@pytest.mark.parametrize("cls", ["DreamerV3BlockGRUCell", "DreamerV3BlockGRU"])
@pytest.mark.parametrize("mistake", list(CONSTRUCTOR_MISTAKES))
def test_constructor_errors_match_torchrl(cls: str, mistake: str) -> None:
    kw = dict(projection_size=P, **CONSTRUCTOR_MISTAKES[mistake])
    hidden = kw.pop("hidden_size")
    want = _error_class(lambda: getattr(trm, cls)(F_IN, hidden, **kw))
    assert want is not None
    with pytest.raises(want):
        getattr(rf, cls)(F_IN, hidden, **kw)


FORWARD_MISTAKES = {
    "input_width": lambda m: m(torch.randn(B, T, F_IN + 1)),
    "input_2d": lambda m: m(torch.randn(B, F_IN)),
    "input_4d": lambda m: m(torch.randn(2, B, T, F_IN)),
    "time_0": lambda m: m(torch.randn(B, 0, F_IN)),
    "hidden_width": lambda m: m(torch.randn(B, T, F_IN), torch.zeros(B, H + 1)),
    "hidden_3d": lambda m: m(torch.randn(B, T, F_IN), torch.zeros(B, 1, H)),
    "hidden_batch": lambda m: m(torch.randn(B, T, F_IN), torch.zeros(B + 1, H)),
    "is_init_float": lambda m: m(torch.randn(B, T, F_IN), None, torch.zeros(B, T)),
    "is_init_shape": lambda m: m(torch.randn(B, T, F_IN), None, torch.zeros(B, T - 1, dtype=torch.bool)),
    "cell_input_width": lambda m: m.cell(torch.randn(B, F_IN + 1)),
    "cell_hidden_width": lambda m: m.cell(torch.randn(B, F_IN), torch.zeros(B, H - 1)),
    "cell_hidden_batch": lambda m: m.cell(torch.randn(B, F_IN), torch.zeros(B + 1, H)),
}


@pytest.mark.parametrize("mistake", list(FORWARD_MISTAKES))
def test_forward_errors_match_torchrl(mistake: str) -> None:
    theirs = trm.DreamerV3BlockGRU(F_IN, H, **_kwargs())
    ours = rf.DreamerV3BlockGRU(F_IN, H, **_kwargs())
    want = _error_class(lambda: FORWARD_MISTAKES[mistake](theirs))
    assert want is not None
    with pytest.raises(want):
        FORWARD_MISTAKES[mistake](ours)


@pytest.mark.parametrize("backend", ["pad", "triton_typo", "bogus", "Scan", "triton"])
def test_bad_recurrent_backend_raises(backend: str) -> None:
    """Refused by the constructor, and when assigned later (not first by the next call); the module keeps its own."""
    with pytest.raises(ValueError, match="recurrent_backend"):
        rf.DreamerV3BlockGRU(F_IN, H, **_kwargs(), recurrent_backend=backend)
    ours = rf.DreamerV3BlockGRU(F_IN, H, **_kwargs(), recurrent_backend="scan")
    with pytest.raises(ValueError, match="recurrent_backend"):
        ours.recurrent_backend = backend
    assert ours.recurrent_backend == "scan"


def test_recurrent_backend_assigned_later_runs() -> None:
    ours = rf.DreamerV3BlockGRU(F_IN, H, **_kwargs()).double()
    x, is_init = torch.randn(B, T, F_IN, dtype=torch.float64), torch.rand(B, T) < 0.3
    want = ours(x, None, is_init)[0]
    ours.recurrent_backend = "scan"
    assert ours.recurrent_backend == "scan"
    torch.testing.assert_close(ours(x, None, is_init)[0], want)
    state = {("recurrent_backend" if k == "_recurrent_backend" else k): v for k, v in ours.__dict__.items()}
    loaded = rf.DreamerV3BlockGRU.__new__(rf.DreamerV3BlockGRU)
    loaded.__setstate__(state)  # pickled before the option became a checked property
    assert loaded.recurrent_backend == "scan"
    torch.testing.assert_close(loaded(x, None, is_init)[0], want)


@pytest.mark.parametrize("backend", ["reference", "scan"])
@pytest.mark.parametrize("act", [nn.Sigmoid, nn.GELU(), torch.sin], ids=["Sigmoid", "GELU-instance", "torch.sin"])
def test_any_activation_matches_torchrl(act, backend: str) -> None:
    """TorchRL's block GRU takes any parameter-free elementwise activation on ``reference`` and ``scan`` (its scan takes
    the derivative by ``torch.func.jvp``); so does ours, on each of our backends, outputs and gradients (against
    TorchRL's ``reference``, the oracle: its ``scan`` backward runs its norms in float32)."""
    ours, theirs = make_pair(2, act, backend)
    x, h0, is_init = make_inputs()
    got, want = run_with_grads(ours, x, h0, is_init), run_with_grads(theirs, x, h0, is_init)
    torch.testing.assert_close(got[:3], want[:3])
    for name in want[3]:
        torch.testing.assert_close(got[3][name], want[3][name])


def test_activations_are_refused_as_torchrl_refuses_them() -> None:
    for bad, error in ((3, TypeError), (nn.PReLU, ValueError)):  # not callable; learnable parameters
        for ours, theirs in ((rf.DreamerV3BlockGRUCell, trm.DreamerV3BlockGRUCell),
                             (rf.DreamerV3BlockGRU, trm.DreamerV3BlockGRU)):
            with pytest.raises(error):
                theirs(F_IN, H, **_kwargs(act=bad))
            with pytest.raises(error, match="activation_class"):
                ours(F_IN, H, **_kwargs(act=bad))


def test_one_constructor_signature_for_both_modules() -> None:
    import inspect

    cell, seq = (inspect.signature(cls.__init__) for cls in (rf.DreamerV3BlockGRUCell, rf.DreamerV3BlockGRU))
    assert [p for p in seq.parameters if p != "recurrent_backend"] == list(cell.parameters)
    assert seq.parameters["recurrent_backend"].default == "auto"
    with pytest.raises(TypeError):
        rf.DreamerV3BlockGRU(F_IN, H, 4)  # keyword-only after hidden_size, as TorchRL's


def test_assigned_activation_takes_effect_as_in_torchrl() -> None:
    """TorchRL's forward calls ``self.activation``: assigning another one after construction changes the outputs.
    Ours reads it per call too (it ran the constructor's before)."""
    ours, theirs = make_pair(1, nn.SiLU, "auto")
    x, h0, is_init = make_inputs()
    for module in (ours, theirs):
        module.cell.activation = nn.Tanh()
    for got, want in zip(ours(x, h0, is_init), theirs(x, h0, is_init), strict=True):
        torch.testing.assert_close(got, want)
    fresh, _ = make_pair(1, nn.Tanh, "auto")
    fresh.load_state_dict(ours.state_dict())
    torch.testing.assert_close(ours(x, h0, is_init)[0], fresh(x, h0, is_init)[0])
    for module in (ours, theirs):
        module.cell.activation = nn.Sigmoid()  # outside the named set: the torch.func.jvp derivative
    torch.testing.assert_close(ours(x, h0, is_init), theirs(x, h0, is_init))


@pytest.mark.parametrize("batch", [(0,), (2, 0)])
@pytest.mark.parametrize("given", [False, True], ids=["hidden_none", "hidden_given"])
def test_cell_on_an_empty_batch_returns_an_empty_hidden_as_torchrl(batch, given) -> None:
    ours, theirs = make_pair(1, nn.SiLU, "auto")
    x = torch.randn(*batch, F_IN, dtype=torch.float64)
    hidden = torch.zeros(*batch, H, dtype=torch.float64) if given else None
    got, want = ours.cell(x, hidden), theirs.cell(x, hidden)
    assert got.shape == want.shape == (*batch, H) and got.dtype == want.dtype


# ----------------------------------------------------------------------------- compile and vmap


@pytest.mark.parametrize("backend", ["auto"])  # under compile auto runs scan: a named scan compiles the same graph
def test_compiled_module_fullgraph_equals_eager(backend: str) -> None:
    ours, theirs = make_pair(2, nn.SiLU, backend)
    x, h0, is_init = make_inputs()
    torch._dynamo.reset()
    compiled = torch.compile(ours, fullgraph=True, backend="aot_eager")
    (y, h), gx, gh, gp = run_with_grads(compiled, x, h0, is_init)
    (wy, wh), wgx, wgh, wgp = run_with_grads(ours, x, h0, is_init)
    torch.testing.assert_close((y, h), (wy, wh))
    torch.testing.assert_close((gx, gh), (wgx, wgh))
    gp = {k.removeprefix("_orig_mod."): v for k, v in gp.items()}
    assert gp.keys() == wgp.keys()
    for name in wgp:
        torch.testing.assert_close(gp[name], wgp[name])
    # and both equal TorchRL
    torch.testing.assert_close((y, h), theirs(x, h0, is_init))


@pytest.mark.parametrize("act", [nn.Sigmoid, torch.sin], ids=["Sigmoid", "torch.sin"])
def test_compiled_custom_activation_fullgraph_without_breaks(act) -> None:
    """A callable activation's cell is made on its first call, here inside the compiled one: 0 graph breaks, and the
    jvp derivative of the hand-written backward traces; outputs and gradients equal TorchRL's."""
    ours, theirs = make_pair(2, act, "scan")
    x, h0, is_init = make_inputs()
    torch._dynamo.reset()
    explained = torch._dynamo.explain(ours)(x, h0, is_init)
    assert explained.graph_break_count == 0, explained.break_reasons
    got = run_with_grads(torch.compile(ours, fullgraph=True, backend="aot_eager"), x, h0, is_init)
    want = run_with_grads(theirs, x, h0, is_init)
    torch.testing.assert_close(got[:3], want[:3])
    for name in want[3]:
        torch.testing.assert_close(got[3]["_orig_mod." + name], want[3][name])


def test_compiled_cell_fullgraph_equals_eager() -> None:
    cell = rf.DreamerV3BlockGRUCell(F_IN, H, **_kwargs(2, nn.ReLU)).double()
    _perturb(cell)
    x, h0, _ = make_inputs()
    torch._dynamo.reset()
    compiled = torch.compile(cell, fullgraph=True, backend="aot_eager")
    got, gx, gh, gp = run_with_grads(compiled, x[:, 0], h0, None)
    want, wgx, wgh, wgp = run_with_grads(cell, x[:, 0], h0, None)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close((gx, gh), (wgx, wgh))
    gp = {k.removeprefix("_orig_mod."): v for k, v in gp.items()}
    for name in wgp:
        torch.testing.assert_close(gp[name], wgp[name])


def test_vmap_over_an_ensemble_of_cells_equals_loop() -> None:
    """``stack_module_state`` of 3 cells, ``functional_call`` under ``torch.vmap``: outputs and param grads
    (``torch.func.grad``) equal a loop over the members."""
    cells = []
    for s in range(3):
        torch.manual_seed(s)
        cell = rf.DreamerV3BlockGRUCell(F_IN, H, **_kwargs(2)).double()
        _perturb(cell, s)
        cells.append(cell)
    params, buffers = torch.func.stack_module_state(cells)
    base = cells[0]
    x, h0, _ = make_inputs()
    x = x[:, 0]

    def run(p, b, x, h):
        return torch.func.functional_call(base, (p, b), (x, h))

    def loss(p, b, x, h):
        return (run(p, b, x, h) * torch.linspace(-1, 1, H, dtype=x.dtype)).sum()

    y = torch.vmap(run, in_dims=(0, 0, None, None))(params, buffers, x, h0)
    grads = torch.vmap(torch.func.grad(loss), in_dims=(0, 0, None, None))(params, buffers, x, h0)
    for i, cell in enumerate(cells):
        want = cell(x, h0)
        torch.testing.assert_close(y[i], want)
        named = dict(cell.named_parameters())
        want_grads = torch.autograd.grad((want * torch.linspace(-1, 1, H, dtype=x.dtype)).sum(), list(named.values()))
        for name, g in zip(named, want_grads):
            torch.testing.assert_close(grads[name][i], g)


def test_model_based_doc_section_runs() -> None:
    """The block-GRU example of docs/model_based.md runs: a TorchRL checkpoint loads and gives TorchRL's outputs."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "model_based.md").read_text()
    section = page.split("## DreamerV3's block GRU")[1].split("\n## ")[0]
    (code,) = re.findall(r"^```python\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    torch._dynamo.reset()
    exec_as_module(code, "docs/model_based.md[block GRU]", "docs_model_based_block_gru")


def test_torch_export_of_both_modules() -> None:
    """Non-strict ``torch.export`` swaps the parameters for fakes while it traces: the exported program equals eager,
    and the module, called again after the export, still returns real tensors with the same values."""
    seq = rf.DreamerV3BlockGRU(3, 8, projection_size=4, num_blocks=2).eval()
    x = torch.randn(2, 5, 3)
    is_init = torch.zeros(2, 5, dtype=torch.bool)
    is_init[:, 0] = is_init[1, 3] = True
    with torch.no_grad():
        want = seq(x, None, is_init)
        exported = torch.export.export(seq, (x, None, is_init), strict=False)
        torch.testing.assert_close(exported.module()(x, None, is_init), want)
        again = seq(x, None, is_init)
    assert all(type(t) is torch.Tensor for t in again)
    torch.testing.assert_close(again, want)
    cell = rf.DreamerV3BlockGRUCell(3, 8, projection_size=4, num_blocks=2)
    h = torch.randn(2, 8)
    exported = torch.export.export(cell, (x[:, 0], h), strict=False)
    torch.testing.assert_close(exported.module()(x[:, 0], h), cell(x[:, 0], h))


def test_default_torch_compile_of_both_modules() -> None:
    """A plain ``torch.compile(module)`` (no ``fullgraph``), as users write it, equals eager, forward and backward.

    fp32 at rtol=1e-4, atol=1e-5, as every fp32 comparison here: Inductor fuses and reorders the norms' and gates'
    sums (1.8e-5 apart on one gradient under torch 2.11, drawn inputs varying). The cell runs Inductor; the sequence
    module (a scan) runs ``aot_eager``, the module's capture without fullgraph: Inductor's code for the block GRU's
    scan, fwd+bwd under the default compile, is compile_tests/test_compile_block_gru.py's num_blocks=8 case."""
    torch.manual_seed(0)
    seq = rf.DreamerV3BlockGRU(3, 8, projection_size=4, num_blocks=2)
    cell = rf.DreamerV3BlockGRUCell(3, 8, projection_size=4, num_blocks=2)
    x = torch.randn(2, 5, 3)
    is_init = torch.rand(2, 5, generator=torch.Generator().manual_seed(0)) < 0.3
    torch._dynamo.reset()
    for module, args, compiler in ((seq, (x, None, is_init), "aot_eager"), (cell, (x[:, 0],), "inductor")):
        params = list(module.parameters())
        want = module(*args)
        got = torch.compile(module, backend=compiler)(*args)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        loss = lambda out: sum(o.sum() for o in (out if isinstance(out, tuple) else (out,)))  # noqa: E731
        torch.testing.assert_close(torch.autograd.grad(loss(got), params), torch.autograd.grad(loss(want), params),
                                   rtol=1e-4, atol=1e-5)
