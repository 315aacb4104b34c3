"""DreamerV3's block-diagonal GRU (issue 29) against an independent plain-PyTorch loop.

fp64 at ``assert_close`` defaults: outputs and gradients w.r.t. ``x``, the state, ``reset_state``
and every parameter, on every backend that serves the cell (``reference``, ``scan`` with
``recompute`` ``none``/``full``, ``auto``); ``pad`` and ``triton`` refuse it with an error naming
those that can; ``torch.vmap`` over stacked params equals a loop over the members; second order is
exact (``gradgradcheck``); ``reference`` and ``scan`` read nothing on the host.

The loop follows the issue's math literally, step by step and block by block (``torch.cat`` of
``[h_j, px, ph]`` per block ``j``, a per-block matmul for each block-linear layer), in the input's
dtype (TorchRL computes its RMS norm in float32; in fp64 we compute it in fp64).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

import rnn_functional as rf
from test_host_reads import HostReads

F_IN, H, P, NB, B, T = 3, 8, 4, 2, 3, 5
ACTIVATIONS = {"silu": F.silu, "tanh": torch.tanh, "relu": torch.relu}


# ----------------------------------------------------------------------------- the independent loop


def _rms_norm(v: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * weight


def _block_linear(z: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``weight [nb, in/nb, out/nb]``: block ``j`` of ``z`` times ``weight[j]``, blocks concatenated, plus ``bias [out]``."""
    blocks = z.chunk(weight.shape[0], -1)
    return torch.cat([blocks[j] @ weight[j] for j in range(weight.shape[0])], -1) + bias


def _num_dynamics_layers(params) -> int:
    return sum(1 for k in params.keys() if k.startswith("dynamic_linears.") and k.endswith(".weight"))


def block_gru_cell(x, h, p, act="silu", eps=1e-4, update_bias=-1.0):
    """One step: ``x [N, F]``, ``h [N, H]`` -> ``h' [N, H]``."""
    a = ACTIVATIONS[act] if isinstance(act, str) else act
    nb = p["gates.weight"].shape[0]
    px = a(_rms_norm(x @ p["input_linear.weight"].T + p["input_linear.bias"], p["input_norm.weight"], eps))
    ph = a(_rms_norm(h @ p["hidden_linear.weight"].T + p["hidden_linear.bias"], p["hidden_norm.weight"], eps))
    h_blocks = h.chunk(nb, -1)
    z = torch.cat([torch.cat([h_blocks[j], px, ph], -1) for j in range(nb)], -1)
    for k in range(_num_dynamics_layers(p)):
        z = _block_linear(z, p[f"dynamic_linears.{k}.weight"], p[f"dynamic_linears.{k}.bias"])
        z = a(_rms_norm(z, p[f"dynamic_norms.{k}.weight"], eps))
    gate_blocks = _block_linear(z, p["gates.weight"], p["gates.bias"]).chunk(nb, -1)  # nb x [N, 3H/nb]
    r = torch.cat([g.chunk(3, -1)[0] for g in gate_blocks], -1)
    c = torch.cat([g.chunk(3, -1)[1] for g in gate_blocks], -1)
    u = torch.cat([g.chunk(3, -1)[2] for g in gate_blocks], -1)
    r = torch.sigmoid(r)
    c = torch.tanh(r * c)
    u = torch.sigmoid(u + update_bias)
    return u * c + (1 - u) * h


def loop_block_gru(x, h0, params, is_init=None, reset=None, act="silu", eps=1e-4, update_bias=-1.0):
    """``x [B, T, F]``, ``h0 [B, 1, H]``, ``is_init [B, T]``, ``reset [B, T, 1, H]``: the issue's math, step by step."""
    h = h0[:, 0]
    ys = []
    for t in range(x.shape[1]):
        if is_init is not None:
            m = is_init[:, t, None]
            h = torch.where(m, torch.zeros_like(h) if reset is None else reset[:, t, 0], h)
        h = block_gru_cell(x[:, t], h, params, act, eps, update_bias)
        ys.append(h)
    return torch.stack(ys, 1), h[:, None]


def make_params(layers: int, seed: int = 0, dtype=torch.float64, **kwargs):
    """Init, then non-trivial norm weights and biases (the init's ones/zeros would hide their gradients)."""
    g = torch.Generator().manual_seed(seed)
    params = rf.init_block_gru_params(F_IN, H, projection_size=P, num_blocks=NB, num_layers=layers, dtype=dtype,
                                      generator=g, **kwargs)
    for key in list(params.keys()):
        if key.endswith("norm.weight") or key.startswith("dynamic_norms."):
            params[key] = 1 + 0.3 * torch.randn(params[key].shape, generator=g, dtype=dtype)
        elif key.endswith(".bias"):
            params[key] = 0.2 * torch.randn(params[key].shape, generator=g, dtype=dtype)
    return params


RESETS = ["none", "t0", "every", "random-zeros", "random-reset_state"]


def make_case(layers: int, resets: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed + 1)
    params = make_params(layers, seed)
    x = torch.randn(B, T, F_IN, generator=g, dtype=torch.float64)
    h0 = torch.randn(B, 1, H, generator=g, dtype=torch.float64)
    is_init = {
        "none": None,
        "t0": torch.zeros(B, T, dtype=torch.bool).index_fill_(1, torch.tensor([0]), True),
        "every": torch.ones(B, T, dtype=torch.bool),
    }.get(resets, torch.rand(B, T, generator=g) < 0.4)
    if resets.startswith("random"):
        is_init[0, 2] = True  # at least one interior reset
    reset = (torch.randn(B, T, 1, H, generator=g, dtype=torch.float64)
             if resets != "random-zeros" and is_init is not None else None)
    leaves = [x, h0, *([reset] if reset is not None else []), *params.values()]
    for t in leaves:
        t.requires_grad_(True)
    return SimpleNamespace(params=params, x=x, h0=h0, is_init=is_init, reset=reset, leaves=leaves)


def _grads(outputs, leaves):
    g = torch.Generator().manual_seed(7)
    # cotangents drawn in fp64 whatever the outputs' dtype (an fp32 draw would give other numbers)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype)).sum() for o in outputs)
    return torch.autograd.grad(loss, leaves, allow_unused=True, materialize_grads=True)


def test_the_loop_equals_torchrl() -> None:
    """The oracle itself: TorchRL's ``DreamerV3BlockGRU`` (its RMS norm patched to run in fp64) on our params."""
    pytest.importorskip("torchrl")
    import torchrl.modules.models.model_based as mb
    from torchrl.modules import DreamerV3BlockGRU

    c = make_case(2, "random-zeros")
    torch.manual_seed(0)
    m = DreamerV3BlockGRU(F_IN, H, projection_size=P, num_blocks=NB, num_layers=2, activation_class=torch.nn.Tanh,
                          norm_eps=1e-3, update_bias=-0.5).double()
    m.load_state_dict({f"cell.{k}": v.detach() for k, v in c.params.items()}, strict=True)
    rms64 = lambda v, w, eps: _rms_norm(v, w, eps)  # noqa: E731
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mb, "_dreamer_v3_rms_norm", rms64)
        want = m(c.x, c.h0[:, 0], c.is_init)
    y, h = loop_block_gru(c.x, c.h0, c.params, c.is_init, act="tanh", eps=1e-3, update_bias=-0.5)
    torch.testing.assert_close((y, h[:, 0]), want)


# ----------------------------------------------------------------------------- exactness

PATHS = [("reference", "none"), ("scan", "none"), ("scan", "full"), ("auto", "none")]


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("resets", RESETS)
@pytest.mark.parametrize("backend,recompute", PATHS)
def test_sequence_matches_loop(backend: str, recompute: str, layers: int, resets: str) -> None:
    c = make_case(layers, resets)
    want = loop_block_gru(c.x, c.h0, c.params, c.is_init, c.reset)
    got = rf.block_gru_sequence(c.x, c.h0, c.params, is_init=c.is_init, reset_state=c.reset, backend=backend,
                                recompute=recompute)
    assert got[0].shape == (B, T, H) and got[1].shape == (B, 1, H)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(_grads(got, c.leaves), _grads(want, c.leaves))


@pytest.mark.parametrize("act", ["silu", "tanh", "relu", torch.nn.Sigmoid(), torch.sin],
                         ids=["silu", "tanh", "relu", "Sigmoid-module", "torch.sin"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("backend,recompute", PATHS)
def test_activations_match_loop(backend: str, recompute: str, layers: int, act: str) -> None:
    c = make_case(layers, "random-reset_state", seed=2)
    want = loop_block_gru(c.x, c.h0, c.params, c.is_init, c.reset, act=act)
    got = rf.block_gru_sequence(c.x, c.h0, c.params, is_init=c.is_init, reset_state=c.reset, backend=backend,
                                recompute=recompute, activation=act)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(_grads(got, c.leaves), _grads(want, c.leaves))
    if backend == "reference" and layers == 2:  # the step, once per activation
        want_y, want_h = loop_block_gru(c.x[:, :1], c.h0, c.params, c.is_init[:, :1], act=act)
        step = rf.block_gru_step(c.x[:, 0], c.h0, c.params, is_init=c.is_init[:, 0], activation=act)
        torch.testing.assert_close(step, (want_y[:, 0], want_h))


@pytest.mark.parametrize("backend,recompute", PATHS)
def test_update_bias_and_norm_eps(backend: str, recompute: str) -> None:
    """Non-default ``update_bias`` and ``norm_eps`` (a large eps, so that a hard-coded 1e-4 would show)."""
    c = make_case(2, "random-reset_state", seed=3)
    kw = dict(update_bias=0.7, norm_eps=0.5)
    want = loop_block_gru(c.x, c.h0, c.params, c.is_init, c.reset, act="tanh", eps=0.5, update_bias=0.7)
    got = rf.block_gru_sequence(c.x, c.h0, c.params, is_init=c.is_init, reset_state=c.reset, backend=backend,
                                recompute=recompute, activation="tanh", **kw)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(_grads(got, c.leaves), _grads(want, c.leaves))
    step = rf.block_gru_step(c.x[:, 0], c.h0, c.params, activation="tanh", **kw)
    want_y, want_h = loop_block_gru(c.x[:, :1], c.h0, c.params, act="tanh", eps=0.5, update_bias=0.7)
    torch.testing.assert_close(step, (want_y[:, 0], want_h))


@pytest.mark.parametrize("backend,recompute", PATHS)
def test_no_state_is_zeros(backend: str, recompute: str) -> None:
    """``state=None``: a zero initial carry (with and without ``is_init``), outputs and gradients."""
    c = make_case(2, "random-zeros", seed=5)
    zeros = torch.zeros(B, 1, H, dtype=torch.float64)
    leaves = [c.x, *c.params.values()]
    for is_init in (None, c.is_init):
        got = rf.block_gru_sequence(c.x, None, c.params, is_init=is_init, backend=backend, recompute=recompute)
        want = loop_block_gru(c.x, zeros, c.params, is_init)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(_grads(got, leaves), _grads(want, leaves))


@pytest.mark.parametrize("backend", ["reference", "scan"])
def test_segment_states(backend: str) -> None:
    """``return_segment_states``: the carry at every segment end, zeros elsewhere."""
    c = make_case(2, "random-reset_state")
    y, h_T, seg = rf.block_gru_sequence(c.x, c.h0, c.params, is_init=c.is_init, reset_state=c.reset,
                                        backend=backend, return_segment_states=True)
    assert seg.shape == (B, T, 1, H)
    ends = torch.cat([c.is_init[:, 1:], torch.ones(B, 1, dtype=torch.bool)], 1)
    for t in range(T):
        _, h_t = loop_block_gru(c.x[:, : t + 1], c.h0, c.params, c.is_init[:, : t + 1], c.reset[:, : t + 1])
        torch.testing.assert_close(seg[:, t], torch.where(ends[:, t, None, None], h_t, 0.0))
    torch.testing.assert_close(seg[:, -1], h_T)
    # without is_init: one segment per row, its carry at the last step
    _, h_T, seg = rf.block_gru_sequence(c.x, c.h0, c.params, backend=backend, return_segment_states=True)
    torch.testing.assert_close(seg[:, -1], h_T)
    torch.testing.assert_close(seg[:, :-1], torch.zeros_like(seg[:, :-1]))
    torch.testing.assert_close(h_T, loop_block_gru(c.x, c.h0, c.params)[1])


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("mask_shape", ["[B]", "[B, 1]"])
def test_step_matches_loop(layers: int, mask_shape: str) -> None:
    c = make_case(layers, "none")
    is_init = torch.tensor([True, False, True])
    mask = is_init if mask_shape == "[B]" else is_init[:, None]
    for backend in ("reference", "auto"):  # step backends (``scan`` is a sequence backend)
        want_y, want_h = loop_block_gru(c.x[:, :1], c.h0, c.params, is_init[:, None])
        y, h = rf.block_gru_step(c.x[:, 0], c.h0, c.params, is_init=mask, backend=backend)
        assert y.shape == (B, H) and h.shape == (B, 1, H)
        torch.testing.assert_close((y, h), (want_y[:, 0], want_h))
        torch.testing.assert_close(_grads((y, h), c.leaves), _grads((want_y, want_h), c.leaves))
    # no state: zeros
    y, h = rf.block_gru_step(c.x[:, 0], None, c.params)
    want_y, want_h = loop_block_gru(c.x[:, :1], torch.zeros_like(c.h0), c.params)
    torch.testing.assert_close((y, h), (want_y[:, 0], want_h))


def test_multi_step_rollout_equals_sequence() -> None:
    """Imagination: ``T`` calls of the step equal one sequence call, batch dims ``[2, 3]``, with resets."""
    params = make_params(2)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, T, F_IN, generator=g, dtype=torch.float64)
    h0 = torch.randn(2, 3, 1, H, generator=g, dtype=torch.float64)
    is_init = torch.rand(2, 3, T, generator=g) < 0.3
    is_init[0, 1, 2] = True
    y_seq, h_seq = rf.block_gru_sequence(x, h0, params, is_init=is_init)
    assert y_seq.shape == (2, 3, T, H) and h_seq.shape == (2, 3, 1, H)
    h, ys = h0, []
    for t in range(T):
        y, h = rf.block_gru_step(x[:, :, t], h, params, is_init=is_init[:, :, t])
        ys.append(y)
    torch.testing.assert_close((torch.stack(ys, 2), h), (y_seq, h_seq))
    want_y, want_h = loop_block_gru(x.flatten(0, 1), h0.flatten(0, 1), params, is_init.flatten(0, 1))
    torch.testing.assert_close((y_seq, h_seq), (want_y.unflatten(0, (2, 3)), want_h.unflatten(0, (2, 3))))


@pytest.mark.parametrize("backend", ["reference", "scan", "auto"])
def test_batch_dims(backend: str) -> None:
    """Batch dims ``[2, 3]`` (with ``reset_state``) and no batch dims at all, against the loop."""
    params = make_params(1, seed=4)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 3, T, F_IN, generator=g, dtype=torch.float64)
    h0 = torch.randn(2, 3, 1, H, generator=g, dtype=torch.float64)
    is_init = torch.rand(2, 3, T, generator=g) < 0.4
    reset = torch.randn(2, 3, T, 1, H, generator=g, dtype=torch.float64)
    y, h = rf.block_gru_sequence(x, h0, params, is_init=is_init, reset_state=reset, backend=backend)
    want_y, want_h = loop_block_gru(x.flatten(0, 1), h0.flatten(0, 1), params, is_init.flatten(0, 1),
                                    reset.flatten(0, 1))
    torch.testing.assert_close((y, h), (want_y.unflatten(0, (2, 3)), want_h.unflatten(0, (2, 3))))
    # no batch dims: x [T, F], state [1, H], is_init [T], reset_state [T, 1, H]
    y, h = rf.block_gru_sequence(x[0, 0], h0[0, 0], params, is_init=is_init[0, 0], reset_state=reset[0, 0],
                                 backend=backend)
    assert y.shape == (T, H) and h.shape == (1, H)
    want_y, want_h = loop_block_gru(x[0, :1], h0[0, :1], params, is_init[0, :1], reset[0, :1])
    torch.testing.assert_close((y, h), (want_y[0], want_h[0]))
    step_backend = "reference" if backend == "scan" else backend
    y, h = rf.block_gru_step(x[0, 0, 0], h0[0, 0], params, is_init=is_init[0, 0, 0], backend=step_backend)
    assert y.shape == (H,) and h.shape == (1, H)
    want_y, want_h = loop_block_gru(x[0, :1, :1], h0[0, :1], params, is_init[0, :1, :1])
    torch.testing.assert_close((y, h), (want_y[0, 0], want_h[0]))


def test_float32_scan_against_float64_reference() -> None:
    """fp32 ``scan`` against the fp64 loop. Over 5 steps of width 8 the fp32 rounding (~6e-8 relative per op,
    a few dozen ops per step, RMS norms that keep activations O(1)) stays below ~1e-6; ``rtol=1e-4, atol=1e-5``
    leaves a 10-100x margin while any wrong reset, gate order or missing term shows at O(1e-2..1e-1)."""
    c = make_case(2, "random-reset_state")
    p32 = c.params.apply(lambda t: t.detach().float().requires_grad_(True))
    leaves32 = [c.x.detach().float().requires_grad_(True), c.h0.detach().float().requires_grad_(True),
                c.reset.detach().float().requires_grad_(True), *p32.values()]
    got = rf.block_gru_sequence(leaves32[0], leaves32[1], p32, is_init=c.is_init, reset_state=leaves32[2],
                                backend="scan")
    assert got[0].dtype == torch.float32 and got[1].dtype == torch.float32
    want = loop_block_gru(c.x, c.h0, c.params, c.is_init, c.reset)
    tol = dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got, want, check_dtype=False, **tol)
    gw = [g.float() for g in _grads(want, c.leaves)]
    torch.testing.assert_close(_grads(got, leaves32), tuple(gw), **tol)


# ----------------------------------------------------------------------------- init


def test_init_matches_torchrl_shapes_and_distribution() -> None:
    pytest.importorskip("torchrl")
    from torchrl.modules import DreamerV3BlockGRUCell

    f, h, p, nb, layers = 16, 64, 32, 4, 2
    params = rf.init_block_gru_params(f, h, projection_size=p, num_blocks=nb, num_layers=layers,
                                      dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    torchrl_sd = DreamerV3BlockGRUCell(f, h, projection_size=p, num_blocks=nb, num_layers=layers).state_dict()
    assert {k: tuple(v.shape) for k, v in params.items()} == {k: tuple(v.shape) for k, v in torchrl_sd.items()}
    assert params.batch_size == torch.Size([])
    assert all(v.dtype == torch.float64 for v in params.values())
    fan_in = {"input_linear.weight": f, "hidden_linear.weight": h, "dynamic_linears.0.weight": h + 2 * p * nb,
              "dynamic_linears.1.weight": h, "gates.weight": h}
    for key, value in params.items():
        if key in fan_in:
            std = 1.1368 / math.sqrt(fan_in[key])
            assert value.abs().max() <= 2 * std + 1e-12, key  # truncated at two standard deviations
            # a normal truncated at +-2 std has std 0.8796 std
            assert abs(value.std().item() / (0.8796 * std) - 1) < 0.15, key
        elif key.endswith("norm.weight") or key.startswith("dynamic_norms."):
            assert torch.equal(value, torch.ones_like(value)), key
        else:
            assert key.endswith(".bias") and torch.equal(value, torch.zeros_like(value)), key
    again = rf.init_block_gru_params(f, h, projection_size=p, num_blocks=nb, num_layers=layers,
                                     dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert all(torch.equal(params[k], again[k]) for k in params.keys())
    # defaults: projection 512, 8 blocks, one dynamics layer, the default dtype
    default = rf.init_block_gru_params(f, h)
    torchrl_default = DreamerV3BlockGRUCell(f, h).state_dict()
    assert {k: tuple(v.shape) for k, v in default.items()} == {k: tuple(v.shape) for k, v in torchrl_default.items()}
    assert default["gates.bias"].dtype == torch.get_default_dtype()


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("backend", ["pad", "triton"])
def test_pad_and_triton_refuse_it(backend: str) -> None:
    params = rf.init_block_gru_params(F_IN, H, projection_size=P, num_blocks=NB)
    calls = [(lambda: rf.block_gru_sequence(torch.randn(B, T, F_IN), None, params, backend=backend), "['reference', 'scan']"),
             (lambda: rf.block_gru_step(torch.randn(B, F_IN), None, params, backend=backend), "['reference']")]
    for call, serving in calls:  # a step names the step backends: 'scan' runs sequences only
        with pytest.raises(ValueError, match=f"'?{backend}'?") as info:
            call()
        assert f"Use one of {serving}" in str(info.value), str(info.value)


def test_bad_arguments_are_named() -> None:
    params = rf.init_block_gru_params(F_IN, H, projection_size=P, num_blocks=NB)
    x = torch.randn(B, T, F_IN)
    with pytest.raises(ValueError, match="activation") as info:
        rf.block_gru_sequence(x, None, params, activation="gelu")
    assert "gelu" in str(info.value) and "callable" in str(info.value)
    with pytest.raises(ValueError, match="activation"):
        rf.block_gru_sequence(x, None, params, activation=3)
    with pytest.raises(ValueError, match="activation"):
        rf.block_gru_step(x[:, 0], None, params, activation="gelu")
    with pytest.raises(ValueError, match=r"\bx\b"):
        rf.block_gru_sequence(torch.randn(B, T, F_IN + 1), None, params)
    with pytest.raises(ValueError, match=r"\bx\b"):
        rf.block_gru_step(torch.randn(B, F_IN + 1), None, params)
    with pytest.raises(ValueError, match="state"):
        rf.block_gru_sequence(x, torch.zeros(B, H), params)  # missing the layer dim
    with pytest.raises(ValueError, match="state"):
        rf.block_gru_sequence(x, torch.zeros(B, 1, H + 1), params)
    with pytest.raises(ValueError, match="state"):
        rf.block_gru_step(x[:, 0], torch.zeros(B, 1, H + 2), params)
    with pytest.raises((KeyError, ValueError), match=r"gates\.bias"):
        rf.block_gru_sequence(x, None, params.exclude("gates.bias"))
    with pytest.raises((KeyError, ValueError), match=r"hidden_norm\.weight"):
        rf.block_gru_step(x[:, 0], None, params.exclude("hidden_norm.weight"))
    two = rf.init_block_gru_params(F_IN, H, projection_size=P, num_blocks=NB, num_layers=2)
    with pytest.raises((KeyError, ValueError), match=r"dynamic_linears\.1\.bias"):
        rf.block_gru_sequence(x, None, two.exclude("dynamic_linears.1.bias"))


# ----------------------------------------------------------------------------- vmap and second order


@pytest.mark.parametrize("backend,recompute", PATHS)
def test_vmap_over_stacked_params_equals_loop(backend: str, recompute: str) -> None:
    members = [make_params(2, seed=s) for s in range(2)]
    stacked = torch.stack(members).apply(lambda t: t.detach().requires_grad_(True))
    c = make_case(2, "random-reset_state")
    run = torch.vmap(lambda x, h0, p: rf.block_gru_sequence(x, h0, p, is_init=c.is_init, reset_state=c.reset,
                                                            backend=backend, recompute=recompute),
                     in_dims=(None, None, 0))
    y, h = run(c.x, c.h0, stacked)
    loops = [loop_block_gru(c.x, c.h0, stacked[i], c.is_init, c.reset) for i in range(2)]
    for i in range(2):
        torch.testing.assert_close((y[i], h[i]), loops[i])
    leaves = [c.x, c.h0, c.reset, *stacked.values()]
    got = _grads((y, h), leaves)
    want = _grads((torch.stack([o[0] for o in loops]), torch.stack([o[1] for o in loops])), leaves)
    torch.testing.assert_close(got, want)


def test_vmap_func_grad_over_stacked_params() -> None:
    """``torch.func.grad`` of a summed loss wrt the params, vmapped over the members, equals autograd per member."""
    members = [make_params(1, seed=s) for s in range(2)]
    stacked = torch.stack(members)
    c = make_case(1, "random-zeros")
    x, h0 = c.x.detach(), c.h0.detach()

    def loss(p):
        y, h = rf.block_gru_sequence(x, h0, p, is_init=c.is_init, backend="scan")
        return (y * torch.linspace(-1, 1, H, dtype=y.dtype)).sum() + h.pow(2).sum()

    got = torch.vmap(torch.func.grad(loss))(stacked)
    for i, member in enumerate(members):
        p = member.apply(lambda t: t.detach().requires_grad_(True))
        y, h = loop_block_gru(x, h0, p, c.is_init)
        want = torch.autograd.grad((y * torch.linspace(-1, 1, H, dtype=y.dtype)).sum() + h.pow(2).sum(),
                                   list(p.values()))
        torch.testing.assert_close(tuple(got[i][k] for k in p.keys()), want)


@pytest.mark.parametrize("backend", ["reference", "scan"])
def test_double_backward_is_exact(backend: str) -> None:
    """``gradgradcheck`` against finite differences in fp64, every input (``x``, ``h0``, ``reset_state``, params)."""
    f, h, p, nb, n, t = 2, 4, 2, 2, 2, 3
    g = torch.Generator().manual_seed(0)
    params = rf.init_block_gru_params(f, h, projection_size=p, num_blocks=nb, dtype=torch.float64, generator=g)
    names = list(params.keys())
    x = torch.randn(n, t, f, generator=g, dtype=torch.float64)
    h0 = torch.randn(n, 1, h, generator=g, dtype=torch.float64)
    reset = torch.randn(n, t, 1, h, generator=g, dtype=torch.float64)
    is_init = torch.tensor([[False, True, False], [False, False, True]])
    values = [v + 0.2 * torch.randn(v.shape, generator=g, dtype=torch.float64) for v in params.values()]

    def fn(x, h0, reset, *ps):
        y, h_T = rf.block_gru_sequence(x, h0, TensorDict(dict(zip(names, ps)), []), is_init=is_init,
                                       reset_state=reset, backend=backend)
        return y, h_T

    inputs = tuple(v.requires_grad_(True) for v in (x, h0, reset, *values))
    assert torch.autograd.gradgradcheck(fn, inputs)


# ----------------------------------------------------------------------------- host reads


@pytest.mark.parametrize("backend", ["reference", "scan"])
def test_device_backends_read_nothing(backend: str) -> None:
    params = rf.init_block_gru_params(F_IN, H, projection_size=P, num_blocks=NB, num_layers=2)
    is_init = torch.zeros(B, T, dtype=torch.bool)
    is_init[:, 0] = True
    is_init[1, 2] = is_init[2, 4] = True
    x = torch.randn(B, T, F_IN, requires_grad=True)
    reset = torch.randn(B, T, 1, H)
    with HostReads() as reads:
        y, h, seg = rf.block_gru_sequence(x, None, params, is_init=is_init, reset_state=reset, backend=backend,
                                          return_segment_states=True)
        rf.block_gru_sequence(x, None, params, is_init=is_init, backend=backend)
        rf.block_gru_sequence(x, None, params, backend=backend)
        rf.block_gru_step(x[:, 0], h, params, is_init=is_init[:, 1], backend="reference")
        rf.block_gru_step(x[:, 0], h, params, is_init=is_init[:, 1])
    assert reads.seen == []
    with HostReads() as reads:  # the backward too
        (y.sum() + h.sum()).backward()
    assert reads.seen == []


@pytest.mark.parametrize("backend", ["auto", "reference", "scan"])
def test_eager_auto_reads_is_init_at_most_once(backend: str) -> None:
    """The call budget: ``auto`` reads ``is_init`` once to plan its route, forward and backward included."""
    c = make_case(1, "random-reset_state")
    with HostReads() as reads:
        y, h = rf.block_gru_sequence(c.x, c.h0, c.params, is_init=c.is_init, reset_state=c.reset, backend=backend)
        (y.sum() + h.sum()).backward()
    assert len(reads.seen) <= (1 if backend == "auto" else 0), reads.seen


# ----------------------------------------------------------------------------- forward mode


@pytest.mark.parametrize("backend,recompute", PATHS)
def test_forward_mode_matches_the_loop(backend: str, recompute: str) -> None:
    """``torch.func.jvp`` (forward-mode AD) is exact on every backend that serves the cell."""
    c = make_case(2, "random-reset_state")
    names = list(c.params.keys())
    g = torch.Generator().manual_seed(3)
    primals = (c.x.detach(), c.h0.detach(), c.reset.detach(), *(v.detach() for v in c.params.values()))
    tangents = tuple(torch.randn(t.shape, generator=g, dtype=t.dtype) for t in primals)

    def ours(x, h0, reset, *ps):
        return rf.block_gru_sequence(x, h0, dict(zip(names, ps)), is_init=c.is_init, reset_state=reset,
                                     backend=backend, recompute=recompute)

    def loop(x, h0, reset, *ps):
        return loop_block_gru(x, h0, dict(zip(names, ps)), c.is_init, reset)

    torch.testing.assert_close(torch.func.jvp(ours, primals, tangents), torch.func.jvp(loop, primals, tangents))


# ----------------------------------------------------------------------------- reset properties (hypothesis)


@st.composite
def _problems(draw):
    batch, time, layers = draw(st.integers(1, 3)), draw(st.integers(1, 6)), draw(st.integers(1, 2))
    mask = draw(st.lists(st.booleans(), min_size=batch * time, max_size=batch * time))
    use_reset_state, seed = draw(st.booleans()), draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    params = make_params(layers, seed)
    x = torch.randn(batch, time, F_IN, generator=g, dtype=torch.float64)
    h0 = torch.randn(batch, 1, H, generator=g, dtype=torch.float64)
    reset = torch.randn(batch, time, 1, H, generator=g, dtype=torch.float64) if use_reset_state else None
    return params, x, h0, torch.tensor(mask).reshape(batch, time), reset


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_problems(), st.sampled_from(["reference", "scan", "auto"]))
def test_no_information_crosses_a_reset(problem, backend: str) -> None:
    """Every segment's outputs equal a fresh run of that segment alone from its ``reset_state`` (or zeros), and
    perturbing the inputs before a row's last reset changes nothing after it."""
    params, x, h0, is_init, reset = problem
    y, _ = rf.block_gru_sequence(x, h0, params, is_init=is_init, reset_state=reset, backend=backend)
    for b in range(x.shape[0]):
        starts = [t for t in range(x.shape[1]) if is_init[b, t]]
        for i, t0 in enumerate(starts):
            t1 = starts[i + 1] if i + 1 < len(starts) else x.shape[1]
            init = None if reset is None else reset[b : b + 1, t0]
            alone, _ = rf.block_gru_sequence(x[b : b + 1, t0:t1], init, params, backend=backend)
            torch.testing.assert_close(y[b : b + 1, t0:t1], alone)
        if starts:
            x2 = x.clone()
            x2[b, : starts[-1]] += 1.0
            y2, _ = rf.block_gru_sequence(x2, h0, params, is_init=is_init, reset_state=reset, backend=backend)
            torch.testing.assert_close(y2[b, starts[-1] :], y[b, starts[-1] :])


# ----------------------------------------------------------------------------- layouts users produce


@pytest.mark.parametrize("backend,recompute", PATHS)
def test_strided_inputs_match_contiguous(backend: str, recompute: str) -> None:
    """Non-contiguous ``x``, ``h0``, ``is_init`` and ``reset_state`` (time-major storage, transposed) give the
    contiguous call's outputs and gradients."""
    c = make_case(2, "random-reset_state")
    strided = [torch.stack([t, t], -1)[..., 0] for t in (c.x, c.h0, c.reset)]  # every last-dim stride 2
    assert not any(t.is_contiguous() for t in strided)
    mask = torch.stack([c.is_init, c.is_init], -1)[..., 0]
    got = rf.block_gru_sequence(strided[0], strided[1], c.params, is_init=mask, reset_state=strided[2],
                                backend=backend, recompute=recompute)
    want = loop_block_gru(c.x, c.h0, c.params, c.is_init, c.reset)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(_grads(got, c.leaves), _grads(want, c.leaves))


@pytest.mark.parametrize("backend", ["reference", "scan", "auto"])
def test_empty_batch_and_empty_time(backend: str) -> None:
    """``N = 0`` and ``T = 0``: the right shapes, the carry passed through, zero gradients into every parameter."""
    params = make_params(1).apply(lambda t: t.requires_grad_(True))
    h0 = torch.randn(2, 1, H, dtype=torch.float64)
    y, h = rf.block_gru_sequence(torch.zeros(0, 4, F_IN, dtype=torch.float64), None, params, backend=backend)
    assert y.shape == (0, 4, H) and h.shape == (0, 1, H)
    y2, h2 = rf.block_gru_sequence(torch.zeros(2, 0, F_IN, dtype=torch.float64), h0, params, backend=backend)
    assert y2.shape == (2, 0, H)
    torch.testing.assert_close(h2, h0)
    grads = torch.autograd.grad(y.sum() + h.sum() + y2.sum() + h2.sum(), list(params.values()))
    assert all(torch.count_nonzero(g) == 0 for g in grads)
    ys, hs = rf.block_gru_step(torch.zeros(0, F_IN, dtype=torch.float64), None, params)
    assert ys.shape == (0, H) and hs.shape == (0, 1, H)
