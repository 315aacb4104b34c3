"""Training an ensemble of E recurrent models (critics, world models): ``torch.vmap`` over stacked params against a
loop over the members, forward + backward into every member's weights.

The input is shared by the members, 5% resets. Contenders: our ``lstm_sequence``/``gru_sequence`` vmapped over
``stack_params`` (eager, and compiled with ``fullgraph=True``), the same called once per member (eager), TorchRL's
modules in a loop (``pad``), and ``torch.nn`` RNNs in a loop with no resets (the floor). F=H=64 on CPU (128 on CUDA),
B=16, T=32.
"""

from __future__ import annotations

import itertools

import torch
from tensordict import TensorDict

from .common import SEQUENCE, is_init, mode, modules, row

import rnn_functional as rf

OURS = "ours vmap (eager)"
BASELINES = ("torchrl loop",)
B, T = 16, 32


def rows(args):
    device = args.device
    h = 128 if device.type == "cuda" else 64
    sizes = (4,) if args.quick else (1, 4, 8, 16)
    for e, cell in itertools.product(sizes, ("lstm", "gru")):
        torch._dynamo.reset()
        gen = torch.Generator().manual_seed(0)
        members = [modules(cell, h, h, device, {"torchrl": dict(recurrent_backend="pad", default_recurrent_mode=True)})
                   for _ in range(e)]
        stacked = rf.stack_params([rf.params_from_module(m["torch.nn"]) for m in members]).detach()
        stacked.apply_(lambda p: p.requires_grad_(True))
        singles = [rf.params_from_module(m["torch.nn"]) for m in members]
        x = torch.randn(B, T, h, generator=gen).to(device)
        reset = is_init((B, T), 0.05, gen, device)
        td = TensorDict({"x": x, "is_init": reset.unsqueeze(-1)}, [B, T], device=device)

        def one(params):
            return SEQUENCE[cell](x, None, params, is_init=reset)[0]

        vmapped = torch.vmap(one)
        compiled = torch.compile(vmapped, fullgraph=True)
        fns = {OURS: lambda: vmapped(stacked), "ours vmap (compiled)": lambda: compiled(stacked),
               "ours loop (eager)": lambda: torch.stack([one(p) for p in singles]),
               "torchrl loop": lambda: torch.stack([m["torchrl"](td.copy())["y"] for m in members]),
               "torch.nn loop (no resets)": lambda: torch.stack([m["torch.nn"](x)[0] for m in members])}
        yield row(dict(cell=cell, E=e, B=B, T=T, H=h, mode="fwd+bwd"), {k: mode(fn, True) for k, fn in fns.items()},
                  device, warmup=2, repeats=5 if args.quick else 11, max_seconds=10.0, settle=device.type == "cpu")
