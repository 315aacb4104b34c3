"""``MultiAgentGRU`` / ``MultiAgentLSTM``: TorchRL's multi-agent conventions over the functional core.

Oracles: single-agent ``GRUModule``/``LSTMModule`` (which are tested against ``torch.nn`` elsewhere) run on one
agent's trajectory alone with that agent's weights (``agent_params(i)``); inputs concatenated by hand for
``centralized``; a step-by-step rollout for recurrent mode. fp64 comparisons use ``assert_close`` defaults; the
one compiled comparison with gradients runs fp32 at defaults too (the same ops in the same order).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torch.func import functional_call, stack_module_state

import rnn_functional as rf

F, H = 3, 4
CELLS = {"gru": (rf.MultiAgentGRU, rf.GRUModule, ("recurrent_state",)),
         "lstm": (rf.MultiAgentLSTM, rf.LSTMModule, ("recurrent_state_h", "recurrent_state_c"))}
SETTINGS = dict(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make(cell, n, *, layers=1, dtype=torch.float64, seed=0, **kwargs):
    torch.manual_seed(seed)
    return CELLS[cell][0](F, H, n, num_layers=layers, dtype=dtype, **kwargs)


def make_td(cell, lead, n, *, layers=1, p_reset=0.3, group_init=True, states=True, width=F, dtype=torch.float64):
    """A multi-agent TensorDict ``lead`` (``[*B]`` or ``[*B, T]``) with random inputs, per-agent resets, states."""
    agents = {"observation": torch.randn(*lead, n, width, dtype=dtype)}
    if group_init:
        agents["is_init"] = torch.rand(*lead, n, 1) < p_reset
    if states:
        for name in CELLS[cell][2]:
            agents[name] = torch.randn(*lead, n, layers, H, dtype=dtype)
    td = TensorDict({"agents": TensorDict(agents, [*lead, n])}, lead)
    if not group_init:
        td["is_init"] = torch.rand(*lead, 1) < p_reset
    return td


def single_agent(cell, module, i, layers, width=F):
    """A single-agent module holding agent ``i``'s weights."""
    _, cls, names = CELLS[cell]
    single = cls(width, H, layers, in_keys=["x", *names], out_keys=["y", *[("next", k) for k in names]])
    single = single.to(torch.float64)
    getattr(single, cell).load_state_dict(dict(module.agent_params(i).items()))
    return single


def agent_slice(cell, td, i, x=None):
    """Agent ``i``'s trajectory as a single-agent TensorDict (``x``: its input, default the observation)."""
    a = td["agents"]
    out = TensorDict({"x": a["observation"][..., i, :] if x is None else x,
                      "is_init": a["is_init"][..., i, :] if "is_init" in a.keys() else td["is_init"]}, td.batch_size)
    for name in CELLS[cell][2]:
        if name in a.keys():
            out[name] = a[name][..., i, :, :]
    return out


def run(module, td, recurrent):
    with rf.set_recurrent_mode(recurrent):
        return module(td.clone())


def check_against_single_agents(cell, module, td, recurrent, layers, inputs=None):
    out = run(module, td, recurrent)
    for i in range(module.n_agents):
        ref = run(single_agent(cell, module, i, layers, F if inputs is None else inputs.shape[-1]),
                  agent_slice(cell, td, i, None if inputs is None else inputs), recurrent)
        torch.testing.assert_close(out["agents", "embed"][..., i, :], ref["y"])
        for name in CELLS[cell][2]:
            torch.testing.assert_close(out["next", "agents", name][..., i, :, :], ref["next", name])


@st.composite
def problems(draw):
    return dict(cell=draw(st.sampled_from(sorted(CELLS))), share=draw(st.booleans()), recurrent=draw(st.booleans()),
                lead=(draw(st.integers(1, 2)), draw(st.integers(1, 6))), n=draw(st.integers(1, 3)),
                layers=draw(st.integers(1, 2)), group_init=draw(st.booleans()), states=draw(st.booleans()),
                backend=draw(st.sampled_from(["reference", "scan", "pad", "auto"])), seed=draw(st.integers(0, 99)))


@settings(**SETTINGS)
@given(problems())
def test_every_agent_equals_a_single_agent_module_on_its_own_trajectory(p) -> None:
    """Per-agent resets, shared and per-agent weights, both modes: agent i's outputs and next states are those of
    a single-agent module run on agent i's trajectory alone with agent i's weights."""
    torch.manual_seed(p["seed"])
    module = make(p["cell"], p["n"], layers=p["layers"], share_params=p["share"], recurrent_backend=p["backend"])
    td = make_td(p["cell"], p["lead"] if p["recurrent"] else p["lead"][:1], p["n"], layers=p["layers"],
                 group_init=p["group_init"], states=p["states"])
    check_against_single_agents(p["cell"], module, td, p["recurrent"], p["layers"])


@settings(**SETTINGS)
@given(problems(), st.data())
def test_no_state_crosses_any_agents_reset(p, data) -> None:
    """Changing agent j's inputs and stored states before its last reset changes nothing of agent j from that reset
    on, and nothing of any other agent."""
    n, T = p["n"], p["lead"][1] + 1
    module = make(p["cell"], n, layers=p["layers"], share_params=p["share"], recurrent_backend=p["backend"])
    td = make_td(p["cell"], (p["lead"][0], T), n, layers=p["layers"])
    j, r = data.draw(st.integers(0, n - 1)), data.draw(st.integers(1, T - 1))
    td["agents", "is_init"][:, r, j] = True
    before = td.clone()
    before["agents", "observation"][:, :r, j] += 1.0
    for name in CELLS[p["cell"]][2]:
        before["agents", name][:, :r, j] -= 0.5  # stored states up to the reset, not the one it restarts from
    a, b = run(module, td, True), run(module, before, True)
    others = [i for i in range(n) if i != j]
    torch.testing.assert_close(a["agents", "embed"][:, r:, j], b["agents", "embed"][:, r:, j])
    torch.testing.assert_close(a["agents", "embed"][:, :, others], b["agents", "embed"][:, :, others])
    for name in CELLS[p["cell"]][2]:
        torch.testing.assert_close(a["next", "agents", name][:, r:, j], b["next", "agents", name][:, r:, j])
        torch.testing.assert_close(a["next", "agents", name][:, :, others], b["next", "agents", name][:, :, others])


@pytest.mark.parametrize("cell", sorted(CELLS))
@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("recurrent", [False, True])
def test_centralized_reads_all_agents_inputs_concatenated(cell, share, recurrent) -> None:
    n = 3
    module = make(cell, n, centralized=True, share_params=share)
    assert module.agent_params(1)["weight_ih_l0"].shape[-1] == n * F
    td = make_td(cell, (2, 5) if recurrent else (2,), n)
    by_hand = td["agents", "observation"].flatten(-2)  # agent 0's features, then agent 1's, ...
    check_against_single_agents(cell, module, td, recurrent, 1, inputs=by_hand)


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_shared_weights_are_one_set_and_per_agent_weights_are_the_stacked_ones(cell) -> None:
    shared, own = make(cell, 3, layers=2), make(cell, 3, layers=2, share_params=False)
    names = set(getattr(torch.nn, cell.upper())(F, H, 2).state_dict())
    assert set(shared.state_dict()) == set(own.state_dict()) == names
    for k in names:
        assert all(shared.agent_params(i)[k] is getattr(shared, k) for i in range(3))
        stacked = getattr(own, k)
        assert stacked.shape[0] == 3 and not torch.equal(stacked[0], stacked[1])  # one draw per agent
        assert all(torch.equal(own.agent_params(i)[k], stacked[i]) for i in range(3))
    # per-agent weights that are all equal compute what shared weights compute
    own.load_state_dict({k: v.expand(3, *v.shape) for k, v in shared.state_dict().items()})
    td = make_td(cell, (2, 4), 3, layers=2)
    torch.testing.assert_close(run(own, td, True)["agents", "embed"], run(shared, td, True)["agents", "embed"])
    with pytest.raises(IndexError, match="agent 3 out of range for n_agents=3"):
        shared.agent_params(3)


@pytest.mark.parametrize("cell", sorted(CELLS))
@pytest.mark.parametrize("share", [True, False])
def test_a_step_by_step_rollout_with_per_agent_resets_equals_recurrent_mode(cell, share) -> None:
    """A collector's loop by hand: per-agent resets (zero states stored at each reset, as a primer writes), the
    ("next", "agents", ...) states carried to the next step; recurrent mode on the stacked rollout gives the same
    outputs, and the same next states wherever a segment ends."""
    B, T, n, names = 2, 7, 3, CELLS[cell][2]
    module = make(cell, n, share_params=share)
    torch.manual_seed(1)
    obs, is_init = torch.randn(B, T, n, F, dtype=torch.float64), torch.rand(B, T, n, 1) < 0.25
    is_init[:, 0] = True
    carried = {k: torch.zeros(B, n, 1, H, dtype=torch.float64) for k in names}
    steps = []
    for t in range(T):
        td = TensorDict({"agents": TensorDict({"observation": obs[:, t], "is_init": is_init[:, t]}, [B, n])}, [B])
        for k in names:
            td["agents", k] = torch.where(is_init[:, t, :, :, None], 0.0, carried[k])
        module(td)
        steps.append(td)
        carried = {k: td["next", "agents", k] for k in names}
    rollout = torch.stack(steps, 1)
    assert rollout["next", "agents", names[0]].shape == (B, T, n, 1, H)
    replay = run(module, rollout.exclude("next"), True)
    torch.testing.assert_close(replay["agents", "embed"], rollout["agents", "embed"])
    seg_end = torch.cat([is_init[:, 1:], torch.ones_like(is_init[:, :1])], 1)[..., None].expand(B, T, n, 1, H)
    for k in names:
        torch.testing.assert_close(replay["next", "agents", k][seg_end], rollout["next", "agents", k][seg_end])
        assert (replay["next", "agents", k][~seg_end] == 0).all()


@pytest.mark.parametrize("cell", sorted(CELLS))
@pytest.mark.parametrize("hint", [{}, dict(recurrent_slice_len=5), dict(recurrent_slice_len=5, recurrent_num_slices=4)])
def test_flat_slice_sampler_batches_equal_batched_time(cell, hint) -> None:
    """SliceSampler's flat [N] batch (time the only batch dim, slices separated by is_init) == [B, T], with and
    without the slice hints."""
    module = make(cell, 3, share_params=bool(hint), **hint)  # hints need shared weights (see the error test)
    td = make_td(cell, (3, 5), 3, p_reset=0.0 if "recurrent_num_slices" in hint else 0.3)
    td["agents", "is_init"][:, 0] = True  # every slice starts a trajectory
    bt, flat = run(make(cell, 3, share_params=bool(hint)), td, True), run(module, td.reshape(-1), True)
    for key in ["embed", *CELLS[cell][2]]:
        key = ("agents", key) if key == "embed" else ("next", "agents", key)
        torch.testing.assert_close(flat[key], bt[key].reshape(-1, *bt[key].shape[2:]))


def test_collector_carries_per_agent_states_on_vmas() -> None:
    """TorchRL's Collector on a VMAS env: the primer's states [*B, n_agents, L, H] ride in the rollout, each step's
    ("next", "agents", state) comes back as the next step's state, zeros at resets; recurrent mode on the batch
    recomputes the collected outputs."""
    pytest.importorskip("vmas")
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torchrl.collectors import Collector
    from torchrl.envs import Compose, InitTracker, TransformedEnv
    from torchrl.envs.libs.vmas import VmasEnv

    base = VmasEnv("navigation", num_envs=2, continuous_actions=True, max_steps=4, n_agents=3, collisions=False,
                   device="cpu", seed=0)
    module = rf.MultiAgentGRU(base.observation_spec["agents", "observation"].shape[-1], H, 3, num_layers=2)
    env = TransformedEnv(base, Compose(InitTracker(), module.make_tensordict_primer()))
    head = TensorDictModule(lambda e: e[..., :2].tanh(), in_keys=[("agents", "embed")], out_keys=[("agents", "action")])
    collector = Collector(env, TensorDictSequential(module, head), frames_per_batch=2 * 10, total_frames=20)
    data = next(iter(collector))
    collector.shutdown()
    state, nxt, init = data["agents", "recurrent_state"], data["next", "agents", "recurrent_state"], data["is_init"]
    assert state.shape == nxt.shape == (2, 10, 3, 2, H) and init[:, 4].all()  # max_steps=4: a reset at t=4
    carried = ~init[:, 1:, 0]
    torch.testing.assert_close(state[:, 1:][carried], nxt[:, :-1][carried])
    assert (state[init[..., 0]] == 0).all() and (nxt[:, 3] != 0).any()
    replay = run(module, data.exclude("next"), True)
    torch.testing.assert_close(replay["agents", "embed"], data["agents", "embed"])


@pytest.mark.parametrize("cell", sorted(CELLS))
@pytest.mark.parametrize("share", [True, False])
def test_every_backend_that_serves_the_cell_agrees_with_reference(cell, share) -> None:
    """Outputs, next states and weight gradients, fp64 at assert_close defaults (triton computes fp32: its
    fp32 defaults)."""
    ref = make(cell, 3, layers=2, share_params=share, recurrent_backend="reference")
    for backend in [b for b in rf.available_backends() if b != "parallel"]:  # parallel serves linear cells only
        dtype = torch.float32 if backend == "triton" else torch.float64
        td = make_td(cell, (2, 5), 3, layers=2, dtype=dtype)
        module = make(cell, 3, layers=2, share_params=share, recurrent_backend=backend).to(dtype)  # ref's weights
        ref = ref.to(dtype)
        outs = []
        for m in (module, ref):
            m.zero_grad()
            out = run(m, td, True)
            (out["agents", "embed"].square().sum() + out["next", "agents", CELLS[cell][2][0]].sum()).backward()
            outs.append([*(out[k] for k in m.out_keys), *(p.grad for p in m.parameters())])
        torch.testing.assert_close(outs[0], outs[1], msg=lambda m: f"{backend}: {m}")


@pytest.mark.parametrize(("cell", "share"), [("gru", False), ("lstm", True)])  # both calls (vmapped, direct)
def test_compiles_whole_with_fullgraph_in_both_modes(cell, share) -> None:
    """One graph per mode, no break (fullgraph=True would raise), same outputs as eager."""
    from torch._dynamo.testing import CompileCounter

    module = make(cell, 3, share_params=share)
    counter = CompileCounter()
    compiled = torch.compile(module, backend=counter, fullgraph=True)
    for recurrent, lead in ((False, (2,)), (True, (2, 4))):
        td = make_td(cell, lead, 3)
        got, want = run(compiled, td, recurrent), run(module, td, recurrent)
        for key in module.out_keys:
            torch.testing.assert_close(got[key], want[key])
    assert counter.frame_count == 2


def test_compiled_equals_eager_with_grads() -> None:
    """``torch.compile`` without ``fullgraph`` of per-agent weights (the vmapped call) in recurrent mode, fp32,
    outputs and gradients. ``aot_eager`` traces the forward and backward as Inductor would; Inductor's lowering of
    the same vmapped layer (an ``EnsembleModule`` of ``GRUModule``, fwd and bwd) runs in
    compile_tests/test_compile_as_called.py::test_default_compile_ensemble_module_fwd_bwd."""
    module = make("gru", 3, share_params=False, dtype=torch.float32)
    td = make_td("gru", (2, 4), 3, dtype=torch.float32)
    compiled = torch.compile(module, backend="aot_eager")
    outs = []
    for m in (module, compiled):
        module.zero_grad()
        y = run(m, td, True)["agents", "embed"]
        y.square().sum().backward()
        outs.append((y.detach(), module.weight_hh_l0.grad.clone()))
    torch.testing.assert_close(outs[1], outs[0])


@pytest.mark.parametrize("share", [True, False])
def test_vmapped_ensemble_of_multi_agent_policies(share) -> None:
    """E policies' stacked weights through functional_call under torch.vmap == each policy on its own."""
    members = [make("lstm", 3, share_params=share, seed=s) for s in range(4)]
    params, _ = stack_module_state(members)
    td = make_td("lstm", (2, 5), 3, states=False)
    obs, init = td["agents", "observation"], td["agents", "is_init"]

    def policy(p, obs, init):
        t = TensorDict({"agents": TensorDict({"observation": obs, "is_init": init}, [2, 5, 3])}, [2, 5])
        return functional_call(members[0], p, (t,))["agents", "embed"]

    with rf.set_recurrent_mode(True):
        got = torch.vmap(policy, in_dims=(0, None, None))(params, obs, init)
    torch.testing.assert_close(got, torch.stack([run(m, td, True)["agents", "embed"] for m in members]))


def test_primer_gives_states_with_the_agent_dim() -> None:
    pytest.importorskip("torchrl")
    module = make("lstm", 3, layers=2, state_key="actor_state")
    spec = module.make_tensordict_primer().primers
    assert spec["agents"].shape == (3,)
    for k in ("actor_state_h", "actor_state_c"):
        assert spec["agents", k].shape == (3, 2, H)
    assert module.in_keys[1:3] == [("agents", "actor_state_h"), ("agents", "actor_state_c")]
    assert module.out_keys[1:] == [("next", "agents", "actor_state_h"), ("next", "agents", "actor_state_c")]


def test_bad_inputs_name_the_key_the_shapes_and_the_fix() -> None:
    module = make("gru", 3)
    good = make_td("gru", (2, 5), 3)
    with rf.set_recurrent_mode(True):
        bad = good.clone()
        bad["agents"] = TensorDict({"observation": torch.randn(2, 5, 4, F, dtype=torch.float64),
                                    "is_init": torch.zeros(2, 5, 4, 1, dtype=torch.bool)}, [2, 5, 4])
        with pytest.raises(ValueError, match=r"\('agents', 'observation'\).*\[2, 5, 4, 3\].*expected \[2, 5, 3, 3\]"
                                             r".*agent dim comes after time"):
            module(bad)
        bad = good.clone()  # an is_init for 4 agents
        bad["agents"] = bad["agents"].exclude("is_init")
        bad["agents"].batch_size = [2, 5]
        bad["agents", "is_init"] = torch.zeros(2, 5, 4, 1, dtype=torch.bool)
        with pytest.raises(ValueError, match=r"\('agents', 'is_init'\) holds shape \[2, 5, 4, 1\]; expected "
                                             r"\[2, 5, 3, 1\].*one flag per agent"):
            module(bad)
        with pytest.raises(KeyError, match=r"\('agents', 'observation'\) not found.*in_key="):
            module(good.exclude(("agents", "observation")))
        with pytest.raises(KeyError, match=r"neither \('agents', 'is_init'\) nor 'is_init'.*InitTracker"):
            module(good.exclude(("agents", "is_init")))
        bad = good.exclude(("agents", "is_init"))
        bad["is_init"] = torch.zeros(2, 5, 3, dtype=torch.bool)  # the root flag with an agent dim
        with pytest.raises(ValueError, match=r"'is_init' holds shape \[2, 5, 3\]; expected \[2, 5, 1\] or \[2, 5\]"):
            module(bad)
        bad = good.clone()
        bad["agents", "is_init"] = bad["agents", "is_init"].float()
        with pytest.raises(TypeError, match=r"\('agents', 'is_init'\) holds dtype torch.float32; expected torch.bool"):
            module(bad)
        bad = good.clone()
        bad["agents", "observation"] = bad["agents", "observation"].float()
        with pytest.raises(TypeError, match=r"holds dtype torch.float32; expected torch.float64.*Convert"):
            module(bad)
        bad = good.clone()
        bad["agents", "recurrent_state"] = torch.zeros(2, 5, 3, H, dtype=torch.float64)
        with pytest.raises(ValueError, match=r"\('agents', 'recurrent_state'\) holds \[2, 5, 3, 4\]; expected "
                                             r"\[2, 5, 3, 1, 4\].*make_tensordict_primer"):
            module(bad)
        with pytest.raises(ValueError, match="last batch dim is time"):
            module(good[0, 0])
    with pytest.raises(ValueError, match="nested under the agent group"):
        rf.MultiAgentGRU(F, H, 3, in_key="observation")
    with pytest.raises(ValueError, match="n_agents must be a positive int, got 0"):
        rf.MultiAgentGRU(F, H, 0)
    with pytest.raises(ValueError, match="recurrent_slice_len/recurrent_num_slices need share_params=True"):
        rf.MultiAgentGRU(F, H, 3, share_params=False, recurrent_slice_len=5)


def _benchmarl(monkeypatch):
    """benchmarl's models, or a skip. benchmarl 1.5.2 pins torchrl<0.12 and imports the collector under its old
    name (SyncDataCollector, Collector since torchrl 0.12): the test gives it that name for the import."""
    import torchrl.collectors

    monkeypatch.setattr(torchrl.collectors, "SyncDataCollector", torchrl.collectors.Collector, raising=False)
    pytest.importorskip("benchmarl")
    from benchmarl.models import GruConfig, LstmConfig

    from rnn_functional.modules.benchmarl import RecurrentGruConfig, RecurrentLstmConfig

    return {"gru": (GruConfig, RecurrentGruConfig, "grus", ["_hidden_gru_0"]),
            "lstm": (LstmConfig, RecurrentLstmConfig, "lstms", ["_hidden_lstm_h_0", "_hidden_lstm_c_0"])}


@pytest.mark.parametrize(("cell", "share", "centralised"),
                         [("gru", True, False), ("gru", False, False), ("gru", False, True), ("lstm", False, True)])
def test_benchmarl_config_computes_what_benchmarls_model_computes(monkeypatch, cell, share, centralised) -> None:
    """Our BenchMARL model with the weights of BenchMARL's own GRU/LSTM model: the same outputs in training
    (sequences from zeros, resets from the root is_init) and in collection (one step, the stored hidden state)."""
    from torch import nn
    from torchrl.data import Composite, Unbounded

    config, our_config, layers, hidden = _benchmarl(monkeypatch)[cell]
    n, B, T = 3, 2, 6
    spec = dict(input_spec=Composite({"agents": Composite({"obs": Unbounded(shape=(n, F))}, shape=(n,))}),
                output_spec=Composite({"agents": Composite({"out": Unbounded(shape=(n, 2))}, shape=(n,))}),
                agent_group="agents", input_has_agent_dim=True, n_agents=n, centralised=centralised,
                share_params=share, device="cpu", action_spec=None)
    mlp = dict(mlp_num_cells=[8], mlp_layer_class=nn.Linear, mlp_activation_class=nn.Tanh)
    torch.manual_seed(0)
    theirs = config(hidden_size=H, n_layers=2, bias=True, dropout=0.0, compile=False, **mlp).get_model(**spec)
    ours = our_config(hidden_size=H, n_layers=2, **mlp).get_model(**spec)
    ours.mlp.load_state_dict(theirs.mlp.state_dict())
    for k in range(2):
        for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(ours.rnn, f"{w}_l{k}").data.copy_(getattr(theirs, cell).params[layers, str(k), w])
    td = TensorDict({"agents": TensorDict({"obs": torch.randn(B, T, n, F)}, [B, T, n]),
                     "is_init": torch.rand(B, T, 1) < 0.3}, [B, T])
    torch.testing.assert_close(ours(td.clone())["agents", "out"], theirs(td.clone())["agents", "out"])
    step = td[:, 2].clone()
    for name in hidden:
        step["agents", name] = torch.randn(B, n, 2, H)
    a, b = ours(step.clone()), theirs(step.clone())
    for key in [("agents", "out"), *[("next", "agents", name) for name in hidden]]:
        torch.testing.assert_close(a[key], b[key])


def test_the_vmas_example_trains_both_policies_a_few_steps() -> None:
    """examples/mappo_vmas_recurrent.py end to end at toy size (its learning results are in docs/multi_agent.md)."""
    pytest.importorskip("vmas")
    import argparse
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "mappo_vmas_recurrent.py"
    spec = importlib.util.spec_from_file_location("mappo_vmas_recurrent", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    args = argparse.Namespace(iters=2, envs=4, max_steps=5, agents=2, cue_steps=1, hidden=8, epochs=1,
                              minibatch_envs=2, lr=1e-3, gamma=0.9, lmbda=0.9)
    for kind in ("gru", "mlp"):
        curve = example.train(kind, True, 0, args)
        assert [frames for frames, _ in curve] == [20, 40] and all(torch.isfinite(torch.tensor(r)) for _, r in curve)


def test_collector_reads_the_groups_is_init_that_init_tracker_writes() -> None:
    """An env whose done flags live in the agent group ("data" here): InitTracker writes ("data", "is_init")
    [*B, n, 1] next to them, the module reads it, and a Collector's batch replays in recurrent mode."""
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torchrl.collectors import Collector
    from torchrl.envs import Compose, InitTracker, TransformedEnv
    from torchrl.testing.mocking_classes import NestedCountingEnv

    module = rf.MultiAgentLSTM(1, H, 3, in_key=("data", "obs"), out_key=("data", "embed"))
    env = TransformedEnv(NestedCountingEnv(max_steps=4, nested_dim=3, batch_size=[2]),
                         Compose(InitTracker(), module.make_tensordict_primer()))
    cast = TensorDictModule(lambda s: s.float(), in_keys=[("data", "states")], out_keys=[("data", "obs")])
    act = TensorDictModule(lambda e: (e[..., :1] > 0).float(), in_keys=[("data", "embed")],
                           out_keys=[("data", "action")])
    collector = Collector(env, TensorDictSequential(cast, module, act), frames_per_batch=2 * 8, total_frames=16)
    data = next(iter(collector))
    collector.shutdown()
    assert data["data", "is_init"].shape == (2, 8, 3, 1) and data["data", "is_init"][:, 0].all()
    assert data["data", "recurrent_state_h"].shape == (2, 8, 3, 1, H)
    replay = run(module, data.exclude("next"), True)
    torch.testing.assert_close(replay["data", "embed"], data["data", "embed"])
