"""Flat ``[N]`` batches of concatenated slices, as TorchRL's ``SliceSampler`` returns them: our module against
TorchRL's ``LSTMModule``/``GRUModule``, recurrent mode, forward (``no_grad``) and forward + backward.

Cases: a batch drawn by a real ``SliceSampler`` from a replay buffer of 40 episodes of 10 to 300 steps
(``is_init`` True at each episode start and where a slice starts inside one), and synthetic flat batches of full
slices (``=L``) or truncated ones (lengths uniform in ``[1, L]``, ``<=L``). Contenders: our module (``auto``), our
function with each ``segment_layout`` forced on ``pad`` (``rows`` is the one long row), TorchRL's module on each
fused backend (``pad``; ``triton`` on CUDA; its ``scan``, 10x+ slower than its ``pad`` in the sequences suite, is
left out) and ``python_based=True``, and ``torch.nn`` on the whole row with no resets (the kernel floor, not a correct
answer). F=64, H=128, one layer. Our module's output is checked against TorchRL's before timing. ``case.route`` is what ``rnn_functional.sequence_route`` says ``auto`` runs.
"""

from __future__ import annotations

import itertools

import torch
from tensordict import TensorDict

from .common import MODES, SEQUENCE, agree, mode, modules, row

import rnn_functional as rf

OURS = "ours module (auto)"
BASELINES = ("torchrl pad", "torchrl python", "torchrl triton")
F, H = 64, 128


def sampled(n: int, slice_len: int, seed: int = 0) -> torch.Tensor:
    """``is_init [n']`` of one batch a ``SliceSampler`` draws (``strict_length=False`` may return ``n' < n``)."""
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import SliceSampler

    g = torch.Generator().manual_seed(seed)
    eps = torch.randint(10, 301, (40,), generator=g)
    total = int(eps.sum())
    starts = torch.zeros(total, dtype=torch.bool)
    starts[eps.cumsum(0) - eps] = True
    done = torch.zeros(total, 1, dtype=torch.bool)
    done[eps.cumsum(0) - 1] = True
    data = TensorDict({"is_init": starts, "step": torch.arange(total), ("next", "done"): done,
                       ("collector", "traj_ids"): torch.repeat_interleave(torch.arange(40), eps)}, [total])
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(total), batch_size=n,
                                sampler=SliceSampler(slice_len=slice_len, strict_length=False))
    rb.extend(data)
    torch.manual_seed(seed)
    batch = rb.sample()
    first = batch["is_init"].clone()
    first[0] = True
    first[1:] |= batch["step"][1:] != batch["step"][:-1] + 1
    return first


def synthetic(n: int, slice_len: int, truncated: bool, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    lengths: list[int] = []
    while sum(lengths) < n:
        step = int(torch.randint(1, slice_len + 1, (), generator=g)) if truncated else slice_len
        lengths.append(min(step, n - sum(lengths)))
    mask = torch.zeros(n, dtype=torch.bool)
    mask[torch.tensor([0] + lengths[:-1]).cumsum(0)] = True
    return mask


def cases(quick: bool) -> list[tuple[str, torch.Tensor]]:
    out = [(f"SliceSampler N=1024 slice_len={s}", sampled(1024, s)) for s in ((64,) if quick else (20, 64))]
    sizes = ((200, 8, False), (1024, 20, True)) if quick else itertools.product((200, 1024, 4096), (8, 20, 64),
                                                                                  (False, True))
    out += [(f"flat N={n} slices {'<=' if tr else '='}{s}", synthetic(n, s, tr)) for n, s, tr in sizes]
    return out


def rows(args):
    device = args.device
    theirs = ["pad"] + (["triton"] if device.type == "cuda" else [])
    for (name, reset), cell in itertools.product(cases(args.quick), ("lstm", "gru")):
        named = modules(cell, F, H, device, {OURS: dict(default_recurrent_mode=True),
                                              **{f"torchrl {k}": dict(recurrent_backend=k, default_recurrent_mode=True)
                                                 for k in theirs},
                                              "torchrl python": dict(python_based=True, default_recurrent_mode=True)})
        params = rf.params_from_module(named["torch.nn"])
        reset = reset.to(device)
        n = reset.shape[0]
        gen = torch.Generator().manual_seed(1)
        for grad, m in zip((False, True), MODES):
            route = str(rf.sequence_route(cell, torch.zeros(n, F, device=device), params, is_init=reset,
                                          records_grad=grad))
            x = torch.randn(n, F, generator=gen).to(device).requires_grad_(grad)
            td = TensorDict({"x": x, "is_init": reset.unsqueeze(-1)}, [n], device=device)
            if not grad:
                with torch.no_grad():
                    agree(named[OURS](td.copy())["y"], named["torchrl pad"](td.copy())["y"])
            fns = {k: (lambda mod=mod: mod(td.copy())["y"]) for k, mod in named.items() if k != "torch.nn"}
            for layout in ("buckets", "packed"):
                fns[f"ours pad/{layout}"] = lambda layout=layout: SEQUENCE[cell](
                    x, None, params, is_init=reset, backend="pad", segment_layout=layout)[0]
            fns["torch.nn (no resets)"] = lambda: named["torch.nn"](x.unsqueeze(0))[0]
            yield row(dict(cell=cell, batch=name, mode=m, route=route), {k: mode(fn, grad) for k, fn in fns.items()},
                      device, warmup=1, repeats=5 if args.quick else 11, max_seconds=5.0)
