"""``EnsembleModule``: a vmapped LSTMModule/GRUModule/MinGRUModule/RGLRUModule over stacked params equals a loop of
single modules (outputs and gradients, fp64 ``assert_close`` defaults); ensemble dim first,
TorchRL keys unchanged, shared inputs read without copies."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

import rnn_functional as rf

E, B, T, F, H, L = 3, 2, 5, 4, 5, 2
HIDDEN = {"lstm": ["recurrent_state_h", "recurrent_state_c"], "gru": ["recurrent_state"], "min_gru": ["recurrent_state"],
          "rglru": ["recurrent_state"]}
CLASSES = {"lstm": rf.LSTMModule, "gru": rf.GRUModule, "min_gru": rf.MinGRUModule, "rglru": rf.RGLRUModule}


def _module(cell: str) -> torch.nn.Module:
    return CLASSES[cell](F, H, L, in_key="obs", out_key="feat").to(torch.float64)


def _recurrent_td(cell: str, lead: tuple[int, ...] = ()) -> TensorDict:
    g = torch.Generator().manual_seed(1)
    is_init = torch.rand(*lead, B, T, 1, generator=g) < 0.3
    data = {"obs": torch.randn(*lead, B, T, F, generator=g, dtype=torch.float64), "is_init": is_init}
    for key in HIDDEN[cell]:
        data[key] = torch.randn(*lead, B, T, L, H, generator=g, dtype=torch.float64)
    return TensorDict(data, batch_size=[*lead, B, T])


def _looped(ens: rf.EnsembleModule, cell: str, td: TensorDict, shared: bool) -> TensorDict:
    """Each member's params swapped into a plain module, one call per member, stacked."""
    single = _module(cell)
    outs = []
    for e in range(E):
        with ens.params[e].to_module(single):
            outs.append(single((td if shared else td[e]).copy()))
    return torch.stack(outs)


def _check_equal(got: TensorDict, expected: TensorDict, ens: rf.EnsembleModule, key: str) -> None:
    assert got.batch_size == expected.batch_size
    assert set(got.keys(include_nested=True, leaves_only=True)) == set(expected.keys(include_nested=True, leaves_only=True))
    for k in expected.keys(include_nested=True, leaves_only=True):
        torch.testing.assert_close(got[k], expected[k])
    params = list(ens.parameters())
    ct = torch.randn(expected[key].shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    g_got = torch.autograd.grad((got[key] * ct).sum(), params, retain_graph=True)
    g_exp = torch.autograd.grad((expected[key] * ct).sum(), params, retain_graph=True)
    torch.testing.assert_close(g_got, g_exp)


@pytest.mark.parametrize("cell", list(CLASSES))
def test_recurrent_mode_shared_input_equals_loop(cell: str) -> None:
    ens = rf.EnsembleModule(_module(cell), E, generator=torch.Generator().manual_seed(0))
    td = _recurrent_td(cell)
    before = td.clone()
    with rf.set_recurrent_mode(True):
        got = ens(td)
        expected = _looped(ens, cell, td, shared=True)
    assert got.batch_size == torch.Size([E, B, T])
    assert got["feat"].shape == (E, B, T, H)
    for key in HIDDEN[cell]:  # TorchRL's ("next", hidden) outputs, ensemble dim first
        assert got["next", key].shape == (E, B, T, L, H)
    _check_equal(got, expected, ens, "feat")
    assert (td == before).all() and "feat" not in td.keys()  # the caller's TensorDict is untouched
    # the shared input is read, not copied per member: the output's obs is a stride-0 view of it
    assert got["obs"].data_ptr() == td["obs"].data_ptr() and got["obs"].stride(0) == 0


@pytest.mark.parametrize("cell", list(CLASSES))
def test_sequential_steps_with_per_member_state_equal_loop(cell: str) -> None:
    """Step 1 from a shared input; step 2 feeds each member its own next state (shared_input=False)."""
    ens = rf.EnsembleModule(_module(cell), E, generator=torch.Generator().manual_seed(0))
    per_member = rf.EnsembleModule(_module(cell), E, shared_input=False)
    per_member.params = ens.params  # the same members
    g = torch.Generator().manual_seed(3)
    td = TensorDict(
        {"obs": torch.randn(B, F, generator=g, dtype=torch.float64), "is_init": torch.tensor([[True], [False]])},
        batch_size=[B],
    )
    first = ens(td)
    _check_equal(first, _looped(ens, cell, td, shared=True), ens, "feat")
    second_in = TensorDict(
        {"obs": torch.randn(E, B, F, generator=g, dtype=torch.float64), "is_init": torch.zeros(E, B, 1, dtype=torch.bool)},
        batch_size=[E, B],
    )
    for key in HIDDEN[cell]:
        second_in[key] = first["next", key]
    second = per_member(second_in)
    assert second["feat"].shape == (E, B, H)
    _check_equal(second, _looped(ens, cell, second_in, shared=False), ens, "feat")


def test_members_are_independent_and_generator_aware() -> None:
    ens = rf.EnsembleModule(_module("gru"), E, generator=torch.Generator().manual_seed(4))
    expected = rf.ensemble_init_gru_params(E, F, H, L, generator=torch.Generator().manual_seed(4))
    members = ens.member_params()
    assert members.batch_size == torch.Size([E])
    for key in expected.keys():
        torch.testing.assert_close(members[key], expected[key].to(torch.float64), rtol=0, atol=0)
    assert not torch.equal(members["weight_hh_l0"][0], members["weight_hh_l0"][1])
    # only the stacked members are parameters / state: the wrapped module's are on meta
    assert all(p.shape[0] == E for p in ens.parameters())
    assert all(k.startswith("members.") for k in ens.state_dict())


def test_dropout_members_draw_their_own_masks() -> None:
    """Train-mode inter-layer dropout under vmap(randomness="different"): members with equal
    params give different outputs; in eval mode they agree."""
    module = rf.GRUModule(F, H, 3, dropout=0.5, in_key="obs", out_key="feat").to(torch.float64)
    ens = rf.EnsembleModule(module, E)
    with torch.no_grad():
        for p in ens.params.values(True, True):
            p.copy_(p[:1].expand_as(p))  # every member = member 0
    td = _recurrent_td("gru").exclude(*HIDDEN["gru"])  # zero initial states
    with rf.set_recurrent_mode(True):
        train_out = ens.train()(td)["feat"]
        eval_out = ens.eval()(td)["feat"]
    assert not torch.allclose(train_out[0], train_out[1])
    torch.testing.assert_close(eval_out[0], eval_out[1])  # equal up to the batched GEMM's rounding
    torch.testing.assert_close(eval_out[1], eval_out[2])


def test_errors_name_the_fix() -> None:
    with pytest.raises(TypeError, match="LSTMModule, GRUModule, MinGRUModule or RGLRUModule, got Linear"):
        rf.EnsembleModule(torch.nn.Linear(2, 2), E)
    with pytest.raises(ValueError, match="randomness: expected one of"):
        rf.EnsembleModule(_module("gru"), E, randomness="sometimes")
    ens = rf.EnsembleModule(_module("gru"), E, shared_input=False)
    td = TensorDict({"obs": torch.randn(B, F, dtype=torch.float64), "is_init": torch.ones(B, 1, dtype=torch.bool)}, [B])
    with pytest.raises(ValueError, match=r"td.expand\(3, \*td.batch_size\)"):
        ens(td)


def _step_td(cell: str) -> TensorDict:
    g = torch.Generator().manual_seed(2)
    data = {"obs": torch.randn(B, F, generator=g, dtype=torch.float64), "is_init": torch.rand(B, 1, generator=g) < 0.5}
    for key in HIDDEN[cell]:
        data[key] = torch.randn(B, L, H, generator=g, dtype=torch.float64)
    return TensorDict(data, batch_size=[B])


@pytest.mark.parametrize("mode", ["step", "sequence"])
@pytest.mark.parametrize("cell", ["lstm", "gru", "min_gru"])
def test_compiled_ensemble_equals_eager_without_graph_breaks(cell, mode):
    """``torch.compile(EnsembleModule, fullgraph=True)``: the members' weights reach the core without
    touching the ``nn.LSTM``/``GRU`` child (Dynamo refuses to wrap it). Outputs equal eager in both
    modes; gradients too for steps. (Sequences forward+backward: compile_tests/test_compile_ensemble_train.py.)"""
    ens = rf.EnsembleModule(_module(cell), E, generator=torch.Generator().manual_seed(0))
    td = _step_td(cell) if mode == "step" else _recurrent_td(cell)
    params = list(ens.params.values(True, True))

    def run(module):
        with rf.set_recurrent_mode(mode == "sequence"):
            if mode == "sequence":
                with torch.no_grad():
                    return module(td)["feat"], []
            value = module(td)["feat"]
            return value, torch.autograd.grad(value.square().sum(), params)

    want, want_grads = run(ens)
    got, got_grads = run(torch.compile(ens, fullgraph=True, backend="aot_eager"))  # fullgraph: a break raises
    torch.testing.assert_close(got, want)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w)
