"""Our RG-LRU against DeepMind's recurrentgemma RG-LRU (``recurrentgemma/torch/layers.py``: ``RGLRU``,
``BlockDiagonalLinear``, ``rnn_scan``, ``rnn_param_init``), and ``segment_start="recurrentgemma"``.

recurrentgemma's package imports its JAX code on import (flax, jax), so its torch layer is not importable here; the
oracle is a plain loop written below that follows its code line by line (block-diagonal gates on ``x`` fed in
directly, ``log_a = -8 r softplus(a_param)``, ``sqrt(1 - a^2)`` input normalisation, ``a = 0`` and multiplier 1 where
``segment_pos == 0``), accumulating in fp64 (its ``rnn_scan`` takes ``acc_dtype``). fp64 at ``assert_close``
defaults, outputs and gradients, on every RG-LRU backend.

recurrentgemma clips the derivative of its ``sqrt(1 - a^2)`` at 1000 (``SqrtBoundDerivative``: ``1 / sqrt(max(4 v,
1e-6))``); the oracle takes the exact derivative. The two are equal wherever ``v = 1 - a^2 >= 2.5e-7``, which
:func:`_check_clip_inactive` asserts for every draw compared here, so the gradients compared are recurrentgemma's.
"""

from __future__ import annotations

import math

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

import rnn_functional as rf
from rnn_functional.cells.rglru import RGLRU

WIDTH, HEADS, B, T = 8, 2, 3, 7
BACKENDS = [("reference", "none"), ("scan", "none"), ("scan", "full"), ("parallel", "none"), ("auto", "none")]


def recurrentgemma_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """An RGLRU's state dict drawn as its ``reset_parameters`` draws it (normal gates, std sqrt(1 / block width)),
    with non-zero biases (its zeros would hide their gradients)."""
    g = torch.Generator().manual_seed(seed)
    bw = WIDTH // HEADS
    normal = lambda *shape, std=1.0: torch.randn(*shape, generator=g, dtype=torch.float64) * std  # noqa: E731
    square = torch.empty(WIDTH, dtype=torch.float64).uniform_(0.9 ** 2 + 1e-8, 0.999 ** 2 + 1e-8, generator=g)
    return {"a_param": torch.log(torch.exp(-0.5 * torch.log(square)) - 1.0),  # rnn_param_init
            "input_gate.w": normal(HEADS, bw, bw, std=math.sqrt(1 / bw)), "input_gate.b": normal(HEADS, bw, std=0.3),
            "a_gate.w": normal(HEADS, bw, bw, std=math.sqrt(1 / bw)), "a_gate.b": normal(HEADS, bw, std=0.3)}


def block_diagonal_linear(x, w, b):
    heads = w.shape[0]
    y = torch.einsum("...hi,hij->...hj", x.unflatten(-1, (heads, -1)), w) + b
    return y.flatten(-2)


def recurrentgemma_rglru(p, x, segment_pos, cache=None):
    """recurrentgemma's ``RGLRU.forward`` and ``rnn_scan`` (acc in fp64) -> ``(y, last_h)``."""
    reset = segment_pos == 0
    gate_x = torch.sigmoid(block_diagonal_linear(x, p["input_gate.w"], p["input_gate.b"]))
    gate_a = torch.sigmoid(block_diagonal_linear(x, p["a_gate.w"], p["a_gate.b"]))
    log_a = -8.0 * gate_a * F.softplus(p["a_param"])
    a, a_square = torch.exp(log_a), torch.exp(2 * log_a)
    multiplier = torch.sqrt(1 - a_square)
    multiplier = reset[..., None] + ~reset[..., None] * multiplier
    normalized_x = x * gate_x * multiplier
    a = a * ~reset[..., None]
    h = torch.zeros_like(x[:, 0]) if cache is None else cache
    ys = []
    for t in range(x.shape[1]):
        h = a[:, t] * h + normalized_x[:, t]
        ys.append(h)
    return torch.stack(ys, 1), h


def _grads(outputs, leaves):
    g = torch.Generator().manual_seed(7)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outputs)
    return torch.autograd.grad(loss, leaves)


def _gate_block_grads(d_weight: torch.Tensor, key: int) -> torch.Tensor:
    """Our ``weight_l0`` gradient's block ``key`` (1: a_gate, 2: input_gate) as recurrentgemma's ``w [heads, Hb, Hb]``."""
    bw = WIDTH // HEADS
    rows = d_weight[key * WIDTH : (key + 1) * WIDTH].T  # [in, out]
    return torch.stack([rows[h * bw : (h + 1) * bw, h * bw : (h + 1) * bw] for h in range(HEADS)])


def _check_clip_inactive(theirs: dict, x: torch.Tensor) -> None:
    """recurrentgemma's clipped sqrt derivative equals the exact one on these draws: ``1 - a^2 >= 2.5e-7``
    everywhere."""
    gate_a = torch.sigmoid(block_diagonal_linear(x, theirs["a_gate.w"], theirs["a_gate.b"]))
    a = torch.exp(-8.0 * gate_a * F.softplus(theirs["a_param"]))
    assert (1 - a * a).min() >= 1 / (4 * 1000 ** 2)


def _assert_matches(theirs: dict, ours, x, cache, segment_pos, y, h) -> None:
    """Our ``(y, h)`` equal recurrentgemma's layer: outputs, final state, gradients of ``x``, the cache, ``a_param``
    and both gates' blocks and biases."""
    _check_clip_inactive(theirs, x.detach())
    want = recurrentgemma_rglru(theirs, x, segment_pos, cache)
    torch.testing.assert_close((y, h[:, 0]), want)
    got_x, got_h, d_w, d_b, d_lambda = _grads((y, h[:, 0]), [x, cache, *ours.values()])
    want_x, want_h, d_a, d_gw, d_gb, d_aw, d_ab = _grads(want, [x, cache, theirs["a_param"], theirs["input_gate.w"],
                                                              theirs["input_gate.b"], theirs["a_gate.w"],
                                                              theirs["a_gate.b"]])
    torch.testing.assert_close((got_x, got_h, -d_lambda), (want_x, want_h, d_a))
    torch.testing.assert_close((_gate_block_grads(d_w, 1), _gate_block_grads(d_w, 2)), (d_aw, d_gw))
    torch.testing.assert_close((d_b[WIDTH : 2 * WIDTH], d_b[2 * WIDTH :]), (d_ab.flatten(), d_gb.flatten()))


@pytest.mark.parametrize("backend,recompute", BACKENDS)
def test_loaded_weights_give_recurrentgemma_outputs_and_gradients(backend: str, recompute: str) -> None:
    """Continuing from a cache (``segment_pos > 0`` everywhere: no segment starts inside the call), ours with the
    loaded weights equals recurrentgemma's layer (:func:`_assert_matches`)."""
    theirs = {k: v.requires_grad_(True) for k, v in recurrentgemma_weights().items()}
    ours = rf.rglru_params_from_recurrentgemma(theirs).apply(lambda t: t.requires_grad_(True))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, T, WIDTH, generator=g, dtype=torch.float64, requires_grad=True)
    cache = torch.randn(B, WIDTH, generator=g, dtype=torch.float64, requires_grad=True)
    segment_pos = torch.arange(5, 5 + T).expand(B, T)
    y, h = rf.rglru_sequence(x, cache[:, None], ours, backend=backend, recompute=recompute)
    _assert_matches(theirs, ours, x, cache, segment_pos, y, h)


def test_loader_takes_the_module_or_its_state_dict_and_copies() -> None:
    weights = recurrentgemma_weights()
    module = torch.nn.Module()
    module.a_param = torch.nn.Parameter(weights["a_param"])
    for gate in ("input_gate", "a_gate"):
        sub = torch.nn.Module()
        sub.w, sub.b = torch.nn.Parameter(weights[f"{gate}.w"]), torch.nn.Parameter(weights[f"{gate}.b"])
        setattr(module, gate, sub)
    from_module, from_dict = rf.rglru_params_from_recurrentgemma(module), rf.rglru_params_from_recurrentgemma(weights)
    assert (from_module == from_dict).all()
    assert from_module["weight_l0"].shape == (3 * WIDTH, WIDTH) and not from_module["log_lambda_l0"].requires_grad
    from_module["log_lambda_l0"].add_(1.0)
    assert torch.equal(module.a_param, weights["a_param"])  # nothing shared


def test_segment_starts_differ_only_by_the_documented_factor() -> None:
    """Where ``segment_pos == 0`` (our ``is_init``, carry reset to zeros) recurrentgemma scales the gated input by 1,
    ours by ``sqrt(1 - a^2)``; everything before the first start agrees, and a start at t=0 is the same relation."""
    theirs = recurrentgemma_weights()
    ours = rf.rglru_params_from_recurrentgemma(theirs)
    x = torch.randn(B, T, WIDTH, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    segment_pos = torch.tensor([[3, 4, 5, 0, 1, 2, 3]] * B)
    cache = torch.randn(B, WIDTH, dtype=torch.float64)
    want, _ = recurrentgemma_rglru(theirs, x, segment_pos, cache)
    y, _ = rf.rglru_sequence(x, cache[:, None], ours, is_init=segment_pos == 0, backend="reference")
    torch.testing.assert_close(y[:, :3], want[:, :3])
    gate_a = torch.sigmoid(block_diagonal_linear(x[:, 3], theirs["a_gate.w"], theirs["a_gate.b"]))
    a = torch.exp(-8.0 * gate_a * F.softplus(theirs["a_param"]))
    torch.testing.assert_close(y[:, 3], want[:, 3] * torch.sqrt(1 - a * a))


def test_recurrentgemma_init_draws_its_decays() -> None:
    """``init="recurrentgemma"`` is ``rnn_param_init(min_rad=0.9, max_rad=0.999)`` with ``Λ = -a_param``: the same
    uniform draws give the same values; ``sigmoid(Λ)`` in [0.9, 0.999] (Griffin's default puts ``sigmoid(Λ)^8``
    there)."""
    g = torch.Generator().manual_seed(0)
    params = rf.init_rglru_params(3, 4096, 2, init="recurrentgemma", dtype=torch.float64, generator=g)
    g = torch.Generator().manual_seed(0)
    torch.empty(3 * 4096, 3, dtype=torch.float64).uniform_(generator=g)  # the same draws as the init, in order
    torch.empty(3 * 4096, dtype=torch.float64).uniform_(generator=g)
    square = torch.empty(4096, dtype=torch.float64).uniform_(0.9 ** 2 + 1e-8, 0.999 ** 2 + 1e-8, generator=g)
    a_param = torch.log(torch.exp(-0.5 * torch.log(square)) - 1.0)
    torch.testing.assert_close(params["log_lambda_l0"], -a_param)
    for k in range(2):
        radius = torch.sigmoid(params[f"log_lambda_l{k}"])
        assert 0.9 <= radius.min() and radius.max() <= 0.999 + 1e-8
        assert abs((radius ** 2).mean().item() - (0.81 + 0.998001) / 2) < 3e-3  # uniform on the ring's area
    griffin = torch.sigmoid(rf.init_rglru_params(3, 4096)["log_lambda_l0"].double()) ** 8
    assert 0.9 <= griffin.min() and griffin.max() <= 0.999 + 1e-6
    with pytest.raises(ValueError, match="init"):
        rf.init_rglru_params(3, 4, init="glorot")


# ----------------------------------------------------------------------------- segment_start="recurrentgemma"

RG = {"segment_start": "recurrentgemma"}
OPTION_PATHS = [("reference", "none"), ("reference", "full"), ("scan", "none"), ("scan", "full"), ("parallel", "none"),
                ("parallel", "full"), ("auto", "none")]


def _segment_pos(resets: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """recurrentgemma's ``segment_pos [B, T]``: 0 where ``resets``, else one more than the step before; a row without a
    reset at t = 0 continues a segment at position ``first[row]``."""
    pos, prev = [], first - 1
    for t in range(resets.shape[1]):
        prev = torch.where(resets[:, t], 0, prev + 1)
        pos.append(prev)
    return torch.stack(pos, 1)


@pytest.mark.parametrize("backend,recompute", OPTION_PATHS)
def test_option_gives_recurrentgemma_outputs_and_gradients_with_segment_starts(backend: str, recompute: str) -> None:
    """With ``segment_start="recurrentgemma"`` and ``is_init = segment_pos == 0`` ours equals recurrentgemma's layer
    with segment starts at t = 0 (row 0), inside the call (every row) and a row continuing its cache (row 1)
    (:func:`_assert_matches`); the default differs at the starts alone."""
    theirs = {k: v.requires_grad_(True) for k, v in recurrentgemma_weights(seed=3).items()}
    ours = rf.rglru_params_from_recurrentgemma(theirs).apply(lambda t: t.requires_grad_(True))
    g = torch.Generator().manual_seed(4)
    x = torch.randn(B, T, WIDTH, generator=g, dtype=torch.float64, requires_grad=True)
    cache = torch.randn(B, WIDTH, generator=g, dtype=torch.float64, requires_grad=True)
    resets = torch.rand(B, T, generator=g) < 0.3
    resets[0, 0], resets[1, 0], resets[:, 4] = True, False, True
    segment_pos = _segment_pos(resets, torch.tensor([0, 6, 2]))
    y, h = rf.rglru_sequence(x, cache[:, None], ours, is_init=segment_pos == 0, backend=backend, recompute=recompute,
                             **RG)
    _assert_matches(theirs, ours, x, cache, segment_pos, y, h)
    scaled, _ = rf.rglru_sequence(x, cache[:, None], ours, is_init=segment_pos == 0, backend="reference")
    before = int(resets[1].nonzero()[0])  # row 1's first start: the default agrees before it, not at t = 0 of row 0
    assert not torch.allclose(scaled[0, 0], y[0, 0]) and torch.equal(scaled[1, :before], y[1, :before])


def _option_case(seed: int, layers: int = 2, n: int = 4, t_len: int = 9, f_in: int = 3, hidden: int = 5):
    """Two-layer params, inputs, an initial state, stored reset states and resets at t = 0 (rows 0, 2) and not
    (rows 1, 3), interior ones at random; every float a leaf requiring grad."""
    g = torch.Generator().manual_seed(seed)
    params = rf.init_rglru_params(f_in, hidden, layers, dtype=torch.float64, generator=g)
    x = torch.randn(n, t_len, f_in, generator=g, dtype=torch.float64)
    h0 = torch.randn(n, layers, hidden, generator=g, dtype=torch.float64)
    reset = torch.randn(n, t_len, layers, hidden, generator=g, dtype=torch.float64)
    is_init = torch.rand(n, t_len, generator=g) < 0.3
    is_init[:, 0] = torch.arange(n) % 2 == 0
    is_init[1, t_len // 2] = True
    return params.apply(lambda t: t.requires_grad_()), *(t.requires_grad_() for t in (x, h0, reset)), is_init


def _run_with_grads(params, x, h0, reset, is_init, **kwargs):
    y, h, seg = rf.rglru_sequence(x, h0, params, is_init=is_init, reset_state=reset, return_segment_states=True,
                                  **kwargs)
    g = torch.Generator().manual_seed(9)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in (y, h, seg))
    return (y, h, seg), torch.autograd.grad(loss, [x, h0, reset, *params.values()])


@pytest.mark.parametrize("backend,recompute", OPTION_PATHS[1:])
def test_every_backend_equals_reference_with_the_option(backend: str, recompute: str) -> None:
    """Outputs, final and segment states, gradients of every input (``x``, the state, ``reset_state``, every
    parameter) equal ``reference``'s with the option; resets at t = 0 in some rows, not in others, inside all."""
    case = _option_case(seed=1)
    torch.testing.assert_close(_run_with_grads(*case, backend=backend, recompute=recompute, **RG),
                               _run_with_grads(*case, backend="reference", **RG))


@pytest.mark.parametrize("backend", ["reference", "scan"])
def test_option_keeps_first_step_starts_on_a_forced_layout_and_refuses_aligned(backend: str) -> None:
    """A forced ``segment_layout="rows"`` reads ``is_init`` on the host and runs a call whose resets all lie at t = 0
    reset-free for the other cells; with the option the starts at t = 0 still take multiplier 1. ``"aligned"`` cannot
    serve the option (a right-aligned segment continuing the incoming state would start with a reset) and says so."""
    params, x, h0, reset, is_init = _option_case(seed=2)
    first_only = torch.zeros_like(is_init)
    first_only[:, 0] = is_init[:, 0]
    got = _run_with_grads(params, x, h0, reset, first_only, backend=backend, segment_layout="rows", **RG)
    torch.testing.assert_close(got, _run_with_grads(params, x, h0, reset, first_only, backend="reference", **RG))
    with pytest.raises(ValueError, match=r"segment_layout='aligned'.*segment_start='recurrentgemma'.*\['rows'\]"):
        rf.rglru_sequence(x, h0, params, is_init=is_init, backend=backend, segment_layout="aligned", **RG)


@pytest.mark.parametrize("backend", ["pad", "triton"])
def test_backends_without_the_cell_refuse_the_option_by_name(backend: str) -> None:
    params, x, h0, _, is_init = _option_case(seed=0)
    with pytest.raises(ValueError, match=rf"backend '{backend}'.*segment_start='recurrentgemma'.*'reference', 'scan'"):
        rf.rglru_sequence(x, h0, params, is_init=is_init, backend=backend, **RG)
    with pytest.raises(ValueError, match=rf"backend '{backend}'.*segment_start='recurrentgemma'"):
        rf.rglru_step(x[:, 0], h0, params, is_init=is_init[:, 0], backend=backend, **RG)
    assert rf.available_backends(cell="rglru_recurrentgemma") == ["reference", "scan", "parallel"]


@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=5), seed=st.integers(0, 2**16),
       backend=st.sampled_from(["reference", "scan", "parallel"]), continues=st.booleans())
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_option_leaks_nothing_across_a_reset(lengths, seed, backend, continues):
    """A flat row of segments, a reset at each start (but t = 0 where ``continues``: the first segment continues the
    initial state), with the option: every segment equals its trajectory run alone (from its ``reset_state`` and a
    start at its first step, or from the initial state without one), and the last one reads nothing before it."""
    g = torch.Generator().manual_seed(seed)
    params = rf.init_rglru_params(3, 4, 2, dtype=torch.float64, generator=g)
    total = sum(lengths)
    x = torch.randn(1, total, 3, generator=g, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(1, 2, 4, generator=g, dtype=torch.float64)
    reset = torch.randn(1, total, 2, 4, generator=g, dtype=torch.float64)
    starts = [0, *torch.tensor(lengths).cumsum(0)[:-1].tolist()]
    is_init = torch.zeros(1, total, dtype=torch.bool)
    is_init[0, starts] = True
    is_init[0, 0] = not continues
    y, _ = rf.rglru_sequence(x, h0, params, is_init=is_init, reset_state=reset, backend=backend, **RG)
    (d_x,) = torch.autograd.grad(y[0, -1].sum(), x)
    assert (d_x[0, : starts[-1]] == 0).all() or (continues and len(starts) == 1)
    for s, n in zip(starts, lengths):
        alone = is_init[:, s : s + n] & (torch.arange(n) == 0)
        state = h0 if s == 0 and continues else reset[:, s]
        seg_y, _ = rf.rglru_sequence(x[:, s : s + n], state, params, is_init=alone, reset_state=reset[:, s : s + n],
                                     backend="reference", **RG)
        torch.testing.assert_close(y[:, s : s + n], seg_y)


def test_step_function_with_the_option_equals_the_sequence() -> None:
    """``rglru_step`` over time (``is_init`` per step: zeros and multiplier 1 there) equals ``rglru_sequence``
    (``parallel``), and differs from the default step at a start only; dropout between layers keeps that."""
    params, x, h0, _, is_init = _option_case(seed=5)
    for backend in ("auto", "reference", "parallel"):
        h, ys = h0, []
        for t in range(x.shape[1]):
            y, h = rf.rglru_step(x[:, t], h, params, is_init=is_init[:, t], backend=backend, **RG)
            ys.append(y)
        want_y, want_h = rf.rglru_sequence(x, h0, params, is_init=is_init, backend="parallel", **RG)
        torch.testing.assert_close((torch.stack(ys, 1), h), (want_y, want_h))
    # a layout read by the default cell (the same params) runs the option's cell
    tensors = dict(params.items())
    got = rf.rglru_sequence(x, h0, tensors, is_init=is_init, layout=RGLRU.read_layout(tensors), **RG)
    torch.testing.assert_close(got, (want_y, want_h))
    y, _ = rf.rglru_step(x[:, 0], h0, params, is_init=is_init[:, 0], **RG)
    default, _ = rf.rglru_step(x[:, 0], h0, params, is_init=is_init[:, 0])
    assert not torch.allclose(y[0], default[0]) and torch.equal(y[1], default[1])  # row 0 starts, row 1 does not
    dropped = []
    for option in (RG, {}):  # the same dropout masks: the option changes the rows that start alone
        torch.manual_seed(0)
        dropped.append(rf.rglru_step(x[:, 0], h0, params, is_init=is_init[:, 0], dropout=0.5, training=True,
                                     **option)[0])
    assert not torch.allclose(dropped[0][0], dropped[1][0]) and torch.equal(dropped[0][1], dropped[1][1])


def test_module_with_the_option_agrees_in_both_modes_and_keeps_it() -> None:
    """``RGLRUModule(segment_start="recurrentgemma")``: a step-mode rollout equals recurrent mode on the same
    trajectory, recurrent mode equals ``rglru_sequence`` with the option (not without it); copies, pickles and an
    ensemble keep the option."""
    torch.manual_seed(0)
    module = rf.RGLRUModule(3, 5, num_layers=2, in_key="obs", out_key="feat", segment_start="recurrentgemma")
    assert module.segment_start == "recurrentgemma"
    assert rf.RGLRUModule(3, 5, in_key="o", out_key="f").segment_start == "scaled"
    n, t_len = 3, 8
    is_init = torch.rand(n, t_len, 1) < 0.3
    is_init[0, 0], is_init[1, 0] = True, False
    stored = torch.zeros(n, t_len, 2, 5)
    # the initial state of the rows that do not start at t = 0 (at a start step mode zeroes it, as the primer's zeros)
    stored[:, 0] = torch.where(is_init[:, 0, :, None], 0.0, torch.randn(n, 2, 5))
    td = TensorDict({"obs": torch.randn(n, t_len, 3), "is_init": is_init, "recurrent_state": stored}, [n, t_len])
    with rf.set_recurrent_mode(True):
        seq = module(td.clone())
    state, feats = stored[:, 0], []
    for t in range(t_len):
        out = module(TensorDict({"obs": td["obs"][:, t], "is_init": is_init[:, t], "recurrent_state": state}, [n]))
        feats.append(out["feat"])
        state = out["next", "recurrent_state"]
    torch.testing.assert_close(torch.stack(feats, 1), seq["feat"])
    params = dict(module.rglru.named_parameters())
    want, _ = rf.rglru_sequence(td["obs"], stored[:, 0], params, is_init=is_init, reset_state=stored, **RG)
    scaled, _ = rf.rglru_sequence(td["obs"], stored[:, 0], params, is_init=is_init, reset_state=stored)
    torch.testing.assert_close(seq["feat"], want)
    assert not torch.allclose(seq["feat"], scaled)
    for other in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        assert other.segment_start == "recurrentgemma" and other._layout.cell is module._layout.cell
        with rf.set_recurrent_mode(True):
            torch.testing.assert_close(other(td.clone())["feat"], seq["feat"])
    ens = rf.EnsembleModule(module, 2)
    with rf.set_recurrent_mode(True):
        out = ens(td.clone())
    member = ens.member_params()[1]
    want_1, _ = rf.rglru_sequence(td["obs"], stored[:, 0], dict(member.items()), is_init=is_init, reset_state=stored,
                                  **RG)
    torch.testing.assert_close(out["feat"][1], want_1)


@pytest.mark.parametrize("backend,recompute", [("reference", "none"), ("scan", "none"), ("scan", "full"),
                                               ("parallel", "none"), ("parallel", "full")])
def test_option_second_order_and_forward_mode_are_exact(backend: str, recompute: str) -> None:
    """``gradgradcheck`` and forward-mode ``gradcheck`` (finite differences, fp64) through every input with the
    option, resets at t = 0 and inside, an initial state and ``reset_state``."""
    params, x, h0, reset, is_init = _option_case(seed=7, layers=1, n=2, t_len=4, f_in=2, hidden=2)
    is_init = torch.tensor([[True, False, True, False], [False, True, False, False]])
    names = list(params.keys())

    def fn(x, h0, reset, *ps):
        y, h = rf.rglru_sequence(x, h0, dict(zip(names, ps)), is_init=is_init, reset_state=reset, backend=backend,
                                 recompute=recompute, **RG)
        return y, h

    inputs = (x, h0, reset, *params.values())
    assert torch.autograd.gradgradcheck(fn, inputs)
    forward = lambda: torch.autograd.gradcheck(fn, inputs, check_forward_ad=True, check_backward_ad=False,  # noqa: E731
                                               check_undefined_grad=False, check_batched_grad=False)
    if backend == "parallel" and recompute == "full":  # its checkpointing cannot run under forward mode: refused
        with pytest.raises(ValueError, match="backend 'parallel' cannot serve recompute='full' under .* forward-mode"):
            forward()
    else:
        assert forward()


@pytest.mark.parametrize("backend", ["scan", "parallel"])
def test_vmap_over_stacked_params_with_the_option_equals_a_loop(backend: str) -> None:
    members = [_option_case(seed=s)[0] for s in (0, 1)]
    stacked = torch.stack([m.detach() for m in members])
    _, x, h0, reset, is_init = _option_case(seed=0)
    x, h0, reset = x.detach(), h0.detach(), reset.detach()
    run = lambda p, b: rf.rglru_sequence(x, h0, p, is_init=is_init, reset_state=reset, backend=b, **RG)[0]  # noqa: E731
    torch.testing.assert_close(torch.vmap(lambda p: run(p, backend))(stacked),
                               torch.stack([run(m.detach(), "reference") for m in members]))


def test_invalid_segment_start_names_the_argument_the_values_and_the_value() -> None:
    params, x, h0, _, is_init = _option_case(seed=0)
    message = r"segment_start: expected one of \['scaled', 'recurrentgemma'\], got 'griffin'"
    with pytest.raises(ValueError, match=message):
        rf.rglru_sequence(x, h0, params, segment_start="griffin")
    with pytest.raises(ValueError, match=message):
        rf.rglru_step(x[:, 0], h0, params, segment_start="griffin")
    with pytest.raises(ValueError, match=message):
        rf.RGLRUModule(3, 5, in_key="obs", out_key="feat", segment_start="griffin")
    with pytest.raises(ValueError, match=r"segment_start: .* got None"):
        rf.rglru_sequence(x, h0, params, segment_start=None)
