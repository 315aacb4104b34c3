"""Our modules compiled the ways TorchRL compiles: ``compile_with_warmup``, a collector with
``compile_policy=True``, and a PPO update (``ClipPPOLoss`` on a recurrent actor-critic in recurrent
mode, loss + backward + optimizer step) compiled whole as TorchRL's scripts compile theirs.

All of them are default ``torch.compile`` calls (no ``fullgraph``), Inductor, with
``capture_scalar_outputs`` False (``conftest.py``). Each is compared with the same code run
eagerly; float32 tolerance ``FP32_TOL`` (``compile_helpers``); the collector's rollouts are
compared exactly on actions (argmax over logits that agree to ~1e-7).
"""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

import rnn_functional as rf
from compile_helpers import FP32_TOL, compile_stats, reset_mask

pytest.importorskip("torchrl")
pytest.importorskip("gymnasium")
from torchrl._utils import compile_with_warmup  # noqa: E402

B, T, F_IN, H = 4, 8, 4, 8


def _rnn(cell: str, prefix: str = "rs"):
    keys = [f"{prefix}_h", f"{prefix}_c"] if cell == "lstm" else [f"{prefix}_h"]
    cls = rf.LSTMModule if cell == "lstm" else rf.GRUModule
    module = cls(input_size=F_IN, hidden_size=H, in_keys=["observation", *keys],
                 out_keys=[f"{prefix}_feat", *(("next", k) for k in keys)])
    return module, keys


def _batch(keys: list[str], seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    data = {"observation": torch.randn(B, T, F_IN, generator=g), "is_init": reset_mask(B, T, seed).unsqueeze(-1)}
    data.update({k: torch.randn(B, T, 1, H, generator=g) for k in keys})
    return TensorDict(data, batch_size=[B, T])


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_compile_with_warmup_recurrent_mode(cell):
    """TorchRL's helper (what its scripts and benchmarks call): eager warm-up call, then a default compile."""
    torch.manual_seed(0)
    module, keys = _rnn(cell)
    td = _batch(keys)
    with rf.set_recurrent_mode(True), torch.inference_mode():
        want = module(td.clone())
        compiled = compile_with_warmup(module, warmup=1)
        with compile_stats() as stats:
            outs = [compiled(td.clone()) for _ in range(3)]  # eager warm-up, compile, compiled
    assert stats.graphs == 1 and stats.breaks == 0, stats
    for got in outs:
        for key in ["rs_feat", *(("next", k) for k in keys)]:
            torch.testing.assert_close(got[key], want[key], **FP32_TOL)


def _policy():
    torch.manual_seed(0)
    lstm, _ = _rnn("lstm")
    head = Mod(nn.Linear(H, 2), in_keys=["rs_feat"], out_keys=["logits"])
    chooser = Mod(lambda logits: logits.argmax(-1), in_keys=["logits"], out_keys=["action"])
    return Seq(lstm, head, chooser)


def _collect(compile_policy: bool) -> TensorDict:
    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv

    env = GymEnv("CartPole-v1")
    env.set_seed(0)
    collector = Collector(env, _policy(), frames_per_batch=48, total_frames=96, compile_policy=compile_policy,
                          auto_register_policy_transforms=True)
    try:
        return torch.cat(list(collector), 0)
    finally:
        collector.shutdown()


def test_collector_compile_policy():
    """``Collector(..., compile_policy=True)``: the compiled policy steps the env as the eager one does."""
    want = _collect(False)
    with compile_stats() as stats:
        got = _collect(True)
    assert stats.graphs >= 1 and stats.breaks == 0, stats
    assert got["is_init"].sum() > 1, "the rollout must cross an episode boundary"
    torch.testing.assert_close(got["action"], want["action"], rtol=0, atol=0)
    for key in ("rs_feat", "logits", "rs_h", "rs_c", ("next", "rs_h"), ("next", "rs_c")):
        torch.testing.assert_close(got[key], want[key], **FP32_TOL)


def _actor_critic():
    from torchrl.modules import OneHotCategorical, ProbabilisticActor

    torch.manual_seed(1)
    actor_rnn, _ = _rnn("lstm")
    critic_rnn, _ = _rnn("gru", prefix="v")
    actor = ProbabilisticActor(Seq(actor_rnn, Mod(nn.Linear(H, 2), in_keys=["rs_feat"], out_keys=["logits"])),
                               in_keys=["logits"], distribution_class=OneHotCategorical, return_log_prob=True)
    critic = Seq(critic_rnn, Mod(nn.Linear(H, 1), in_keys=["v_feat"], out_keys=["state_value"]))
    return actor, critic


def test_compiled_ppo_update_recurrent_mode():
    """A PPO update (loss, backward, optimizer step) compiled whole with ``compile_with_warmup``, as TorchRL's
    PPO scripts do, on a recurrent actor (LSTM) and critic (GRU) in recurrent mode: the losses and the updated
    parameters equal the eager update's."""
    from torchrl.objectives import ClipPPOLoss

    actor, critic = _actor_critic()
    batch = _batch(["rs_h", "rs_c", "v_h"])
    with rf.set_recurrent_mode(True), torch.no_grad():
        batch = actor(batch)  # actions and their log-probs
    batch["advantage"] = torch.randn(B, T, 1, generator=torch.Generator().manual_seed(5))
    batch["value_target"] = torch.randn(B, T, 1, generator=torch.Generator().manual_seed(6))
    batch = batch.exclude("rs_feat", "logits", "next")

    def make_update(loss_module):
        optim = torch.optim.SGD(loss_module.parameters(), lr=0.1)

        def update(data):
            optim.zero_grad(set_to_none=True)
            losses = loss_module(data)
            total = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
            total.backward()
            optim.step()
            return total.detach()

        return update

    eager_loss = ClipPPOLoss(actor, critic)
    compiled_loss = copy.deepcopy(eager_loss)
    eager_update = make_update(eager_loss)
    compiled_update = compile_with_warmup(make_update(compiled_loss), warmup=1)
    initial = [p.detach().clone() for p in compiled_loss.parameters()]
    # TorchRL's loss graph-breaks (optimizer.zero_grad, TensorDict.to_module over the nn.LSTM / nn.GRU children,
    # a TensorDict context manager) and re-checks isinstance against every TensorDict class; users run with
    # the default recompile-limit behaviour (fall back to eager for that frame), and so does this test.
    with rf.set_recurrent_mode(True), torch._dynamo.config.patch(fail_on_recompile_limit_hit=False), \
            compile_stats() as stats:
        for _ in range(3):  # eager warm-up, then compiled calls
            data = batch.clone()
            want = eager_update(data.clone())
            got = compiled_update(data.clone())
            torch.testing.assert_close(got, want, **FP32_TOL)
    assert stats.graphs >= 1, stats
    assert any(not torch.equal(a, p) for a, p in zip(compiled_loss.parameters(), initial)), "no update happened"
    for (name, a), b in zip(compiled_loss.named_parameters(), eager_loss.parameters()):
        torch.testing.assert_close(a, b, **FP32_TOL, msg=lambda m, name=name: f"{name}: {m}")
