"""Compile time and compiled speed of a training call: ``torch.compile`` of one sequence forward + backward.

Per cell, on a ``[B, T]`` batch with 5% resets: our ``lstm_sequence``/``gru_sequence`` (``backend="auto"``, which
is ``scan`` under compile) compiled with ``fullgraph=True``, TorchRL's module compiled with a default
``torch.compile`` (on ``pad``; it does not compile whole), both eager, and ``torch.nn``'s RNN with no resets, eager
and compiled. ``first_call_s`` is the first call (compilation included, a fresh Dynamo cache per row); ``ms`` the
steady compiled call. B=32, F=64, H=128.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from .common import SEQUENCE, is_init, mode, modules, row

import rnn_functional as rf

OURS = "ours compiled (auto)"
BASELINES = ("torchrl compiled (pad)", "torchrl eager (pad)")
F, H, B = 64, 128, 32


def rows(args):
    device = args.device
    for cell in ("gru",) if args.quick else ("lstm", "gru"):
        for t in (16,) if args.quick else (16, 64):
            torch._dynamo.reset()
            gen = torch.Generator().manual_seed(0)
            named = modules(cell, F, H, device, {"ours": dict(default_recurrent_mode=True),
                                                 "torchrl": dict(recurrent_backend="pad", default_recurrent_mode=True)})
            params = rf.params_from_module(named["torch.nn"])
            x = torch.randn(B, t, F, generator=gen).to(device).requires_grad_(True)
            reset = is_init((B, t), 0.05, gen, device)
            td = TensorDict({"x": x, "is_init": reset.unsqueeze(-1)}, [B, t], device=device)

            def seq(x, reset):
                return SEQUENCE[cell](x, None, params, is_init=reset)[0]

            compiled = torch.compile(seq, fullgraph=True)
            theirs = torch.compile(named["torchrl"])
            fns = {OURS: lambda: compiled(x, reset), "ours eager (auto)": lambda: seq(x, reset),
                   "ours module (compiled)": (lambda m=torch.compile(named["ours"], fullgraph=True): m(td.copy())["y"]),
                   "torchrl compiled (pad)": lambda: theirs(td.copy())["y"],
                   "torchrl eager (pad)": lambda: named["torchrl"](td.copy())["y"],
                   "torch.nn compiled (no resets)": (lambda m=torch.compile(named["torch.nn"]): m(x)[0]),
                   "torch.nn (no resets)": lambda: named["torch.nn"](x)[0]}
            yield row(dict(cell=cell, B=B, T=t, F=F, H=H, reset_prob=0.05, mode="fwd+bwd"),
                      {k: mode(fn, True) for k, fn in fns.items()}, device, warmup=2,
                      repeats=5 if args.quick else 11, max_seconds=10.0)
