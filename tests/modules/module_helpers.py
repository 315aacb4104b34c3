"""Builders and independent oracles for the module tests.

The oracle runs ``torch.nn.LSTM``/``GRU`` (ATen kernels) segment by segment: one call per
trajectory piece, starting from the stored hidden at the piece's first step, which is the
meaning of recurrent mode. It shares nothing with the functional core.
"""

from __future__ import annotations

import os
from datetime import timedelta

import math

import torch
from tensordict import TensorDict
from torch import nn

import rnn_functional as rf

HIDDEN_KEYS = {"lstm": ["h", "c"], "gru": ["h"]}


def make_module(cell: str, *, input_size=4, hidden=5, layers=1, proj=0, dtype=torch.float64, seed=0, **kwargs):
    """Our module with keys ``x`` -> ``y`` and hidden keys ``h`` (, ``c``), in ``dtype``."""
    torch.manual_seed(seed)
    hk = HIDDEN_KEYS[cell]
    keys = dict(in_keys=["x", *hk], out_keys=["y", *[("next", k) for k in hk]])
    if cell == "lstm":
        m = rf.LSTMModule(input_size, hidden, layers, proj_size=proj, **keys, **kwargs)
    else:
        m = rf.GRUModule(input_size, hidden, layers, **keys, **kwargs)
    return m.to(dtype)


def state_widths(cell: str, hidden: int, proj: int) -> list[int]:
    return [proj or hidden, hidden] if cell == "lstm" else [hidden]


def make_td(
    cell: str,
    batch_shape: tuple[int, ...],
    *,
    input_size=4,
    hidden=5,
    layers=1,
    proj=0,
    reset_prob=0.3,
    stored="random",
    dtype=torch.float64,
    seed=0,
) -> TensorDict:
    """Random TensorDict of batch ``batch_shape`` (time last in recurrent mode).

    ``stored``: ``"random"`` hidden at every step, or ``"zeros"``.
    """
    g = torch.Generator().manual_seed(seed)
    data = {
        "x": torch.randn(*batch_shape, input_size, generator=g, dtype=dtype),
        "is_init": torch.rand(*batch_shape, 1, generator=g) < reset_prob,
    }
    for k, w in zip(HIDDEN_KEYS[cell], state_widths(cell, hidden, proj)):
        shape = (*batch_shape, layers, w)
        data[k] = torch.randn(*shape, generator=g, dtype=dtype) if stored == "random" else torch.zeros(shape, dtype=dtype)
    return TensorDict(data, batch_size=batch_shape)


def nn_recurrent(rnn: nn.RNNBase, x, is_init, states):
    """Oracle of recurrent mode with ``torch.nn``: ``x [*B, T, F]``, ``is_init [*B, T]``,
    stored states ``[*B, T, L, S]`` -> ``(y [*B, T, P], out states [*B, T, L, S])`` where
    the out states hold each segment's final carry at its last step, zeros elsewhere."""
    lead = x.shape[:-2]
    n, t_len = math.prod(lead), x.shape[-2]
    xf = x.reshape(n, t_len, -1)
    init = is_init.reshape(n, t_len)
    sf = [s.reshape(n, t_len, *s.shape[-2:]) for s in states]
    ys, outs = [], [[] for _ in sf]
    for i in range(n):
        starts = [0] + [t for t in range(1, t_len) if bool(init[i, t])]
        ends = starts[1:] + [t_len]
        row_y, row_out = [], [[] for _ in sf]
        for a, b in zip(starts, ends):
            h0 = tuple(s[i, a].unsqueeze(1) for s in sf)  # [L, 1, S]
            y, hn = rnn(xf[i : i + 1, a:b], h0 if len(h0) == 2 else h0[0])
            hn = hn if isinstance(hn, tuple) else (hn,)
            row_y.append(y[0])
            for k, h in enumerate(hn):
                final = h[:, 0].unsqueeze(0)  # [1, L, S]
                row_out[k].append(torch.cat([torch.zeros_like(final).expand(b - a - 1, -1, -1), final]))
        ys.append(torch.cat(row_y))
        for k in range(len(sf)):
            outs[k].append(torch.cat(row_out[k]))
    y = torch.stack(ys).reshape(*lead, t_len, -1)
    return y, [torch.stack(o).reshape(*lead, t_len, *o[0].shape[-2:]) for o in outs]


def nn_step(rnn: nn.RNNBase, x, is_init, states):
    """Oracle of sequential mode: ``x [*B, F]``, states ``[*B, L, S]`` zeroed where ``is_init``."""
    lead = x.shape[:-1]
    n = math.prod(lead)
    mask = is_init.reshape(n, 1, 1)
    h0 = tuple(torch.where(mask, 0.0, s.reshape(n, *s.shape[-2:])).transpose(0, 1) for s in states)
    y, hn = rnn(x.reshape(n, 1, -1), h0 if len(h0) == 2 else h0[0])
    hn = hn if isinstance(hn, tuple) else (hn,)
    return y.reshape(*lead, -1), [h.transpose(0, 1).reshape(*lead, h.shape[0], h.shape[2]) for h in hn]  # h: [L, n, S]


def weighted_sum(tensors, seed=123):
    """A scalar loss touching every output with random weights."""
    g = torch.Generator().manual_seed(seed)
    return sum((t * torch.randn(t.shape, generator=g, dtype=t.dtype)).sum() for t in tensors)


def cartpole_env():
    """A bare gymnasium CartPole-v1 env (collectors add InitTracker and our primers)."""
    from torchrl.envs import GymEnv

    return GymEnv("CartPole-v1")


def ddp_policy_and_data():
    """A tiny fp64 recurrent policy (our LSTM + linear head) and a [4, 6] batch with resets."""
    from tensordict.nn import TensorDictModule, TensorDictSequential

    torch.manual_seed(0)
    lstm = make_module("lstm", layers=2)
    policy = TensorDictSequential(lstm, TensorDictModule(nn.Linear(5, 2).double(), in_keys=["y"], out_keys=["logits"]))
    data = make_td("lstm", (4, 6), layers=2, seed=12)
    return policy, data


def ddp_loss(policy, data):
    """Mean squared logits in recurrent mode (a per-row mean, so shards average to the whole)."""
    with rf.set_recurrent_mode(True):
        return policy(data.clone())["logits"].pow(2).mean()


def ddp_worker(rank: int, world: int, init_file: str, out_path: str) -> None:
    """One DDP rank on gloo: its half of the batch, backward, rank 0 saves the gradients."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    policy, data = ddp_policy_and_data()
    model = DistributedDataParallel(policy)
    shard = data[rank * 4 // world : (rank + 1) * 4 // world]
    ddp_loss(model, shard).backward()
    if rank == 0:
        torch.save({n: p.grad for n, p in policy.named_parameters()}, out_path)
    dist.barrier()
    # Exit without running destructors: tearing down the DDP reducer's gloo process group from
    # Python can deadlock on torch 2.13 (its worker thread waits for the GIL the destructor holds).
    os._exit(0)


def torch_rnn(module) -> nn.RNNBase:
    """A ``torch.nn.LSTM``/``GRU`` that uses our module's parameter objects (shared)."""
    w = module.lstm if isinstance(module, rf.LSTMModule) else module.gru
    first = next(w.parameters())
    kwargs = dict(num_layers=w.num_layers, bias=w.bias, dropout=w.dropout, batch_first=True,
                  dtype=first.dtype, device=first.device)
    if w.mode == "LSTM":
        rnn = nn.LSTM(w.input_size, w.hidden_size, proj_size=w.proj_size, **kwargs)
    else:
        rnn = nn.GRU(w.input_size, w.hidden_size, **kwargs)
    for name, p in w.named_parameters():
        setattr(rnn, name, p)
    rnn.train(module.training)
    return rnn
