"""A recurrent world model ensemble (model-based RL) on a synthetic task it generates itself.

Task: partially observed, action-driven dynamics. Each episode has a hidden 4-d state (two
damped oscillators with random phases and amplitudes, pushed by the actions); the agent
sees only the two positions, with noise. Episodes have random lengths and are packed back
to back into fixed-length sequences, so a sequence contains resets (``is_init``).

Model (RSSM's deterministic path, no stochastic latent): ``e_t = tanh(W_e [o_t, a_t])``,
``h_t = core(h_{t-1}, e_t)`` (reset to zeros where ``is_init``), ``o_{t+1} ~ W_d h_t``. The core is
DreamerV3's block-diagonal GRU (:func:`rnn_functional.block_gru_sequence`, TorchRL's
``DreamerV3BlockGRUCell`` parameters; the default) or a plain GRU (``--core gru``,
:func:`rnn_functional.gru_sequence`).
An ensemble of 5 members is trained jointly with ``torch.vmap`` over stacked parameters
(shared data, ``in_dims=None``); the vmapped loss is
compiled with ``torch.compile(..., fullgraph=True)``, forward and backward (``--eager``:
without). After training, a few compiled and eager training steps run side by side on the
same batches: their losses and grads must agree, and their times are printed. Then each
member "imagines" H steps open loop from the state it filtered on a context window, with the
core's step function inside ``torch.compile(torch.vmap(...), fullgraph=True)``.

Reported: the held-out one-step prediction loss of the ensemble mean next to two trivial
baselines (predict the last observation, predict the mean observation); the imagination
error against "repeat the last observation"; the ensemble's disagreement.

Run: ``python examples/world_model.py`` (full) or ``--quick`` (or ``WORLD_MODEL_QUICK=1``;
reduced sizes, under a minute on 2 CPU cores, most of it compiling). ``--threads 1`` suits the
small models here on a busy CPU.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import torch
import torch.nn.functional as F
from tensordict import TensorDict

import rnn_functional as rf


@dataclass(frozen=True)
class Config:
    members: int = 5
    batch: int = 32
    time: int = 48
    hidden: int = 64
    embed: int = 32
    steps: int = 600
    lr: float = 3e-3
    context: int = 24
    horizon: int = 16
    eval_batch: int = 256
    core: str = "block_gru"  # or "gru"
    blocks: int = 4  # block GRU: blocks of the state (hidden must divide)


QUICK = Config(batch=32, time=20, hidden=32, embed=16, steps=60, lr=1.5e-2, context=10, horizon=5, eval_batch=128)
OBS, ACT, LATENT = 2, 1, 4
NOISE = 0.02
DT = 0.3


# ----------------------------------------------------------------------------- the task


def _dynamics() -> torch.Tensor:
    """``[4, 4]`` transition of two damped oscillators (positions in 0 and 2, velocities in 1 and 3)."""
    a = torch.zeros(LATENT, LATENT)
    for i, (omega, damp) in enumerate([(1.0, 0.02), (2.3, 0.05)]):
        c, s = math.cos(omega * DT), math.sin(omega * DT)
        a[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = (1 - damp) * torch.tensor([[c, s / omega], [-omega * s, c]])
    return a


TRANSITION = _dynamics()
ACTION_IN = torch.tensor([[0.0], [0.3], [0.0], [-0.5]])  # the action pushes both velocities


def generate(batch: int, time: int, g: torch.Generator, min_len: int = 6) -> tuple[torch.Tensor, ...]:
    """Sequences ``obs [B, T, 2]``, ``act [B, T, 1]``, ``is_init [B, T]`` of packed episodes.

    Episode lengths are uniform in ``[min_len, T]``; every episode starts from a fresh random
    hidden state. ``time`` steps are simulated per row, resets included.
    """
    z = torch.randn(batch, LATENT, generator=g)
    obs, is_init = [], []
    act = torch.randn(batch, time, ACT, generator=g).clamp(-2, 2)
    remaining = torch.randint(min_len, time + 1, (batch,), generator=g)
    for t in range(time):
        start = (remaining == 0) | (t == 0)
        fresh = torch.randn(batch, LATENT, generator=g)
        z = torch.where(start[:, None], fresh, z)
        remaining = torch.where(start & (t > 0), torch.randint(min_len, time + 1, (batch,), generator=g), remaining)
        obs.append(z[:, [0, 2]] + NOISE * torch.randn(batch, OBS, generator=g))
        is_init.append(start)
        z = z @ TRANSITION.T + act[:, t] @ ACTION_IN.T
        remaining = remaining - 1
    return torch.stack(obs, 1), act, torch.stack(is_init, 1)


# ----------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Core:
    """A recurrent core: its functional sequence and step and its stacked ensemble params."""

    sequence: Callable
    step: Callable
    init: Callable[[Config, torch.Generator], TensorDict]


def _block_gru_members(cfg: Config, g: torch.Generator) -> TensorDict:
    members = [rf.init_block_gru_params(cfg.embed, cfg.hidden, projection_size=cfg.embed, num_blocks=cfg.blocks,
                                        generator=g) for _ in range(cfg.members)]
    return torch.stack(members)


CORES = {
    "block_gru": Core(rf.block_gru_sequence, rf.block_gru_step, _block_gru_members),
    "gru": Core(rf.gru_sequence, rf.gru_step, lambda cfg, g: rf.ensemble_init_gru_params(
        cfg.members, cfg.embed, cfg.hidden, generator=g)),
}


def init_model(cfg: Config, g: torch.Generator) -> TensorDict:
    """Stacked params of ``cfg.members`` independent world models (``batch_size [E]``)."""
    e = cfg.members

    def uniform(*shape: int, fan_in: int) -> torch.Tensor:
        bound = 1 / math.sqrt(fan_in)
        return torch.empty(e, *shape).uniform_(-bound, bound, generator=g)

    return TensorDict(
        {
            "enc_w": uniform(cfg.embed, OBS + ACT, fan_in=OBS + ACT),
            "enc_b": uniform(cfg.embed, fan_in=OBS + ACT),
            "core": CORES[cfg.core].init(cfg, g),
            "dec_w": uniform(OBS, cfg.hidden, fan_in=cfg.hidden),
            "dec_b": uniform(OBS, fan_in=cfg.hidden),
        },
        batch_size=[e],
    )


def embed(p: TensorDict, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
    return torch.tanh(F.linear(torch.cat([obs, act], -1), p["enc_w"], p["enc_b"]))


def decode(p: TensorDict, h_out: torch.Tensor) -> torch.Tensor:
    return F.linear(h_out, p["dec_w"], p["dec_b"])


def predict_next(core: Core, p: TensorDict, obs, act, is_init) -> tuple[torch.Tensor, torch.Tensor]:
    """One member: ``obs [B, T, 2]`` -> predictions of ``obs[:, 1:]`` ``[B, T-1, 2]`` and the final state."""
    y, h = core.sequence(embed(p, obs[:, :-1], act[:, :-1]), None, p["core"], is_init=is_init[:, :-1])
    return decode(p, y), h


def masked_mse(pred: torch.Tensor, target: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """MSE over the steps whose target is predictable (not the first step of a new episode)."""
    keep = (~starts).unsqueeze(-1).to(pred.dtype)
    return ((pred - target) ** 2 * keep).sum() / (keep.sum() * pred.shape[-1])


def member_loss(core: Core, p: TensorDict, obs, act, is_init) -> torch.Tensor:
    pred, _ = predict_next(core, p, obs, act, is_init)
    return masked_mse(pred, obs[:, 1:], is_init[:, 1:])


def imagine(core: Core, p: TensorDict, h: torch.Tensor, obs0: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """One member, open loop: from state ``h [B, 1, H]`` and observation ``obs0 [B, 2]``, feed its own
    predictions for ``actions [B, K, 1]``; returns the predicted observations ``[B, K, 2]``."""
    obs, preds = obs0, []
    for k in range(actions.shape[1]):
        y, h = core.step(embed(p, obs, actions[:, k]), h, p["core"])
        obs = decode(p, y)
        preds.append(obs)
    return torch.stack(preds, 1)


# ----------------------------------------------------------------------------- main


LossFn = Callable[[TensorDict, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def make_loss(core: Core, compiled: bool) -> LossFn:
    """``(params [E], obs, act, is_init) -> summed loss of the E members``: ``torch.vmap`` over the
    stacked params (data shared by the members), compiled with its backward if ``compiled``."""
    ensemble_loss = torch.vmap(partial(member_loss, core), in_dims=(0, None, None, None))

    def loss(params: TensorDict, obs, act, is_init) -> torch.Tensor:
        return ensemble_loss(params, obs, act, is_init).sum()

    return torch.compile(loss, fullgraph=True) if compiled else loss


def train(cfg: Config, params: TensorDict, loss_fn: LossFn, g: torch.Generator) -> tuple[float, float]:
    """Adam with a cosine schedule for ``cfg.steps`` steps on fresh batches; returns (total s, first step s)."""
    leaves = list(params.values(include_nested=True, leaves_only=True))
    opt = torch.optim.Adam(leaves, lr=cfg.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, cfg.steps)
    start = time.perf_counter()
    first_s = 0.0
    for step in range(cfg.steps):
        obs, act, is_init = generate(cfg.batch, cfg.time, g)
        loss = loss_fn(params, obs, act, is_init)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step == 0:
            first_s = time.perf_counter() - start
        if step % max(1, cfg.steps // 5) == 0:
            print(f"step {step:4d}  train loss per member {loss.item() / cfg.members:.4f}")
    return time.perf_counter() - start, first_s


def compare_steps(
    cfg: Config, params: TensorDict, compiled_loss: LossFn, steps: int, g: torch.Generator
) -> dict[str, float]:
    """Median seconds of one loss + backward, compiled and eager, called in turn on the same batches
    (on a copy of ``params``). The first batch also checks that both give the same loss and grads."""
    eager_loss = make_loss(CORES[cfg.core], compiled=False)
    copy = params.detach().clone()
    leaves = list(copy.values(include_nested=True, leaves_only=True))
    for t in leaves:
        t.requires_grad_(True)

    def loss_and_grads(fn: LossFn, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        loss = fn(copy, *batch)
        return loss.detach(), torch.autograd.grad(loss, leaves)

    batch = generate(cfg.batch, cfg.time, g)
    compiled_out, eager_out = loss_and_grads(compiled_loss, batch), loss_and_grads(eager_loss, batch)
    # float32, two evaluation orders (inductor fuses and reorders reductions): 1e-4 relative
    torch.testing.assert_close(compiled_out, eager_out, rtol=1e-4, atol=1e-5)
    times: dict[str, list[float]] = {"compiled": [], "eager": []}
    for _ in range(steps):
        batch = generate(cfg.batch, cfg.time, g)
        for name, fn in (("compiled", compiled_loss), ("eager", eager_loss)):
            t0 = time.perf_counter()
            loss_and_grads(fn, batch)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main(cfg: Config, seed: int = 0, compiled: bool = True, compare: int = 10) -> dict[str, float]:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    params = init_model(cfg, g)
    for t in params.values(include_nested=True, leaves_only=True):
        t.requires_grad_(True)
    core = CORES[cfg.core]
    loss_fn = make_loss(core, compiled)
    mode = "torch.compile, fullgraph" if compiled else "eager"
    train_s, first_s = train(cfg, params, loss_fn, g)
    print(f"trained {cfg.members} members x {cfg.steps} steps, core {cfg.core} ({mode}) in {train_s:.1f}s "
          f"(first step {first_s:.1f}s{', compilation included' if compiled else ''})")
    if compare:
        step_s = compare_steps(cfg, params, loss_fn if compiled else make_loss(core, compiled=True), compare, g)
        print(f"TRAIN STEP (loss + backward, {cfg.members} members, median of {compare}, interleaved): "
              f"compiled {1e3 * step_s['compiled']:.1f} ms, eager {1e3 * step_s['eager']:.1f} ms "
              f"({step_s['eager'] / step_s['compiled']:.2f}x); compiled and eager loss and grads agree")

    # held-out one-step prediction: ensemble mean vs trivial baselines
    eval_g = torch.Generator().manual_seed(seed + 1)
    obs, act, is_init = generate(cfg.eval_batch, cfg.time, eval_g)
    with torch.no_grad():
        preds, _ = torch.vmap(partial(predict_next, core), in_dims=(0, None, None, None))(params, obs, act, is_init)
    target, starts = obs[:, 1:], is_init[:, 1:]
    results = {
        "loss": masked_mse(preds.mean(0), target, starts).item(),
        "baseline_last_obs": masked_mse(obs[:, :-1], target, starts).item(),
        "baseline_mean_obs": masked_mse(obs.mean((0, 1)).expand_as(target), target, starts).item(),
    }

    # imagination: filter a context window (one episode, no resets), then roll out open loop
    ctx_g = torch.Generator().manual_seed(seed + 2)
    total = cfg.context + cfg.horizon
    obs, act, _ = generate(cfg.eval_batch, total, ctx_g, min_len=total)  # one episode per row
    no_reset = torch.zeros(cfg.eval_batch, cfg.context + 1, dtype=torch.bool)
    no_reset[:, 0] = True
    rollout = torch.compile(torch.vmap(partial(imagine, core), in_dims=(0, 0, None, None)), fullgraph=True)
    with torch.no_grad():
        _, h = torch.vmap(partial(predict_next, core), in_dims=(0, None, None, None))(
            params, obs[:, : cfg.context + 1], act[:, : cfg.context + 1], no_reset
        )  # h: the state after seeing obs[:context] with act[:context]
        t0 = time.perf_counter()
        imagined = rollout(params, h, obs[:, cfg.context], act[:, cfg.context : total - 1])
        compile_s = time.perf_counter() - t0
    truth = obs[:, cfg.context + 1 :]
    results["imagination_mse"] = ((imagined.mean(0) - truth) ** 2).mean().item()
    results["imagination_baseline_last_obs"] = ((obs[:, cfg.context, None] - truth) ** 2).mean().item()
    results["ensemble_disagreement"] = imagined.std(0).mean().item()

    print(f"compiled imagination ({cfg.horizon} steps) in {compile_s:.1f}s")
    print(f"one-step loss (ensemble mean) {results['loss']:.4f} | baselines: last obs "
          f"{results['baseline_last_obs']:.4f}, mean obs {results['baseline_mean_obs']:.4f}")
    print(f"imagination {cfg.horizon} steps: mse {results['imagination_mse']:.4f} vs repeat-last-obs "
          f"{results['imagination_baseline_last_obs']:.4f}; ensemble disagreement (std) "
          f"{results['ensemble_disagreement']:.4f}")
    best_baseline = min(results["baseline_last_obs"], results["baseline_mean_obs"])
    print(f"RESULT loss={results['loss']:.6f} baseline={best_baseline:.6f}")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="reduced sizes (CI); also WORLD_MODEL_QUICK=1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eager", action="store_true", help="train without torch.compile")
    parser.add_argument("--core", choices=list(CORES), default="block_gru", help="the recurrent core")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the config's)")
    parser.add_argument("--compare", type=int, default=10, metavar="N",
                        help="after training, time N compiled and N eager training steps side by side (0: skip)")
    args = parser.parse_args()
    quick = args.quick or os.environ.get("WORLD_MODEL_QUICK") == "1"
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = QUICK if quick else Config()
    cfg = replace(cfg, core=args.core, **({} if args.steps is None else {"steps": args.steps}))
    main(cfg, seed=args.seed, compiled=not args.eager,
         compare=args.compare)
