"""Recurrent PPO on CartPole-v1 with the velocities hidden: a task that needs memory.

The agent sees only the cart position and the pole angle. To balance the pole it has to infer
both velocities from the recent observations, which a recurrent policy can do and a memoryless
one cannot. The script trains both, three seeds each, and reports what each learned.

* Recurrent policy: actor and critic each read the observation through their own
  ``rnn_functional.LSTMModule`` (the drop-in for ``torchrl.modules.LSTMModule``), then an MLP
  head. Memoryless baseline: the same heads behind an MLP layer.
* The recipe is the RL Zoo's RecurrentPPO for CartPoleNoVel-v1 (sb3-contrib: 32 steps per env
  and update, 20 epochs of one minibatch, lr 1e-3 and clip range 0.2 both decaying linearly to 0,
  gamma 0.98, GAE lambda 0.8, no entropy bonus, max grad norm 0.5, LSTM 64 and heads [64] with
  ReLU, rewards scaled as ``VecNormalize`` does, 1e5 frames) with 16 envs per update instead
  of 8: the update's cost grows with the time steps, hardly with the envs, so the same frames
  cost half as much. Truncated episodes are bootstrapped with the critic's value of their last
  observation.
* The three seeds train side by side as an ensemble: their parameters live stacked in one
  ``TensorDictParams`` (:func:`rnn_functional.stack_params`) under one Adam; each member's
  parameters are swapped into a template agent (``TensorDict.to_module``) for the calls of the
  graphs compiled with ``fullgraph=True`` that serve every member: one policy step, and the PPO
  loss over a member's ``[envs, time]`` rollout with the LSTM in recurrent mode and the episode
  resets inside. All ``3 x 16`` environments step at once (:mod:`cartpole`, gymnasium's
  CartPole-v1 written in torch). (Swapping inside a compiled ``torch.vmap`` would touch the
  modules' ``nn.LSTM`` child, which Dynamo refuses. A compiled ``torch.vmap`` over
  ``module.forward_with_params`` would avoid that; this example keeps the measured per-member
  loop, see ``docs/ensembles.md`` for compiled ensemble training.)
* The memoryless baseline trains in a second process meanwhile (one CPU core each;
  ``--sequential`` trains one after the other).
* ``evals`` times during training and at the end, each member plays ``eval_episodes`` episodes
  with the greedy action (the mode) and as many with sampled actions.

Run::

    python examples/ppo_memory.py           # both policies, 3 seeds each, 1e5 frames per seed
    python examples/ppo_memory.py --quick   # the CI check: shorter, fails unless memory helps
    python examples/ppo_memory.py --cell rglru --policies recurrent   # another core: gru, min_gru, rglru

Writes ``<out>/summary.json`` (final returns per seed), ``<out>/log_<policy>.json`` (config and
per-iteration log), ``<out>/log_memoryless.txt`` (the second process's output) and
``<out>/ppo_memory.png`` (learning curves of this run), ``<out>`` being ``runs/ppo_memory``
(``runs/ppo_memory_quick`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import torch
import torchrl.modules.tensordict_module.rnn  # noqa: F401 - see below
from tensordict import TensorDict
from tensordict.nn import TensorDictParams
from torch import nn

import cartpole
from rnn_functional import GRUModule, LSTMModule, MinGRUModule, RGLRUModule, set_recurrent_mode, stack_params

# Our modules read TorchRL's recurrent-mode flag when TorchRL's rnn module is loaded and look it
# up in sys.modules otherwise; under torch.compile that lookup guards on len(sys.modules), which
# every Inductor compilation changes, so each compiled graph holding a module would recompile
# after the next compilation. Loading TorchRL's module first keeps the graphs valid. TorchRL
# logs at INFO level on stdout: keep its warnings only.
logging.getLogger("torchrl").setLevel(logging.WARNING)

ROOT = Path(__file__).resolve().parents[1]
# The policy sees (cart position, pole angle), scaled by the termination limits to [-1, 1].
OBS_SCALE = (1 / cartpole.X_LIMIT, 1 / cartpole.THETA_LIMIT)
N_ACTIONS = 2  # push left, push right
_IMPORTED = time.perf_counter()


@dataclass
class Config:
    """Everything that defines a run of one policy (saved in its log)."""

    policy: str = "recurrent"  # or "memoryless"
    seeds: tuple[int, ...] = (0, 1, 2)
    frames: int = 100_000  # per seed
    num_envs: int = 16  # the RL Zoo uses 8: twice the envs per update costs little more (time dominates)
    steps_per_env: int = 32  # rollout length per update = truncated-BPTT length
    epochs: int = 20
    minibatches: int = 1  # split along the env dim: a minibatch holds whole rollouts
    cell: str = "lstm"  # or "gru", "min_gru", "rglru" (see CORES)
    shared_core: bool = False  # one recurrent core for actor and critic
    hidden: int = 64
    lr: float = 1e-3  # decays linearly to 0
    clip_epsilon: float = 0.2  # decays linearly to 0
    gamma: float = 0.98
    lmbda: float = 0.8
    entropy_coeff: float = 0.0
    critic_coeff: float = 0.5
    max_grad_norm: float = 0.5
    evals: int = 10  # evaluations during training (the last one is the final evaluation)
    eval_episodes: int = 16  # per member, greedy and as many sampled

    @property
    def iterations(self) -> int:
        return max(1, self.frames // (self.num_envs * self.steps_per_env))


CORES = {"lstm": LSTMModule, "gru": GRUModule, "min_gru": MinGRUModule, "rglru": RGLRUModule}  # --cell
QUICK = dict(frames=30_000, epochs=10, evals=4)
QUICK_MARGIN = 50  # greedy return: recurrent minus memoryless, asserted by --quick


class Agent(nn.Module):
    """Actor-critic: recurrent cores (``cfg.cell``'s module of :data:`CORES`) or memoryless ones (an MLP
    layer), then an MLP head each for the action logits and the value.

    With ``cfg.shared_core`` actor and critic read the same recurrent core, else each has its
    own (the RL Zoo's ``enable_critic_lstm``). ``memory`` is the tuple of the cores' recurrent
    states, each ``[*B, 1, H]`` (actor's then critic's; LSTM: h then c); empty when memoryless.
    """

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        h, obs_dim = cfg.hidden, len(OBS_SCALE)
        self.recurrent = cfg.policy == "recurrent"
        if self.recurrent:
            rnn = CORES[cfg.cell]
            make_core = lambda: rnn(input_size=obs_dim, hidden_size=h, in_key="observation", out_key="features")  # noqa: E731
        else:
            make_core = lambda: nn.Sequential(nn.Linear(obs_dim, h), nn.ReLU())  # noqa: E731
        self.actor_core = make_core()
        self.critic_core = None if (self.recurrent and cfg.shared_core) else make_core()
        self.actor_head = nn.Sequential(nn.Linear(h, h), nn.ReLU(), nn.Linear(h, N_ACTIONS))
        self.critic_head = nn.Sequential(nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 1))
        self.states_per_core = (2 if cfg.cell == "lstm" else 1) if self.recurrent else 0
        self.memory_size = self.states_per_core * (1 if self.critic_core is None else 2)

    def _core(self, core: nn.Module, obs: torch.Tensor, memory: tuple, is_init: torch.Tensor):
        """Features ``[*B, H]`` (``[*B, T, H]`` in recurrent mode) and the core's next states."""
        if not self.recurrent:
            return core(obs), ()
        state_keys = core.in_keys[1:-1]  # between the input and is_init
        td = TensorDict({"observation": obs, "is_init": is_init, **dict(zip(state_keys, memory))}, obs.shape[:-1])
        out = core(td)
        return out["features"], tuple(out[key] for key in core.out_keys[1:])

    def _features(self, obs: torch.Tensor, memory: tuple, is_init: torch.Tensor):
        """Actor features, critic features and the next memory."""
        k = self.states_per_core
        actor, actor_next = self._core(self.actor_core, obs, memory[:k], is_init)
        if self.critic_core is None:
            return actor, actor, actor_next
        critic, critic_next = self._core(self.critic_core, obs, memory[k:], is_init)
        return actor, critic, actor_next + critic_next

    def act(self, obs: torch.Tensor, memory: tuple, is_init: torch.Tensor):
        """One step: ``obs [N, 2]`` -> ``(logits [N, 2], value [N], next memory)``."""
        actor, critic, next_memory = self._features(obs, memory, is_init)
        return self.actor_head(actor), self.critic_head(critic).squeeze(-1), next_memory

    def value(self, obs: torch.Tensor, memory: tuple) -> torch.Tensor:
        """The critic's value ``[N]`` of ``obs [N, 2]`` with the state ``memory`` (no reset)."""
        _, critic, _ = self._features(obs, memory, torch.zeros(obs.shape[:-1], dtype=torch.bool))
        return self.critic_head(critic).squeeze(-1)

    def sequence(self, obs: torch.Tensor, memory: tuple, is_init: torch.Tensor):
        """A rollout: ``obs [N, T, 2]``, stored ``memory`` ``[N, T, 1, H]`` each, ``is_init [N, T]``
        -> ``(logits [N, T, 2], value [N, T])``, restarting from the stored state at ``t = 0`` and at
        every episode start. Call it inside ``set_recurrent_mode(True)``."""
        actor, critic, _ = self._features(obs, memory, is_init)
        return self.actor_head(actor), self.critic_head(critic).squeeze(-1)


def observe(state: torch.Tensor) -> torch.Tensor:
    """What the policy sees of CartPole's state ``[*B, 4]`` (float64): ``[*B, 2]`` float32."""
    obs = state.float()  # gymnasium's float32 observation
    return obs[..., 0::2] * torch.tensor(OBS_SCALE)


class Ensemble:
    """The members' parameters, stacked, and the compiled functions that run them.

    ``params`` (a ``TensorDictParams`` ``[E]``, the ``Agent``'s parameter tree with leaves
    ``[E, *shape]``) holds the members' initial parameters stacked with
    :func:`rnn_functional.stack_params`; ``members[m]`` are views of member ``m``'s. Each call
    swaps a member's parameters into ``template`` (``TensorDict.to_module``, outside the
    compiled graph: Dynamo refuses to touch the ``nn.LSTM`` child the swap writes into) and runs
    one graph compiled with ``fullgraph=True`` that serves every member. Adam works element by
    element, so one optimizer over the stacked leaves is E independent optimizers.
    """

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        members = []
        for seed in cfg.seeds:
            torch.manual_seed(seed)
            members.append(TensorDict.from_module(Agent(cfg)).detach())
        self.params = TensorDictParams(stack_params(members))
        self.members = [self.params[m] for m in range(len(cfg.seeds))]
        self.leaves = list(self.params.values(include_nested=True, leaves_only=True))
        self.template = Agent(cfg)
        self.optim = torch.optim.Adam(self.leaves, lr=cfg.lr, foreach=True)
        options = dict(fullgraph=True, dynamic=False)
        self.act = torch.compile(self.template.act, **options)
        self.value = torch.compile(self.template.value, **options)
        self.env_step = torch.compile(_env_step, **options)
        self.losses = torch.compile(self._losses, **options)

    def step(self, state, steps, memory, is_init, greedy, bootstrap: bool):
        """Act and step the environments.

        ``state [E, N, 4]``, ``steps [E, N]``, ``memory`` (each ``[E, N, 1, H]``), ``is_init [E, N]``
        (episode starts: their memory is zeroed), ``greedy [E, N]`` (mode instead of a sample).
        Returns the step's record (obs, the memory it read, action, log-prob, value, reward,
        terminated, truncated, and the value of the next observation where an episode was
        truncated, everywhere if ``bootstrap``, else 0), and the next
        ``(state, steps, memory, is_init)`` with finished episodes reset.
        """
        memory = tuple(m * ~is_init[..., None, None] for m in memory)
        obs = observe(state)
        outs = []
        for m, params in enumerate(self.members):
            with params.to_module(self.template):
                outs.append(self.act(obs[m], tuple(x[m] for x in memory), is_init[m]))
        logits = torch.stack([o[0] for o in outs])
        value = torch.stack([o[1] for o in outs])
        next_memory = tuple(torch.stack(parts) for parts in zip(*(o[2] for o in outs)))
        action, log_prob, next_state, next_steps, reward, terminated, truncated = self.env_step(
            logits, greedy, state, steps
        )
        next_value = torch.zeros_like(value)
        if bootstrap or bool(truncated.any()):
            next_obs = observe(next_state)
            for m, params in enumerate(self.members):
                with params.to_module(self.template):
                    next_value[m] = self.value(next_obs[m], tuple(x[m] for x in next_memory))
        done = terminated | truncated
        fresh = cartpole.initial_state(tuple(steps.shape))
        state, steps = cartpole.reset_done(next_state, next_steps, done, fresh)
        record = dict(
            obs=obs, memory=memory, is_init=is_init, action=action, log_prob=log_prob, value=value,
            reward=reward.float(), terminated=terminated, truncated=truncated, next_value=next_value,
        )
        return record, state, steps, next_memory, done

    def _losses(self, batch, clip_epsilon):
        """PPO losses of the member whose parameters are in ``template`` on ``batch`` ([N, T] rollout
        tensors): (total, stats [4])."""
        cfg = self.cfg
        logits, value = self.template.sequence(batch["obs"], batch["memory"], batch["is_init"])
        log_probs = logits.log_softmax(-1)
        log_prob = log_probs.gather(-1, batch["action"].unsqueeze(-1)).squeeze(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
        advantage = batch["advantage"]
        advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
        ratio = (log_prob - batch["log_prob"]).exp()
        clipped = ratio.clamp(1 - clip_epsilon, 1 + clip_epsilon)
        policy_loss = -torch.minimum(ratio * advantage, clipped * advantage).mean()
        critic_loss = (value - batch["return"]).square().mean()
        total = policy_loss + cfg.critic_coeff * critic_loss - cfg.entropy_coeff * entropy
        clip_fraction = ((ratio - 1).abs() > clip_epsilon).float().mean()
        return total, torch.stack([policy_loss, critic_loss, entropy, clip_fraction]).detach()

    def update(self, rollout: dict, progress: float) -> torch.Tensor:
        """``epochs`` PPO epochs on ``rollout`` ([E, N, T] tensors); returns the mean stats ``[E, 4]``."""
        cfg = self.cfg
        scale = 1 - progress  # linear decay of lr and clip range, as the RL Zoo's ``lin_`` schedules
        for group in self.optim.param_groups:
            group["lr"] = cfg.lr * scale
        clip_epsilon = torch.tensor(cfg.clip_epsilon * scale)
        stats = torch.zeros(len(self.members), 4)
        for _ in range(cfg.epochs):
            for envs in torch.randperm(cfg.num_envs).chunk(cfg.minibatches):
                total = 0
                for m, params in enumerate(self.members):
                    batch = {k: _index(v, m, envs) for k, v in rollout.items()}
                    with params.to_module(self.template), set_recurrent_mode(True):
                        loss, member_stats = self.losses(batch, clip_epsilon)
                    total = total + loss
                    stats[m] += member_stats
                total.backward()
                clip_grad_norm_per_member(self.leaves, cfg.max_grad_norm)
                self.optim.step()
                self.optim.zero_grad(set_to_none=True)
        return stats / (cfg.epochs * cfg.minibatches)


def _env_step(logits, greedy, state, steps):
    """Pick actions from ``logits [E, N, 2]`` (the mode where ``greedy``, else a sample) and step
    CartPole: ``(action, log_prob, next_state, next_steps, reward, terminated, truncated)``."""
    log_probs = logits.log_softmax(-1)
    sampled = torch.rand_like(log_probs[..., 1]) < log_probs[..., 1].exp()
    action = torch.where(greedy, logits[..., 1] > logits[..., 0], sampled).long()
    log_prob = log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)
    return action, log_prob, *cartpole.step(state, steps, action)


def clip_grad_norm_per_member(leaves: list[torch.Tensor], max_norm: float) -> None:
    """Scale each member's gradient (row ``e`` of every leaf ``[E, ...]``) to norm <= ``max_norm``."""
    squares = torch.stack([leaf.grad.flatten(1).square().sum(1) for leaf in leaves]).sum(0)  # [E]
    scale = (max_norm / (squares.sqrt() + 1e-6)).clamp(max=1.0)
    for leaf in leaves:
        leaf.grad.mul_(scale.view(-1, *[1] * (leaf.ndim - 1)))


def _index(value, member: int, envs: torch.Tensor):
    """``value[member, envs]`` for a tensor or each tensor of a tuple."""
    return tuple(v[member, envs] for v in value) if isinstance(value, tuple) else value[member, envs]


class Rollouts:
    """The ensemble's training environments ``[E, N]`` and the policy memory carried between rollouts."""

    def __init__(self, ensemble: Ensemble) -> None:
        cfg = ensemble.cfg
        self.ensemble, self.cfg = ensemble, cfg
        shape = (len(cfg.seeds), cfg.num_envs)
        self.state = cartpole.initial_state(shape)
        self.steps = torch.zeros(shape, dtype=torch.long)
        self.memory = tuple(torch.zeros(*shape, 1, cfg.hidden) for _ in range(ensemble.template.memory_size))
        self.is_init = torch.ones(shape, dtype=torch.bool)
        self.greedy = torch.zeros(shape, dtype=torch.bool)
        self.episode_return = torch.zeros(shape)
        self.reward_scale = RewardScale(shape, cfg.gamma)

    @torch.no_grad()
    def collect(self) -> tuple[dict, list[list[float]]]:
        """One rollout of ``steps_per_env`` steps: tensors ``[E, N, T]`` with GAE advantages and returns,
        and the returns of the episodes that ended, per member."""
        records, finished = [], [[] for _ in self.cfg.seeds]
        for t in range(self.cfg.steps_per_env):
            record, self.state, self.steps, self.memory, done = self.ensemble.step(
                self.state, self.steps, self.memory, self.is_init, self.greedy,
                bootstrap=t + 1 == self.cfg.steps_per_env,
            )
            self.is_init = done
            self.episode_return += record["reward"]
            record["reward"] = self.reward_scale(record["reward"], done)
            for m, n in done.nonzero().tolist():
                finished[m].append(self.episode_return[m, n].item())
            self.episode_return = self.episode_return * ~done
            records.append(record)
        rollout = {
            k: tuple(torch.stack(parts, dim=2) for parts in zip(*(r[k] for r in records)))
            if k == "memory"
            else torch.stack([r[k] for r in records], dim=2)
            for k in records[0]
        }
        rollout["advantage"] = gae(rollout, self.cfg.gamma, self.cfg.lmbda)
        rollout["return"] = rollout["advantage"] + rollout["value"]
        return rollout, finished


class RewardScale:
    """Divides rewards by a running standard deviation of the discounted return, per member, as
    SB3's ``VecNormalize(norm_reward=True)`` in the RL Zoo's recipe: it keeps the critic's targets
    near 1 whatever the episode length, so its loss does not swamp the policy's under the shared
    gradient-norm clip."""

    def __init__(self, shape: tuple[int, int], gamma: float) -> None:
        self.gamma = gamma
        self.discounted = torch.zeros(shape)
        self.mean, self.var, self.count = torch.zeros(shape[0]), torch.ones(shape[0]), 1e-4

    def __call__(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """``reward [E, N]`` scaled; ``done [E, N]`` ends the discounted sums."""
        self.discounted = self.discounted * self.gamma + reward
        batch_mean, batch_var, n = self.discounted.mean(1), self.discounted.var(1, unbiased=False), reward.shape[1]
        delta, total = batch_mean - self.mean, self.count + n
        self.mean = self.mean + delta * n / total
        self.var = (self.var * self.count + batch_var * n + delta.square() * self.count * n / total) / total
        self.count = total
        self.discounted = self.discounted * ~done
        return (reward / (self.var.sqrt().unsqueeze(1) + 1e-8)).clamp(-10, 10)


def gae(rollout: dict, gamma: float, lmbda: float) -> torch.Tensor:
    """Generalised advantage estimates ``[E, N, T]``.

    The value after step ``t`` is the next step's value within an episode, the critic's value of
    the last observation where the episode was truncated (or the rollout ends), 0 where it
    terminated.
    """
    value, reward = rollout["value"], rollout["reward"]
    terminated, truncated = rollout["terminated"], rollout["truncated"]
    done = terminated | truncated
    advantage = torch.zeros_like(value)
    last = torch.zeros_like(value[..., 0])
    for t in reversed(range(value.shape[-1])):
        following = value[..., t + 1] if t + 1 < value.shape[-1] else rollout["next_value"][..., t]
        following = torch.where(done[..., t], rollout["next_value"][..., t], following) * ~terminated[..., t]
        delta = reward[..., t] + gamma * following - value[..., t]
        last = delta + gamma * lmbda * ~done[..., t] * last
        advantage[..., t] = last
    return advantage


@torch.no_grad()
def evaluate(ensemble: Ensemble, episodes: int) -> dict[str, list[float]]:
    """Mean return per member of ``episodes`` greedy and ``episodes`` sampled-action episodes.

    Runs rounds of ``num_envs`` fresh episodes per member (the training shape: no recompile).
    """
    cfg = ensemble.cfg
    shape = (len(cfg.seeds), cfg.num_envs)
    result = {}
    for kind in ("greedy", "sampled"):
        returns = []
        for _ in range(math.ceil(episodes / cfg.num_envs)):
            state, steps = cartpole.initial_state(shape), torch.zeros(shape, dtype=torch.long)
            memory = tuple(torch.zeros(*shape, 1, cfg.hidden) for _ in range(ensemble.template.memory_size))
            is_init = torch.ones(shape, dtype=torch.bool)
            greedy = torch.full(shape, kind == "greedy")
            total, running = torch.zeros(shape), torch.ones(shape, dtype=torch.bool)
            for _ in range(cartpole.MAX_STEPS):
                record, state, steps, memory, is_init = ensemble.step(
                    state, steps, memory, is_init, greedy, bootstrap=False
                )
                total += record["reward"] * running
                running &= ~is_init  # is_init: the episode just ended
                if not running.any():
                    break
            returns.append(total)
        result[kind] = torch.cat(returns, dim=1)[:, :episodes].mean(1).tolist()
    return result


class Progress:
    """A progress bar: tqdm on a terminal when installed, else a plain one; plain lines (about
    every 10%) when the output is not a terminal. Rate and ETA count from ``start()``, after the
    compile warm-up."""

    def __init__(self, total: int, label: str) -> None:
        self.total, self.label = total, label
        self.tty = sys.stdout.isatty()
        self.every = max(1, total // 10)
        self.bar = None
        self.t0 = self.done0 = None

    def start(self, done: int) -> None:
        self.t0, self.done0 = time.perf_counter(), done
        if self.tty:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self.bar = tqdm(total=self.total, initial=done, desc=self.label, unit="it", dynamic_ncols=True)

    def update(self, done: int, text: str) -> None:
        if self.bar is not None:
            self.bar.update(done - self.bar.n)
            self.bar.set_postfix_str(text, refresh=False)
            return
        if not self.tty and done % self.every and done != self.total:
            return
        elapsed = time.perf_counter() - self.t0
        rate = (done - self.done0) / elapsed if elapsed > 0 else float("nan")
        eta = (self.total - done) / rate if rate > 0 else float("nan")
        fill = round(24 * done / self.total)
        line = (f"{self.label} [{'#' * fill}{'.' * (24 - fill)}] {done}/{self.total} it, {rate:.1f} it/s, "
                f"{_fmt_s(eta)} left | {text}")
        print("\r" + line if self.tty else line, end="" if self.tty and done < self.total else "\n", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _fmt_s(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def _versions(*names: str) -> dict:
    """The installed version of each named distribution (seeded returns differ across versions and CPUs)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def _cpu_model() -> str:
    """The CPU's model name (oneDNN's kernels, and so the seeded returns, depend on its instruction set)."""
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _seconds_since_start() -> float:
    """Wall time since this Python process started, imports included (Linux); else since import."""
    try:
        started = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22, in ticks
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - started / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def train(cfg: Config) -> dict:
    """Train ``cfg.policy`` for every seed at once; returns its log (config, rows, final returns)."""
    ensemble = Ensemble(cfg)
    rollouts = Rollouts(ensemble)
    frames = cfg.num_envs * cfg.steps_per_env
    eval_every = max(1, cfg.iterations // cfg.evals)
    print(f"{cfg.policy} policy, seeds {list(cfg.seeds)}: {cfg.iterations} updates x {frames} frames per seed "
          f"(the first update compiles)", flush=True)
    progress = Progress(cfg.iterations, cfg.policy)
    rows, recent = [], [[] for _ in cfg.seeds]
    t0, cpu0 = time.perf_counter(), time.process_time()
    for it in range(cfg.iterations):
        t_collect = time.perf_counter()
        rollout, finished = rollouts.collect()
        t_update = time.perf_counter()
        stats = ensemble.update(rollout, it / cfg.iterations)
        row = {
            "iteration": it + 1,
            "frames": (it + 1) * frames,
            "time_s": round(time.perf_counter() - t0, 2),
            "collect_s": round(t_update - t_collect, 3),
            "update_s": round(time.perf_counter() - t_update, 3),
            "episodes": [len(f) for f in finished],
            "train_return": [_mean(f) if f else None for f in finished],
            **{name: stats[:, i].tolist() for i, name in enumerate(("loss_policy", "loss_critic", "entropy", "clip_fraction"))},
        }
        for m, f in enumerate(finished):
            recent[m] = (recent[m] + f)[-20:]
        if (it + 1) % eval_every == 0 or it + 1 == cfg.iterations:
            returns = evaluate(ensemble, cfg.eval_episodes)
            row["greedy_return"], row["sampled_return"] = returns["greedy"], returns["sampled"]
        rows.append(row)
        if it == 0:
            print(f"compiled and ran the first update in {_fmt_s(time.perf_counter() - t0)}", flush=True)
            progress.start(1)
        last = next(r for r in reversed(rows) if "greedy_return" in r) if any("greedy_return" in r for r in rows) else None
        text = f"train return {_mean([_mean(r) for r in recent]):.0f}"
        if last is not None:
            text += f", greedy {_mean(last['greedy_return']):.0f}, sampled {_mean(last['sampled_return']):.0f}"
        progress.update(it + 1, text)
    progress.close()
    wall = time.perf_counter() - t0
    final = rows[-1]
    print(f"{cfg.policy}: {_fmt_s(wall)}; final greedy return per seed {[round(x) for x in final['greedy_return']]}, "
          f"sampled {[round(x) for x in final['sampled_return']]}", flush=True)
    return {
        "policy": cfg.policy,
        "config": {**asdict(cfg), "iterations": cfg.iterations},
        "seeds": list(cfg.seeds),
        "greedy_return": final["greedy_return"],
        "sampled_return": final["sampled_return"],
        "wall_seconds": round(wall, 1),
        "cpu_seconds": round(time.process_time() - cpu0, 1),
        "log": rows,
    }


def plot(runs: dict[str, dict], path: Path) -> bool:
    """Learning curves of this run: mean over seeds with the min-max band, greedy and sampled."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return False
    fig, ax = plt.subplots(figsize=(8, 4.8))
    colors = {"recurrent": "tab:blue", "memoryless": "tab:orange"}
    for policy, run in runs.items():
        rows = [r for r in run["log"] if "greedy_return" in r]
        frames = [r["frames"] for r in rows]
        for kind, style in (("greedy", "-"), ("sampled", "--")):
            values = torch.tensor([r[f"{kind}_return"] for r in rows])  # [evals, seeds]
            mean = values.mean(1)
            final = run[f"{kind}_return"]
            label = (f"{policy}, {kind} actions: final {_mean(final):.0f} "
                     f"(seeds: {min(final):.0f} to {max(final):.0f})")
            ax.plot(frames, mean, style, marker="o", ms=3, color=colors[policy], label=label)
            ax.fill_between(frames, values.min(1).values, values.max(1).values, color=colors[policy], alpha=0.15)
    seeds = len(next(iter(runs.values()))["seeds"])
    ax.set_xlabel("environment frames per seed")
    ax.set_ylabel(f"evaluation return (mean of {seeds} seeds, band: min-max)")
    ax.set_title("PPO on CartPole-v1 with the velocities hidden")
    ax.set_ylim(0, 520)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", bbox_to_anchor=(1, 0.14), fontsize=8)  # above the memoryless curves
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the CI check: shorter, asserts memory helps")
    parser.add_argument("--frames", type=int, help="environment frames per seed (default 100000)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--policies", nargs="+", default=["recurrent", "memoryless"],
                        choices=["recurrent", "memoryless"])
    parser.add_argument("--epochs", type=int, help="PPO epochs per update (default 20)")
    parser.add_argument("--cell", choices=list(CORES), default="lstm",
                        help="the recurrent policy's cores: LSTMModule (default), GRUModule, MinGRUModule or RGLRUModule")
    parser.add_argument("--out", type=Path, help="output folder (default runs/ppo_memory[_quick])")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the networks are tiny)")
    parser.add_argument("--sequential", action="store_true",
                        help="train the policies one after the other (default: the memoryless one in a second "
                             "process, side by side: one core each)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # the second process
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = args.out or ROOT / "runs" / ("ppo_memory_quick" if args.quick else "ppo_memory")
    out.mkdir(parents=True, exist_ok=True)
    base = Config(seeds=tuple(args.seeds), cell=args.cell)
    if args.quick:
        base = replace(base, **QUICK)
    if args.frames:
        base = replace(base, frames=args.frames)
    if args.epochs:
        base = replace(base, epochs=args.epochs)
    policies = list(dict.fromkeys(args.policies))
    side = None
    if not (args.sequential or args.worker) and len(policies) > 1:
        side = policies.pop()  # trained by a second process, its output in <out>/log_<policy>.txt
        flags = [f"--{k}={getattr(args, k)}" for k in ("frames", "epochs", "threads", "cell") if getattr(args, k)]
        command = [sys.executable, __file__, "--worker", "--policies", side, "--out", str(out),
                   "--seeds", *map(str, args.seeds), *flags, *(["--quick"] if args.quick else [])]
        side_log = open(out / f"log_{side}.txt", "w")
        worker = subprocess.Popen(command, stdout=side_log, stderr=subprocess.STDOUT)
        print(f"training the {side} policy in a second process (output: {out / f'log_{side}.txt'})", flush=True)
    runs = {}
    for policy in policies:
        runs[policy] = train(replace(base, policy=policy))
        (out / f"log_{policy}.json").write_text(json.dumps(runs[policy], indent=1) + "\n")
    if args.worker:
        return {}
    if side is not None:
        if worker.wait() != 0:
            raise SystemExit(f"the {side} run failed:\n" + (out / f"log_{side}.txt").read_text()[-3000:])
        side_log.close()
        runs[side] = json.loads((out / f"log_{side}.json").read_text())
        print(f"{side}: {_fmt_s(runs[side]['wall_seconds'])}; final greedy return per seed "
              f"{[round(x) for x in runs[side]['greedy_return']]}, sampled {[round(x) for x in runs[side]['sampled_return']]}")
    wall = _seconds_since_start()
    summary = {
        **{p: {k: run[k] for k in ("seeds", "greedy_return", "sampled_return", "wall_seconds")} for p, run in runs.items()},
        "cell": base.cell,
        "frames_per_seed": base.iterations * base.num_envs * base.steps_per_env,
        "eval_episodes_per_seed": base.eval_episodes,
        "wall_seconds": round(wall, 1),
        "env": {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(),
            "torch": torch.__version__,
            **_versions("tensordict", "torchrl", "gymnasium", "numpy", "rnn_functional"),
            "cpu": _cpu_model(),
            "cpu_threads": torch.get_num_threads(),
        },
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    png = out / "ppo_memory.png"
    plotted = plot(runs, png)
    print(f"wrote {out / 'summary.json'}, {out}/log_*.json" + (f", {png}" if plotted else ""))
    results = " | ".join(
        f"{p} greedy {_mean(run['greedy_return']):.0f}, sampled {_mean(run['sampled_return']):.0f}"
        for p, run in runs.items()
    )
    print(f"PPO, CartPole-v1 with velocities hidden, {len(base.seeds)} seeds x {summary['frames_per_seed']} frames: "
          f"{results} | wall time {_fmt_s(wall)}")
    if args.quick and len(runs) == 2:
        gap = _mean(runs["recurrent"]["greedy_return"]) - _mean(runs["memoryless"]["greedy_return"])
        if gap <= QUICK_MARGIN:
            raise SystemExit(f"--quick: the recurrent policy's greedy return should beat the memoryless one's by more "
                             f"than {QUICK_MARGIN}; the gap is {gap:.0f}")
    return summary


if __name__ == "__main__":
    main()
