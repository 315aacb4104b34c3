"""Recurrent MAPPO / IPPO on VMAS where memory matters: ``MultiAgentGRU`` against a memoryless ``MultiAgentMLP``.

The task is VMAS ``navigation`` (3 agents, each to its own goal) with the goal hidden: each agent sees its
goal's relative position only in the first ``--cue-steps`` observations of an episode (zeros afterwards), so
a policy must remember where its goal was and integrate its own motion since. A memoryless policy cannot.

Same recipe as TorchRL's ``examples/multiagent/mappo_vmas.py`` (PPO with a clipped loss, GAE, shared
per-agent networks; MAPPO's critic reads all agents' observations, IPPO's its own), made recurrent:
a ``MultiAgentGRU`` runs step by step in the collector (its per-agent states ride in the env's
TensorDicts through its primer) and over whole ``[envs, T]`` batches in the loss (recurrent mode).
Minibatches are whole env rows, so every sequence keeps its history. The baseline trains on the same frames.

    python examples/mappo_vmas_recurrent.py --seeds 0 1 --iters 30 --plot docs/assets/multi_agent_returns.png
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from tensordict.nn.distributions import NormalParamExtractor
from torch import nn
from torchrl.collectors import Collector
from torchrl.envs import Compose, InitTracker, StepCounter, TransformedEnv
from torchrl.envs.libs.vmas import VmasEnv
from torchrl.modules import MultiAgentMLP, ProbabilisticActor, TanhNormal
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value.functional import generalized_advantage_estimate

import rnn_functional as rf

GOAL = slice(4, 6)  # navigation's observation: pos (2), vel (2), pos - goal (2)


def hide_goal(cue_steps: int) -> TensorDictModule:
    """Zero every agent's goal offset after the first ``cue_steps`` steps of its episode."""

    def mask(obs: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        hidden = (step >= cue_steps).unsqueeze(-2)  # [*B, 1] -> [*B, 1, 1], broadcast over agents
        out = obs.clone()
        out[..., GOAL] = torch.where(hidden, 0.0, obs[..., GOAL])
        return out

    return TensorDictModule(mask, in_keys=[("agents", "observation"), "step_count"], out_keys=[("agents", "obs")])


def build(kind: str, mappo: bool, n: int, obs_dim: int, act_spec, hidden: int, mask: TensorDictModule):
    """``(actor, critic, primers)``: ``kind`` ``"gru"`` (our MultiAgentGRU in front of MLP heads) or ``"mlp"``."""
    act_dim = act_spec.shape[-1]

    def trunk(out_dim: int, centralized: bool, name: str) -> tuple[list, list]:
        if kind == "mlp":
            return [TensorDictModule(MultiAgentMLP(obs_dim, out_dim, n, centralized=centralized, share_params=True,
                                                   depth=2, num_cells=hidden, activation_class=nn.Tanh),
                                     in_keys=[("agents", "obs")], out_keys=[("agents", name)])], []
        gru = rf.MultiAgentGRU(obs_dim, hidden, n, centralized=centralized, in_key=("agents", "obs"),
                               out_key=("agents", f"{name}_h"), state_key=f"{name}_state")
        head = MultiAgentMLP(hidden, out_dim, n, centralized=False, share_params=True, depth=1, num_cells=hidden,
                             activation_class=nn.Tanh)
        return [gru, TensorDictModule(head, in_keys=[("agents", f"{name}_h")], out_keys=[("agents", name)])], [gru]

    actor_mods, actor_rnn = trunk(2 * act_dim, False, "params")
    actor = ProbabilisticActor(
        TensorDictSequential(mask, *actor_mods, TensorDictModule(NormalParamExtractor(), in_keys=[("agents", "params")],
                                                           out_keys=[("agents", "loc"), ("agents", "scale")])),
        spec=act_spec, in_keys=[("agents", "loc"), ("agents", "scale")], out_keys=[("agents", "action")],
        distribution_class=TanhNormal, distribution_kwargs={"low": act_spec.space.low, "high": act_spec.space.high},
        return_log_prob=True)
    critic_mods, critic_rnn = trunk(1, mappo, "state_value")
    critic = TensorDictSequential(mask, *critic_mods)
    return actor, critic, [m.make_tensordict_primer() for m in actor_rnn + critic_rnn]


def train(kind: str, mappo: bool, seed: int, a) -> list[tuple[int, float]]:
    """One run; returns ``[(frames, mean episode return), ...]`` (mean reward per agent-step x max_steps)."""
    torch.manual_seed(seed)
    base = VmasEnv("navigation", num_envs=a.envs, continuous_actions=True, max_steps=a.max_steps, n_agents=a.agents,
                   collisions=False, device="cpu", seed=seed)
    obs_dim = base.observation_spec["agents", "observation"].shape[-1]
    actor, critic, primers = build(kind, mappo, a.agents, obs_dim, base.full_action_spec["agents", "action"],
                                   a.hidden, hide_goal(a.cue_steps))
    env = TransformedEnv(base, Compose(InitTracker(), StepCounter(), *primers))
    policy = TensorDictSequential(actor, critic)  # the critic runs in the rollout to store its states too
    frames = a.envs * a.max_steps
    collector = Collector(env, policy, frames_per_batch=frames, total_frames=frames * a.iters)
    loss = ClipPPOLoss(actor, critic, clip_epsilon=0.2,
                       entropy_coeff=1e-4, normalize_advantage=False)
    loss.set_keys(action=("agents", "action"), sample_log_prob=("agents", "action_log_prob"),
                  value=("agents", "state_value"), advantage=("agents", "advantage"),
                  value_target=("agents", "value_target"))
    optim = torch.optim.Adam(loss.parameters(), a.lr)
    curve = []
    for i, data in enumerate(collector):
        curve.append(((i + 1) * frames, data["next", "agents", "reward"].mean().item() * a.max_steps))
        with torch.no_grad(), rf.set_recurrent_mode(True):
            value = critic(data.clone())["agents", "state_value"]
        with torch.no_grad(), rf.set_recurrent_mode(False):
            # V(next obs | the critic's state after this step): one batched step, exact at episode ends too
            nxt = data["next"].clone()
            nxt["is_init"] = torch.zeros_like(data["is_init"])
            next_value = critic(nxt)["agents", "state_value"]
        expand = data["next", "agents", "reward"].shape  # done/terminated per agent, as TorchRL's recipe
        done, term = (data["next", k].unsqueeze(-1).expand(expand) for k in ("done", "terminated"))
        adv, target = generalized_advantage_estimate(a.gamma, a.lmbda, value, next_value,
                                                     data["next", "agents", "reward"], done, term, time_dim=-3)
        data["agents", "advantage"], data["agents", "value_target"] = adv, target
        for _ in range(a.epochs):
            for rows in torch.randperm(a.envs).split(a.minibatch_envs):
                with rf.set_recurrent_mode(True):
                    out = loss(data[rows])
                total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
                optim.zero_grad()
                total.backward()
                nn.utils.clip_grad_norm_(loss.parameters(), 1.0)
                optim.step()
        collector.update_policy_weights_()
    collector.shutdown()
    return curve


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--envs", type=int, default=64)
    p.add_argument("--max-steps", type=int, default=40)
    p.add_argument("--agents", type=int, default=3)
    p.add_argument("--cue-steps", type=int, default=1)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--minibatch-envs", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--gamma", type=float, default=0.95)
    p.add_argument("--lmbda", type=float, default=0.9)
    p.add_argument("--runs", nargs="+", default=["gru-mappo", "gru-ippo", "mlp-mappo", "mlp-ippo"])
    p.add_argument("--json", default=None, help="write the curves here")
    p.add_argument("--plot", default=None, help="save a plot of returns against frames here")
    a = p.parse_args()
    torch.set_num_threads(1)
    results = {}
    for run in a.runs:
        kind, algo = run.split("-")
        for seed in a.seeds:
            t0 = time.time()
            curve = train(kind, algo == "mappo", seed, a)
            results[f"{run}/{seed}"] = curve
            last = sum(r for _, r in curve[-3:]) / len(curve[-3:])
            print(f"{run:10s} seed {seed}: first {curve[0][1]:7.3f}  last-3 mean {last:7.3f}  "
                  f"({curve[-1][0]} frames, {time.time() - t0:.0f} s)", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f)
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        colors = {"gru-mappo": "C0", "gru-ippo": "C2", "mlp-mappo": "C3", "mlp-ippo": "C1"}
        for key, curve in results.items():
            run, seed = key.split("/")
            ax.plot(*zip(*curve), color=colors.get(run), alpha=0.8, label=run if seed == str(a.seeds[0]) else None)
        ax.set_xlabel("frames")
        ax.set_ylabel("mean episode return per agent")
        ax.set_title(f"VMAS navigation, goal shown for {a.cue_steps} step(s): MultiAgentGRU vs MultiAgentMLP")
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.plot, dpi=120)


if __name__ == "__main__":
    main()
