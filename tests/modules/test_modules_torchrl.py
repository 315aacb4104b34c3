"""Side by side with torchrl.modules.LSTMModule / GRUModule, and TorchRL's primer utilities."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from module_helpers import HIDDEN_KEYS, make_module, make_td, weighted_sum
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

import rnn_functional as rf

trm = pytest.importorskip("torchrl.modules")
from torchrl.modules.utils import get_primers_from_module  # noqa: E402

KEYS = {cell: dict(in_keys=["x", *hk], out_keys=["y", *[("next", k) for k in hk]]) for cell, hk in HIDDEN_KEYS.items()}


def _pair(cell, layers, proj, python_based):
    """A TorchRL module and ours wrapping the same weights, in fp64."""
    torch.manual_seed(0)
    if cell == "lstm":
        theirs = trm.LSTMModule(4, 5, layers, proj_size=proj, python_based=python_based, **KEYS[cell])
        ours = rf.LSTMModule(lstm=theirs.lstm, python_based=python_based, **KEYS[cell])
    else:
        theirs = trm.GRUModule(4, 5, layers, python_based=python_based, **KEYS[cell])
        ours = rf.GRUModule(gru=theirs.gru, python_based=python_based, **KEYS[cell])
    return theirs.double(), ours.double()


def _run(module, td, cell, mode):
    td = td.clone(False)
    leaves = [td["x"], *(td[k] for k in HIDDEN_KEYS[cell])]
    for t in leaves:
        t.requires_grad_(True)
    with trm.set_recurrent_mode(mode):
        out = module(td)
    outs = [out["y"], *(out["next", k] for k in HIDDEN_KEYS[cell])]
    grads = torch.autograd.grad(weighted_sum(outs), leaves + list(module.parameters()))
    return outs, grads


@pytest.mark.parametrize("mode", [True, False], ids=["recurrent", "sequential"])
@pytest.mark.parametrize("batch_shape", [(9,), (3, 6), (2, 2, 5)], ids=["flat", "B", "BB"])
@pytest.mark.parametrize(
    "cell,layers,proj,python_based",
    [("lstm", 1, 0, False), ("lstm", 2, 3, False), ("lstm", 2, 0, True), ("gru", 2, 0, False), ("gru", 1, 0, True)],
)
def test_parity_with_torchrl(cell, layers, proj, python_based, batch_shape, mode):
    if proj and not mode:
        pytest.skip("TorchRL's sequential mode fails with proj_size (zeros of h's width for c); ours is "
                    "checked against torch.nn in test_modules_core")
    theirs, ours = _pair(cell, layers, proj, python_based)
    td = make_td(cell, batch_shape, layers=layers, proj=proj, hidden=5, reset_prob=0.25, seed=sum(batch_shape))
    outs_t, grads_t = _run(theirs, td, cell, mode)
    outs_o, grads_o = _run(ours, td, cell, mode)
    for a, b in zip(outs_o, outs_t):
        torch.testing.assert_close(a, b)
    for a, b in zip(grads_o, grads_t):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_params_from_torchrl_python_based_child(cell):
    """``params_from_module`` takes what ``lstm=``/``gru=`` take: TorchRL's Python ``LSTM``/``GRU`` (the child of its
    ``python_based`` modules), whose outputs ours then equal; its gradients land in TorchRL's parameters."""
    torch.manual_seed(0)
    theirs = (trm.LSTMModule if cell == "lstm" else trm.GRUModule)(4, 5, 2, python_based=True, **KEYS[cell]).double()
    child = getattr(theirs, cell)
    assert type(child) not in (nn.LSTM, nn.GRU)  # TorchRL's own Python class
    params = rf.params_from_module(child)
    x = torch.randn(3, 6, 4, dtype=torch.float64)
    want = child(x)[0]
    got = (rf.lstm_sequence if cell == "lstm" else rf.gru_sequence)(x, None, params)[0]
    torch.testing.assert_close(got, want)
    got.sum().backward()
    assert all(p.grad is not None for p in child.parameters())


def test_contexts_drive_both_libraries():
    theirs, ours = _pair("gru", 1, 0, False)
    with trm.set_recurrent_mode(True):
        assert ours.recurrent_mode is True
        with rf.set_recurrent_mode(False):
            assert ours.recurrent_mode is False and theirs.recurrent_mode is False
        assert ours.recurrent_mode is True and theirs.recurrent_mode is True
    with rf.set_recurrent_mode(True):
        assert theirs.recurrent_mode is True
        with trm.set_recurrent_mode(False):
            assert ours.recurrent_mode is False
        with trm.set_recurrent_mode(None):  # the innermost context: each module's default (sequential), in both
            assert ours.recurrent_mode is False and theirs.recurrent_mode is False
            with trm.set_recurrent_mode(False), trm.set_recurrent_mode(None):
                assert ours.recurrent_mode is False and theirs.recurrent_mode is False
        assert ours.recurrent_mode is True
    assert ours.recurrent_mode is False and theirs.recurrent_mode is False


def test_one_context_object_entered_from_two_threads():
    """A ``set_recurrent_mode`` object kept at module level and entered by two threads, A in then B in, A out then
    B out (TorchRL loaded): each exit restores its own thread's mode. The object kept one entry's restore state on
    itself: A's exit raised ("was created in a different Context") and B stayed in recurrent mode after its exit."""
    import threading

    shared = rf.set_recurrent_mode(True)
    module = make_module("gru")
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen, errors = {}, []

    def run(name, entered, wait_for, then_set):
        try:
            with shared:
                entered.set()
                assert wait_for.wait(10)
                seen[name, "inside"] = (module.recurrent_mode, rf.recurrent_mode())
            if then_set is not None:
                then_set.set()
            seen[name, "after"] = (module.recurrent_mode, rf.recurrent_mode())
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=("A", a_in, b_in, a_out)),
               threading.Thread(target=run, args=("B", b_in, a_out, None))]
    threads[0].start()
    assert a_in.wait(10)
    threads[1].start()
    for t in threads:
        t.join(20)
    assert not errors, errors
    assert seen == {("A", "inside"): (True, True), ("B", "inside"): (True, True),
                    ("A", "after"): (False, None), ("B", "after"): (False, None)}
    with shared:  # and nested in one thread
        with shared:
            assert module.recurrent_mode is True
        assert module.recurrent_mode is True
    assert module.recurrent_mode is False and rf.recurrent_mode() is None


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_primer_matches_torchrl(cell):
    if cell == "lstm":
        theirs = trm.LSTMModule(3, 6, 2, proj_size=4, in_key="obs", out_key="out")
        ours = rf.LSTMModule(3, 6, 2, proj_size=4, in_key="obs", out_key="out")
    else:
        theirs = trm.GRUModule(3, 6, 2, in_key="obs", out_key="out")
        ours = rf.GRUModule(3, 6, 2, in_key="obs", out_key="out")
    p_t, p_o = theirs.make_tensordict_primer(), ours.make_tensordict_primer()
    assert type(p_o) is type(p_t)
    assert p_o.primers == p_t.primers
    bad = (rf.LSTMModule if cell == "lstm" else rf.GRUModule)(
        3, 6, in_keys=["obs", *(["a", "b"] if cell == "lstm" else ["a"])],
        out_keys=["out", *([("next", "a"), "b"] if cell == "lstm" else ["a"])],
    )
    with pytest.raises(RuntimeError, match="compatible names"):
        bad.make_tensordict_primer()


def test_torchrl_canonicalize_rnn_subset_accepts_our_modules():
    actor = rf.LSTMModule(3, 4, in_key="obs", out_key="actor_h")
    critic = rf.GRUModule(3, 4, in_key="obs2", out_key="critic_h")
    td = TensorDict({"obs": torch.zeros(5, 2, 3).transpose(0, 1), "obs2": torch.zeros(5, 2, 3).transpose(0, 1),
                     "reward": torch.zeros(5, 2, 1).transpose(0, 1)}, [2, 5])
    out = trm.canonicalize_rnn_subset(td, [actor, critic])
    assert out["obs"].is_contiguous() and out["obs2"].is_contiguous() and not out["reward"].is_contiguous()


def test_get_primers_and_append_transform_rollout():
    from torchrl.envs import Compose, GymEnv, InitTracker, TensorDictPrimer, TransformedEnv

    lstm = rf.LSTMModule(4, 8, in_keys=["observation", "rs_h", "rs_c"], out_keys=["feat", ("next", "rs_h"), ("next", "rs_c")])
    gru = rf.GRUModule(4, 3, in_keys=["observation", "rg"], out_keys=["feat2", ("next", "rg")])
    head = Mod(nn.Linear(8, 2), in_keys=["feat"], out_keys=["logits"])
    act = Mod(lambda logits: nn.functional.one_hot(logits.argmax(-1), 2), in_keys=["logits"], out_keys=["action"])
    policy = Seq(lstm, gru, head, act)
    primers = get_primers_from_module(policy)
    assert isinstance(primers, Compose) and all(isinstance(p, TensorDictPrimer) for p in primers)
    assert {k for p in primers for k in p.primers.keys()} == {"rs_h", "rs_c", "rg"}

    env = TransformedEnv(GymEnv("CartPole-v1"), InitTracker()).append_transform(lstm.make_tensordict_primer())
    env = env.append_transform(gru.make_tensordict_primer())
    env.set_seed(0)
    roll = env.rollout(12, policy, break_when_any_done=False)
    assert roll["rs_h"].shape == (12, 1, 8) and roll["rg"].shape == (12, 1, 3)
    carried = ~roll["is_init"][1:].squeeze(-1)
    for k in ("rs_h", "rs_c", "rg"):
        torch.testing.assert_close(roll[k][1:][carried], roll["next", k][:-1][carried])
        assert (roll[k][roll["is_init"].squeeze(-1)] == 0).all()
