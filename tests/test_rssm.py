"""``rf.RSSMCoreV3`` / ``rf.rssm_core_step`` / ``rf.rssm_core_sequence`` against TorchRL's DreamerV3 RSSM core.

The oracle is TorchRL's own private core, ``RSSMPriorV3(recurrent_model="block_gru").rnn`` (``_DreamerV3BlockGRU``),
looped over time with the resets written out here. TorchRL's RMS norm upcasts to float32, which would cap an fp64
comparison at float32 precision; the autouse fixture patches ``_dreamer_v3_rms_norm`` with the same formula in the
input's dtype, so every comparison holds at ``assert_close``'s fp64 defaults (the prior test runs unpatched in fp32).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

mb = pytest.importorskip("torchrl.modules.models.model_based")

import rnn_functional as rf  # noqa: E402

S, A, P, H, NB, B, T = 6, 2, 4, 8, 2, 3, 5
PATHS = [("reference", "none"), ("scan", "none"), ("scan", "full"), ("auto", "none")]


def _rms_norm_in_dtype(value, weight, eps):
    return value * torch.rsqrt(value.square().mean(-1, keepdim=True) + eps) * weight


@pytest.fixture(autouse=True)
def _fp64_torchrl_rms_norm(request, monkeypatch):
    if "unpatched" not in request.node.name:
        monkeypatch.setattr(mb, "_dreamer_v3_rms_norm", _rms_norm_in_dtype)


def torchrl_core(layers: int = 1, seed: int = 0, dtype=torch.float64) -> nn.Module:
    """TorchRL's core as its prior builds it, with non-trivial norm scales and biases."""
    torch.manual_seed(seed)
    prior = mb.RSSMPriorV3(hidden_dim=P, rnn_hidden_dim=H, num_categoricals=2, num_classes=3, action_dim=A,
                           recurrent_model="block_gru", num_blocks=NB, num_layers=layers)
    core = prior.rnn.to(dtype)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in core.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return core


def torchrl_loop(core, s, a, h0, is_init=None, reset=None):
    """TorchRL's core over ``s [B, T, S]``, ``a [B, T, A]`` from ``h0 [B, H]``; where ``is_init`` the belief is
    replaced by ``reset [B, T, H]`` (or zeros) first."""
    h, ys = h0, []
    for t in range(s.shape[1]):
        if is_init is not None:
            h = torch.where(is_init[:, t, None], 0.0 if reset is None else reset[:, t], h)
        h = core(s[:, t], h, a[:, t])
        ys.append(h)
    return torch.stack(ys, 1), h


def inputs(seed: int = 1, batch: int = B, time: int = T):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(batch, time, S, generator=g, dtype=torch.float64)
    a = 3 * torch.randn(batch, time, A, generator=g, dtype=torch.float64)  # |a| > 1: the normalisation acts
    h0 = torch.randn(batch, H, generator=g, dtype=torch.float64)
    is_init = torch.rand(batch, time, generator=g) < 0.35
    is_init[0, 2] = True
    reset = torch.randn(batch, time, H, generator=g, dtype=torch.float64)
    return [t.requires_grad_(t.is_floating_point()) for t in (s, a, h0, is_init, reset)]


def grads(outputs, leaves):
    g = torch.Generator().manual_seed(7)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outputs)
    return torch.autograd.grad(loss, leaves, allow_unused=True, materialize_grads=True)


# ----------------------------------------------------------------------------- the module


@pytest.mark.parametrize("layers", [1, 2])
def test_state_dicts_load_both_ways(layers: int) -> None:
    theirs = torchrl_core(layers)
    ours = rf.RSSMCoreV3(state_dim=S, action_dim=A, hidden_dim=P, belief_dim=H, num_blocks=NB, num_layers=layers,
                         norm_eps=1e-4).double()
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    ours.load_state_dict(theirs.state_dict(), strict=True)
    fresh = torchrl_core(layers, seed=5)
    fresh.load_state_dict(ours.state_dict(), strict=True)
    s, a, h0, *_ = inputs()
    torch.testing.assert_close(ours(s[:, 0], h0, a[:, 0]), fresh(s[:, 0], h0, a[:, 0]))


def test_seeded_construction_draws_torchrl_weights() -> None:
    kw = dict(state_dim=S, action_dim=A, hidden_dim=P, belief_dim=H, num_blocks=NB, num_layers=2, norm_eps=1e-4)
    torch.manual_seed(3)
    theirs = mb._DreamerV3BlockGRU(**kw)
    torch.manual_seed(3)
    ours = rf.RSSMCoreV3(**kw)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for name, value in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[name], value), name


@pytest.mark.parametrize("layers", [1, 2])
def test_from_torchrl_shares_the_parameters_and_matches(layers: int) -> None:
    theirs = torchrl_core(layers)
    rng = torch.get_rng_state()
    ours = rf.RSSMCoreV3.from_torchrl(theirs)
    assert torch.equal(rng, torch.get_rng_state())  # no draw: a seeded script draws on as with TorchRL's core
    assert all(p is q for p, q in zip(ours.parameters(), theirs.parameters(), strict=True))
    s, a, h0, *_ = inputs()
    for batch in ((), (2,), (2, 3)):  # any batch dims, as TorchRL's
        args = (s[0, 0].expand(*batch, S), h0[0].expand(*batch, H), a[0, 0].expand(*batch, A))
        leaves = [s, a, h0, *theirs.parameters()]
        got, want = ours(*args), theirs(*args)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(grads([got], leaves), grads([want], leaves))


def test_prior_with_our_core_gives_torchrl_outputs_unpatched() -> None:
    """The one-liner in a prior (TorchRL's RMS norm as shipped, float32): logits, sampled state and belief equal."""
    torch.manual_seed(0)
    prior = mb.RSSMPriorV3(hidden_dim=P, rnn_hidden_dim=H, num_categoricals=2, num_classes=3, action_dim=A,
                           recurrent_model="block_gru", num_blocks=NB)
    s, a, h0 = torch.randn(4, S), 3 * torch.randn(4, A), torch.randn(4, H)
    torch.manual_seed(1)
    want = prior(s, h0, a)
    prior.rnn = rf.RSSMCoreV3.from_torchrl(prior.rnn)
    torch.manual_seed(1)
    got = prior(s, h0, a)
    for g, w in zip(got, want, strict=True):  # float32: our norm in the input's dtype, TorchRL's upcast is a no-op
        torch.testing.assert_close(g, w)


def test_any_activation_matches_torchrl_with_its_activation_swapped() -> None:
    theirs = torchrl_core(2)
    for seq in (theirs.belief_projection, theirs.state_projection, theirs.action_projection, theirs.hidden_layers):
        for i, m in enumerate(seq):
            if isinstance(m, nn.SiLU):
                seq[i] = nn.Sigmoid()
    s, a, h0, is_init, _ = inputs()
    leaves = [s, a, h0, *theirs.parameters()]
    want = torchrl_loop(theirs, s, a, h0, is_init)
    want_grads = grads(want, leaves)
    for backend in ("reference", "scan"):
        ours = rf.RSSMCoreV3.from_torchrl(theirs, activation_class=nn.Sigmoid)
        got = rf.rssm_core_sequence(torch.cat([s, a], -1), h0[:, None], dict(ours.named_parameters()), is_init=is_init,
                                    backend=backend, activation=ours.activation)
        got = (got[0], got[1][:, 0])
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(grads(got, leaves), want_grads)
        torch.testing.assert_close(ours(s[:, 0], h0, a[:, 0]), theirs(s[:, 0], h0, a[:, 0]))


# ----------------------------------------------------------------------------- the functions


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("resets", ["none", "zeros", "reset_state"])
@pytest.mark.parametrize("backend,recompute", PATHS)
def test_sequence_matches_torchrl(backend: str, recompute: str, layers: int, resets: str) -> None:
    core = torchrl_core(layers)
    params = dict(core.named_parameters())
    s, a, h0, is_init, reset = inputs()
    is_init, reset = (None, None) if resets == "none" else (is_init, reset if resets == "reset_state" else None)
    want = torchrl_loop(core, s, a, h0, is_init, reset)
    y, h = rf.rssm_core_sequence(torch.cat([s, a], -1), h0[:, None], params, is_init=is_init,
                                 reset_state=None if reset is None else reset[:, :, None], backend=backend,
                                 recompute=recompute)
    got = (y, h[:, 0])
    leaves = [t for t in (s, a, h0, reset, *params.values()) if t is not None]
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grads(got, leaves), grads(want, leaves))


def test_step_and_init() -> None:
    g = torch.Generator().manual_seed(0)
    params = rf.init_rssm_core_params(state_dim=S, action_dim=A, hidden_dim=P, belief_dim=H, num_blocks=NB,
                                      num_layers=2, dtype=torch.float64, generator=g)
    theirs = mb._DreamerV3BlockGRU(state_dim=S, action_dim=A, hidden_dim=P, belief_dim=H, num_blocks=NB, num_layers=2,
                                   norm_eps=1e-4)
    assert {k: tuple(v.shape) for k, v in params.items()} == {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    theirs.double().load_state_dict(dict(params.items()))
    s, a, h0, is_init, _ = inputs()
    y, h = rf.rssm_core_step(torch.cat([s[:, 0], a[:, 0]], -1), h0[:, None], params, is_init=is_init[:, 2])
    want = theirs(s[:, 0], torch.where(is_init[:, 2, None], 0.0, h0), a[:, 0])
    torch.testing.assert_close((y, h[:, 0]), (want, want))
    y0, _ = rf.rssm_core_step(torch.cat([s[:, 0], a[:, 0]], -1), None, params)
    torch.testing.assert_close(y0, theirs(s[:, 0], torch.zeros_like(h0), a[:, 0]))


def test_bad_params_and_inputs_are_named() -> None:
    params = dict(torchrl_core().named_parameters())
    x = torch.randn(B, T, S + A, dtype=torch.float64)
    with pytest.raises(KeyError, match=r"gates\.bias"):
        rf.rssm_core_sequence(x, None, {k: v for k, v in params.items() if k != "gates.bias"})
    with pytest.raises(ValueError, match=r"\bx\b"):
        rf.rssm_core_sequence(x[..., 1:], None, params)
    with pytest.raises(ValueError, match="state"):
        rf.rssm_core_sequence(x, torch.zeros(B, H, dtype=torch.float64), params)
    with pytest.raises(ValueError, match="'pad'") as info:
        rf.rssm_core_sequence(x, None, params, backend="pad")
    assert "['reference', 'scan']" in str(info.value)


# ----------------------------------------------------------------------------- resets (property)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 3), st.integers(1, 6), st.integers(0, 2**16), st.booleans(), st.sampled_from(["reference", "scan"]))
def test_no_information_crosses_a_reset(batch: int, time: int, seed: int, given_reset: bool, backend: str) -> None:
    params = dict(torchrl_core().named_parameters())
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, time, S + A, generator=g, dtype=torch.float64)
    h0 = torch.randn(batch, 1, H, generator=g, dtype=torch.float64)
    is_init = torch.rand(batch, time, generator=g) < 0.4
    reset = torch.randn(batch, time, 1, H, generator=g, dtype=torch.float64) if given_reset else None
    y, _ = rf.rssm_core_sequence(x, h0, params, is_init=is_init, reset_state=reset, backend=backend)
    for b in range(batch):
        starts = [t for t in range(time) if is_init[b, t]]
        for i, t0 in enumerate(starts):
            t1 = starts[i + 1] if i + 1 < len(starts) else time
            init = None if reset is None else reset[b : b + 1, t0]
            alone, _ = rf.rssm_core_sequence(x[b : b + 1, t0:t1], init, params, backend="reference")
            torch.testing.assert_close(y[b : b + 1, t0:t1], alone)


# ----------------------------------------------------------------------------- compile and vmap


def test_compiled_module_fullgraph_without_breaks_equals_torchrl() -> None:
    theirs = torchrl_core(2)
    ours = rf.RSSMCoreV3.from_torchrl(theirs)
    s, a, h0, *_ = inputs()
    leaves = [s, a, h0, *theirs.parameters()]

    def rollout(module):  # an imagination-style loop: the belief feeds the next step
        h = h0
        for t in range(T):
            h = module(s[:, t], h, a[:, t])
        return h

    torch._dynamo.reset()
    got = torch.compile(rollout, fullgraph=True, backend="aot_eager")(ours)  # fullgraph: a graph break raises
    want = rollout(theirs)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grads([got], leaves), grads([want], leaves))


@pytest.mark.parametrize("backend", ["scan", "auto"])
def test_compiled_sequence_fullgraph_equals_torchrl(backend: str) -> None:
    core = torchrl_core(2)
    params = dict(core.named_parameters())
    s, a, h0, is_init, reset = inputs()

    def run(x, h, p):
        return rf.rssm_core_sequence(x, h, p, is_init=is_init, reset_state=reset[:, :, None], backend=backend)

    torch._dynamo.reset()
    y, h = torch.compile(run, fullgraph=True, backend="aot_eager")(torch.cat([s, a], -1), h0[:, None], params)
    want = torchrl_loop(core, s, a, h0, is_init, reset)
    leaves = [s, a, h0, reset, *params.values()]
    torch.testing.assert_close((y, h[:, 0]), want)
    torch.testing.assert_close(grads((y, h[:, 0]), leaves), grads(want, leaves))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_vmap_over_an_ensemble_of_stacked_params(compiled: bool) -> None:
    cores = [torchrl_core(2, seed=i) for i in range(3)]
    stacked = {k: torch.stack([dict(c.named_parameters())[k] for c in cores]).detach().requires_grad_(True)
               for k in dict(cores[0].named_parameters())}
    s, a, h0, is_init, _ = inputs()
    x = torch.cat([s, a], -1)

    def run(p):
        return rf.rssm_core_sequence(x, h0[:, None], p, is_init=is_init, backend="scan")[0]

    fn = torch.vmap(run)
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(fn, fullgraph=True, backend="aot_eager")
    y = fn(stacked)
    got = grads([y], [s, *stacked.values()])
    for i, core in enumerate(cores):
        torch.testing.assert_close(y[i], torchrl_loop(core, s, a, h0, is_init)[0])
    wants = [torchrl_loop(core, s, a, h0, is_init)[0] for core in cores]
    want = grads([torch.stack(wants)], [s, *(p for c in cores for p in c.parameters())])
    torch.testing.assert_close(got[0], want[0])
    per_member = [want[1 + j::len(stacked)] for j in range(len(stacked))]
    for (name, g), w in zip(list(zip(stacked, got[1:])), per_member):
        torch.testing.assert_close(g, torch.stack(w), msg=name)
