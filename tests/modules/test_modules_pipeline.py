"""A real TorchRL pipeline with our modules: CartPole, Collector, SliceSampler replay, a loss,
multi-process collection.

fp32 comparisons between recurrent mode (oneDNN kernels of the ``pad`` backend) and the
collected sequential steps (one F.linear per gate block) use atol=1e-5, rtol=1e-4: fp32
rounding of two summation orders over at most 64 steps of a hidden-8 network.
"""

from __future__ import annotations

import pytest
import torch
from module_helpers import cartpole_env
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

import rnn_functional as rf

pytest.importorskip("gymnasium")
from torchrl.collectors import Collector, MultiSyncCollector  # noqa: E402
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer  # noqa: E402
from torchrl.data.replay_buffers.samplers import SliceSampler  # noqa: E402
from torchrl.modules import set_recurrent_mode as trl_set_recurrent_mode  # noqa: E402

TOL = dict(atol=1e-5, rtol=1e-4)
HIDDEN = 8


def make_policy() -> Seq:
    lstm = rf.LSTMModule(
        input_size=4, hidden_size=HIDDEN,
        in_keys=["observation", "rs_h", "rs_c"], out_keys=["features", ("next", "rs_h"), ("next", "rs_c")],
    )
    head = Mod(nn.Linear(HIDDEN, 2), in_keys=["features"], out_keys=["logits"])
    chooser = Mod(lambda logits: logits.argmax(-1), in_keys=["logits"], out_keys=["action"])
    return Seq(lstm, head, chooser)


def _check_collected(data):
    """Hidden is zero at episode starts and carried from ("next", h) elsewhere."""
    is_init = data["is_init"].squeeze(-1)
    assert is_init[..., 0].all() and is_init.sum() > is_init[..., 0].numel()  # several episodes
    for k in ("rs_h", "rs_c"):
        assert (data[k][is_init] == 0).all()
        carried = ~is_init[..., 1:]
        torch.testing.assert_close(data[k][..., 1:, :, :][carried], data["next", k][..., :-1, :, :][carried])


@pytest.fixture(scope="module")
def collected():
    torch.manual_seed(0)
    policy = make_policy()
    env = cartpole_env()
    env.set_seed(0)
    collector = Collector(
        env, policy, frames_per_batch=96, total_frames=96, auto_register_policy_transforms=True,
    )
    data = next(iter(collector))
    collector.shutdown()
    return policy, data


def test_collector_auto_registers_our_primer(collected):
    policy, data = collected
    assert data.shape == (96,)
    assert data["rs_h"].shape == (96, 1, HIDDEN) and data["rs_c"].shape == (96, 1, HIDDEN)
    _check_collected(data)
    # one recurrent call over the whole rollout reproduces the step-by-step features
    with rf.set_recurrent_mode(True):
        replay = policy(data.exclude("features", "logits", "action", ("next", "rs_h"), ("next", "rs_c")))
    torch.testing.assert_close(replay["features"], data["features"], **TOL)
    seg_end = torch.cat([data["is_init"].squeeze(-1)[1:], torch.ones(1, dtype=torch.bool)])
    torch.testing.assert_close(replay["next", "rs_h"][seg_end], data["next", "rs_h"][seg_end], **TOL)


def test_slice_sampler_recurrent_training(collected):
    policy, data = collected
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(256), sampler=SliceSampler(slice_len=8, strict_length=False), batch_size=32,
    )
    rb.extend(data)
    sample, info = rb.sample(return_info=True)
    index = info["index"][0]
    traj = sample["collector", "traj_ids"]
    starts = torch.ones_like(index, dtype=torch.bool)
    starts[1:] = (index[1:] != index[:-1] + 1) | (traj[1:] != traj[:-1])
    is_init = sample["is_init"].squeeze(-1)
    assert is_init[starts].all(), "is_init must be set at every slice start"
    episode_start = data["is_init"].squeeze(-1)[index]
    assert (sample["rs_h"][episode_start] == 0).all()

    # Recurrent mode on the flat ragged batch resets to the stored hidden at each slice start,
    # so it continues exactly where collection was: same features as collected.
    with rf.set_recurrent_mode(True):
        out = policy(sample.clone())
    torch.testing.assert_close(out["features"], sample["features"], **TOL)

    # forward + backward through the sampled slices
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    with rf.set_recurrent_mode(True):
        loss = policy(sample.clone())["logits"].pow(2).mean()
    loss.backward()
    grads = [p.grad for p in policy[0].parameters()]
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
    opt.zero_grad()

    # no leak across packed trajectories (TorchRL tutorial's check), with noisy hidden
    packed = sample[:16].clone()
    packed["is_init"][:] = False
    packed["is_init"][[0, 8]] = True
    packed["rs_h"] = torch.randn_like(packed["rs_h"])
    packed["rs_c"] = torch.randn_like(packed["rs_c"])
    with trl_set_recurrent_mode(True):
        both = policy(packed.clone())
        second = policy(packed[8:].clone())
    torch.testing.assert_close(both["features"][8:], second["features"])


def test_torchrl_ppo_loss_runs_our_module_in_recurrent_mode(collected):
    from torchrl.modules import OneHotCategorical, ProbabilisticActor, ValueOperator
    from torchrl.objectives import ClipPPOLoss

    _, data = collected
    torch.manual_seed(1)
    lstm = rf.LSTMModule(4, HIDDEN, in_keys=["observation", "rs_h", "rs_c"],
                         out_keys=["features", ("next", "rs_h"), ("next", "rs_c")])
    modes = []
    lstm.register_forward_pre_hook(lambda m, args: modes.append(m.recurrent_mode))
    actor = ProbabilisticActor(
        Seq(lstm, Mod(nn.Linear(HIDDEN, 2), in_keys=["features"], out_keys=["logits"])),
        in_keys=["logits"], distribution_class=OneHotCategorical, return_log_prob=True,
    )
    critic = ValueOperator(nn.Linear(4, 1), in_keys=["observation"])
    batch = data.select("observation", "rs_h", "rs_c", "is_init", "next").clone()
    with rf.set_recurrent_mode(True), torch.no_grad():
        batch = actor(batch)  # actions and their log-probs under the current params
    batch["advantage"] = torch.randn(96, 1)
    batch["value_target"] = torch.randn(96, 1)
    modes.clear()
    loss_module = ClipPPOLoss(actor, critic)
    losses = loss_module(batch.exclude("features", "logits"))
    total = sum(v for k, v in losses.items() if k.startswith("loss_"))
    total.backward()
    assert modes and all(modes), f"TorchRL's loss must call our module in recurrent mode, saw {modes}"
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in lstm.parameters())
    # same params, same data: the importance ratio is 1
    torch.testing.assert_close(losses["kl_approx"], torch.zeros(()), atol=1e-5, rtol=0)


def test_multisync_collector_two_workers():
    """Each worker runs our policy sequentially even while the trainer is in recurrent mode."""
    collector = MultiSyncCollector(
        [cartpole_env, cartpole_env], make_policy(), frames_per_batch=64, total_frames=64,
        auto_register_policy_transforms=True,
    )
    try:
        with rf.set_recurrent_mode(True):
            batches = list(collector)
    finally:
        collector.shutdown()
    assert len(batches) == 1
    data = batches[0]
    assert data.numel() == 64 and "rs_h" in data.keys()
    _check_collected(data.reshape(2, -1) if data.ndim == 1 else data)
