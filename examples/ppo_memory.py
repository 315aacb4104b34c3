"""Recurrent PPO on CartPole-v1 with the velocities hidden: a task that needs memory.

The agent sees only the cart position and the pole angle. To balance the pole it has to
infer both velocities from the recent observations, which a recurrent policy can do and a
memoryless one cannot. The recurrent core is ``rnn_functional.GRUModule`` (a drop-in
replacement for ``torchrl.modules.GRUModule``). TorchRL provides the rest: a vectorized
env, the ``Collector``, ``GAE`` and ``ClipPPOLoss``. The policy is compiled with
``torch.compile(fullgraph=True)`` twice: one step at a time for collection, and over whole
``[envs, time]`` rollouts with episode resets inside them for the values and the loss.

Run::

    python examples/ppo_memory.py               # recurrent policy, about 3 min on 2 shared CPU cores
    python examples/ppo_memory.py --memoryless  # same budget, MLP-only policy (the baseline)
    python examples/ppo_memory.py --quick       # reduced size (the test), under 1 minute

Each run writes ``<out>/ppo_memory_<kind>.json`` (config, per-iteration log, greedy
evaluations, final returns) and redraws ``<out>/ppo_memory.png`` with the learning curves of
both kinds whose JSON is in ``<out>`` (``--quick`` runs use a ``_quick`` suffix). Uses the GPU for the networks when there is
one (``--device``); the environments always step on the CPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import gymnasium as gym
import tensordict
import torch
import torchrl
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.collectors import Collector
from torchrl.envs import (
    Compose,
    GymWrapper,
    InitTracker,
    ObservationNorm,
    RewardSum,
    StepCounter,
    Transform,
    TransformedEnv,
)
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, ProbabilisticActor, set_recurrent_mode
from torchrl.modules.utils import get_primers_from_module
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

from rnn_functional import GRUModule

# CartPole's observation is (cart position, cart velocity, pole angle, pole angular velocity);
# its actions are push left / push right.
VISIBLE = [0, 2]
N_ACTIONS = 2
# Episodes end when |cart position| > 2.4 or |pole angle| > 0.2095 rad: dividing by these
# puts both inputs in [-1, 1], so the small step-to-step changes the policy must remember
# are not drowned by the scale difference between the two entries.
OBS_SCALE = [1 / 2.4, 1 / 0.2095]


class HideVelocities(Transform):
    """Keep only the cart position and the pole angle of CartPole's observation: ``[*B, 4] -> [*B, 2]``."""

    def __init__(self) -> None:
        super().__init__(in_keys=["observation"], out_keys=["observation"])

    def _apply_transform(self, obs: torch.Tensor) -> torch.Tensor:
        return obs[..., VISIBLE]

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return self._call(tensordict_reset)

    def transform_observation_spec(self, observation_spec):
        spec = observation_spec["observation"]
        observation_spec["observation"] = type(spec)(
            low=spec.space.low[..., VISIBLE],
            high=spec.space.high[..., VISIBLE],
            shape=(*spec.shape[:-1], len(VISIBLE)),
            dtype=spec.dtype,
            device=spec.device,
        )
        return observation_spec


@dataclass
class Config:
    """Everything that defines a run (saved in the JSON log)."""

    memoryless: bool = False
    iterations: int = 800
    num_envs: int = 16
    steps_per_env: int = 32  # rollout length per iteration = truncated-BPTT length
    epochs: int = 10
    minibatches: int = 1  # split along the env dim: a minibatch holds whole rollouts
    hidden: int = 64
    lr: float = 1e-3  # decays linearly to 0 over the run
    gamma: float = 0.98
    lmbda: float = 0.8
    clip_epsilon: float = 0.2
    entropy_coeff: float = 0.01
    critic_coeff: float = 0.5
    max_grad_norm: float = 1.0
    eval_envs: int = 16
    evals: int = 10  # greedy evaluations during training (and one at the end)
    seed: int = 0
    compile: bool = True
    device: str = "cpu"


QUICK = dict(iterations=40, lr=4e-3, entropy_coeff=0.0, eval_envs=8, evals=4)  # faster, less stable: fine for 40 its


def make_env(num_envs: int, policy: nn.Module | None = None) -> TransformedEnv:
    """``num_envs`` CartPole-v1 copies in one process (a gymnasium sync vector env), velocities hidden.

    Adds ``is_init`` (trajectory starts, for the recurrent core), the step count, the running
    episode return (``episode_reward``) and, when ``policy`` has a recurrent core, the primer
    that puts its zero initial state into the reset TensorDicts.
    """
    vec = gym.make_vec(
        "CartPole-v1",
        num_envs=num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
    )
    env = GymWrapper(vec, categorical_action_encoding=True)
    scale = ObservationNorm(loc=torch.zeros(len(VISIBLE)), scale=torch.tensor(OBS_SCALE), in_keys=["observation"])
    env = TransformedEnv(env, Compose(HideVelocities(), scale, InitTracker(), StepCounter(), RewardSum()))
    if policy is not None and (primers := get_primers_from_module(policy, warn=False)) is not None:
        env.append_transform(primers)
    return env


def make_agent(cfg: Config) -> tuple[ProbabilisticActor, TensorDictSequential]:
    """Actor and critic sharing one core: a GRU, or a same-width MLP when ``cfg.memoryless``.

    The recurrent core reads ``observation``, ``recurrent_state`` and ``is_init`` and writes
    ``features`` and ``("next", "recurrent_state")``.
    """
    obs_dim, n_actions = len(VISIBLE), N_ACTIONS
    if cfg.memoryless:
        core = TensorDictModule(
            MLP(obs_dim, cfg.hidden, num_cells=[cfg.hidden], activation_class=nn.Tanh, activate_last_layer=True),
            in_keys=["observation"],
            out_keys=["features"],
        )
    else:
        core = GRUModule(input_size=obs_dim, hidden_size=cfg.hidden, in_key="observation", out_key="features")
    actor_head = TensorDictModule(
        MLP(cfg.hidden, n_actions, num_cells=[cfg.hidden], activation_class=nn.Tanh),
        in_keys=["features"],
        out_keys=["logits"],
    )
    value_head = TensorDictModule(
        MLP(cfg.hidden, 1, num_cells=[cfg.hidden], activation_class=nn.Tanh),
        in_keys=["features"],
        out_keys=["state_value"],
    )
    actor = ProbabilisticActor(
        TensorDictSequential(core, actor_head),
        in_keys=["logits"],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    )
    critic = TensorDictSequential(core, value_head)
    return actor.to(cfg.device), critic.to(cfg.device)


def make_value_fn(critic: TensorDictSequential):
    """``values(batch [E, T]) -> (V(s_t), V(s_{t+1}))``, both ``[E, T, 1]``, one recurrent pass each.

    The next-step pass feeds the next observations with the state stored after each step
    (``("next", "recurrent_state")``). The core starts from that stored state at ``t = 0``
    and wherever the batch starts a trajectory (``is_init``), and carries its own state
    elsewhere, so it reproduces the states of the step-by-step collection pass.
    """
    in_keys = [k for k in critic.in_keys if k != "is_init"]
    recurrent = "is_init" in critic.in_keys

    def value(td: TensorDictBase) -> torch.Tensor:
        return critic(td).get("state_value")

    def values(batch: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
        now = batch.select(*critic.in_keys)
        nxt = batch.get("next").select(*in_keys)
        if recurrent:
            nxt.set("is_init", batch.get("is_init"))
        with torch.no_grad(), set_recurrent_mode(True):
            return value(now), value(nxt)

    return values


class Progress:
    """A one-line text progress bar (``\\r``-updated on a terminal, a line per ~5% otherwise)."""

    def __init__(self, total: int, width: int = 24) -> None:
        self.total, self.width, self.t0 = total, width, time.time()
        self.tty = sys.stdout.isatty()
        self.every = 1 if self.tty else max(1, total // 20)

    def update(self, done: int, text: str) -> None:
        if not (self.tty or done % self.every == 0 or done == self.total):
            return
        elapsed = time.time() - self.t0
        eta = elapsed / done * (self.total - done)
        fill = round(self.width * done / self.total)
        line = (
            f"[{'#' * fill}{'.' * (self.width - fill)}] {done}/{self.total} it | {text} | "
            f"{_fmt_s(elapsed)} elapsed, {_fmt_s(eta)} left"
        )
        print(("\r" + line) if self.tty else line, end="" if self.tty and done < self.total else "\n", flush=True)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _fmt_s(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def evaluate(actor: ProbabilisticActor, num_envs: int, seed: int, device: str) -> list[float]:
    """Return of one greedy (mode of the action distribution) episode in each of ``num_envs`` envs."""
    env = make_env(num_envs, actor)
    env.set_seed(seed)
    max_steps = 500  # CartPole-v1 truncates episodes at 500 steps
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        rollout = env.rollout(max_steps, actor, break_when_any_done=False, auto_cast_to_device=True)
    env.close()
    done = rollout["next", "done"].squeeze(-1).cpu()
    ep_return = rollout["next", "episode_reward"].squeeze(-1).cpu()
    first_done = done.float().argmax(-1)  # every env finishes within max_steps
    return ep_return[torch.arange(num_envs), first_done].tolist()


def train(cfg: Config) -> dict:
    """Run PPO with ``cfg``; returns the log (also what the JSON file holds)."""
    torch.manual_seed(cfg.seed)
    actor, critic = make_agent(cfg)
    env = make_env(cfg.num_envs, actor)
    env.set_seed(cfg.seed)
    loss_module = ClipPPOLoss(
        actor,
        critic,
        clip_epsilon=cfg.clip_epsilon,
        entropy_coeff=cfg.entropy_coeff,
        critic_coeff=cfg.critic_coeff,
        loss_critic_type="smooth_l1",
        normalize_advantage=True,
    )
    gae = GAE(gamma=cfg.gamma, lmbda=cfg.lmbda, value_network=None, average_gae=False)
    optim = torch.optim.Adam(loss_module.parameters(), lr=cfg.lr)
    schedule = torch.optim.lr_scheduler.LinearLR(optim, 1.0, 0.0, total_iters=cfg.iterations)  # lr: cfg.lr -> 0
    frames = cfg.num_envs * cfg.steps_per_env
    collector = Collector(
        env,
        actor,
        frames_per_batch=frames,
        total_frames=frames * cfg.iterations,
        env_device="cpu",
        policy_device=cfg.device,
        storing_device=cfg.device,
        compile_policy={"fullgraph": True} if cfg.compile else False,
    )

    def loss_fn(batch: TensorDictBase) -> tuple[torch.Tensor, TensorDictBase]:
        losses = loss_module(batch)
        total = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
        return total, losses.detach()

    values = make_value_fn(critic)
    if cfg.compile:
        loss_fn = torch.compile(loss_fn, fullgraph=True)
        values = torch.compile(values, fullgraph=True)

    kind = "memoryless" if cfg.memoryless else "recurrent"
    print(f"PPO, CartPole-v1 with velocities hidden, {kind} policy, {cfg.iterations} iterations x {frames} frames, "
          f"device {cfg.device}, compile {cfg.compile} (the first iterations include compilation)")
    progress = Progress(cfg.iterations)
    rows, returns, last_eval = [], [], float("nan")
    t0 = t_collect = time.time()
    for it, batch in enumerate(collector):
        t_train = time.time()
        value, next_value = values(batch)  # batch: [num_envs, steps_per_env]
        batch.set("state_value", value)
        batch.set(("next", "state_value"), next_value)
        gae(batch)
        for _ in range(cfg.epochs):
            for idx in torch.randperm(cfg.num_envs, device=cfg.device).chunk(cfg.minibatches):
                total, losses = loss_fn(batch[idx])
                total.backward()
                nn.utils.clip_grad_norm_(loss_module.parameters(), cfg.max_grad_norm)
                optim.step()
                optim.zero_grad(set_to_none=True)
        schedule.step()
        collector.update_policy_weights_()
        done = batch["next", "done"].squeeze(-1)
        new = batch["next", "episode_reward"].squeeze(-1)[done].cpu().tolist()
        returns += new
        recent = returns[-100:]
        rows.append(
            {
                "iteration": it,
                "frames": (it + 1) * frames,
                "time_s": round(time.time() - t0, 2),
                "collect_s": round(t_train - t_collect, 3),
                "train_s": round(time.time() - t_train, 3),
                "episodes": len(new),
                "mean_return": sum(new) / len(new) if new else None,
                "mean_return_last100": sum(recent) / len(recent) if recent else None,
                **{k: round(v.item(), 5) for k, v in losses.items() if k.startswith("loss_")},
            }
        )
        if (it + 1) % max(1, cfg.iterations // cfg.evals) == 0 and it + 1 < cfg.iterations:
            rows[-1]["eval_return"] = _mean(evaluate(actor, cfg.eval_envs, cfg.seed + 10_000, cfg.device))
            last_eval = rows[-1]["eval_return"]
        progress.update(
            it + 1,
            f"{(it + 1) * frames} frames | return: train (last 100 eps) {rows[-1]['mean_return_last100']:.1f}, "
            f"greedy {last_eval:.1f}",
        )
        t_collect = time.time()
    collector.shutdown()
    wall = time.time() - t0
    eval_returns = evaluate(actor, cfg.eval_envs, cfg.seed + 10_000, cfg.device)
    rows[-1]["eval_return"] = _mean(eval_returns)
    tail = [r for row in rows[-max(1, cfg.iterations // 10):] for r in [row["mean_return"]] if r is not None]
    result = {
        "kind": kind,
        "config": asdict(cfg),
        "final": {
            "train_return_last100": rows[-1]["mean_return_last100"],
            "train_return_last10pct_iterations": sum(tail) / len(tail) if tail else None,
            "eval_return_mean": _mean(eval_returns),
            "eval_returns": eval_returns,
            "frames": cfg.iterations * frames,
            "wall_time_s": round(wall, 1),
        },
        "log": rows,
        "env": {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torchrl": torchrl.__version__,
            "tensordict": tensordict.__version__,
            "gymnasium": gym.__version__,
            "cpu_threads": torch.get_num_threads(),
            "device": cfg.device,
        },
    }
    print(
        f"done in {_fmt_s(wall)}: training return (last 100 episodes) {result['final']['train_return_last100']:.1f}, "
        f"greedy eval return {result['final']['eval_return_mean']:.1f} over {cfg.eval_envs} episodes"
    )
    return result


def plot(out: Path, quick: bool) -> Path | None:
    """Draw the learning curves of the runs saved in ``out`` into ``ppo_memory[_quick].png``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return None
    suffix = "_quick" if quick else ""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for kind, color in [("recurrent", "tab:blue"), ("memoryless", "tab:orange")]:
        path = out / f"ppo_memory_{kind}{suffix}.json"
        if not path.exists():
            continue
        run = json.loads(path.read_text())
        xs = [row["frames"] for row in run["log"] if row["mean_return_last100"] is not None]
        ys = [row["mean_return_last100"] for row in run["log"] if row["mean_return_last100"] is not None]
        label = f"{kind}: greedy policy (final {run['final']['eval_return_mean']:.0f}, run {_fmt_s(run['final']['wall_time_s'])})"
        ax.plot(xs, ys, color=color, alpha=0.5, label=f"{kind}: sampled actions (last 100 episodes)")
        evals = [(row["frames"], row["eval_return"]) for row in run["log"] if "eval_return" in row]
        ax.plot(*zip(*evals), "o-", color=color, label=label)
    ax.set_xlabel("environment frames")
    ax.set_ylabel("mean episode return")
    ax.set_title("PPO on CartPole-v1 with the velocities hidden")
    ax.set_ylim(0, 510)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    png = out / f"ppo_memory{suffix}.png"
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memoryless", "--baseline", action="store_true", help="MLP-only policy (the baseline)")
    parser.add_argument("--quick", action="store_true", help="reduced size: under 2 minutes (used by the tests)")
    parser.add_argument("--iterations", type=int, help="override the number of PPO iterations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-compile", action="store_true", help="run the policy eagerly (for debugging)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--threads", type=int, default=1, help="CPU threads for torch (the networks are tiny: 1 avoids oversubscription)"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = Config(memoryless=args.memoryless, seed=args.seed, compile=not args.no_compile, device=args.device)
    if args.quick:
        cfg = replace(cfg, **QUICK)
    if args.iterations:
        cfg = replace(cfg, iterations=args.iterations)
    result = train(cfg)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"ppo_memory_{result['kind']}{'_quick' if args.quick else ''}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    png = plot(args.out, args.quick)
    print(f"wrote {path}" + (f" and {png}" if png else ""))
    return result


if __name__ == "__main__":
    main()
