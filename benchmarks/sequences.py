"""Sequences ``[B, T]`` with episode resets, recurrent mode: every backend of ours, TorchRL's modules and ``torch.nn``.

Per cell (LSTM, GRU), shape and reset probability (``is_init`` True at t=0, then with that probability), forward
under ``no_grad`` (``fwd``) and forward + ``y.sum().backward()`` (``fwd+bwd``): our ``lstm_sequence`` /
``gru_sequence`` on each backend this device has (eager), our module (``recurrent_backend="auto"``) on a ``[B, T]``
TensorDict, TorchRL's module on each backend it runs here, and ``torch.nn.LSTM``/``GRU`` ignoring the resets (the
kernel floor, not a correct answer). Our module's output is checked against TorchRL's before timing. F=64, H=128 on CPU; F=H=256 and TorchRL's grid on CUDA. ``fwd+bwd`` rows
also hold ``peak_mib`` (not with ``--quick``).
"""

from __future__ import annotations

import itertools

import torch
from tensordict import TensorDict

from .common import MODES, SEQUENCE, agree, is_init, mode, modules, row

import rnn_functional as rf

OURS = "ours module (auto)"
BASELINES = ("torchrl pad", "torchrl scan", "torchrl python", "torchrl triton")


def grid(device: torch.device, quick: bool) -> tuple[int, int, list[tuple[int, int, float]]]:
    """``(F, H, [(B, T, reset probability), ...])``."""
    if quick:
        return 64, 128, [(32, 32, 0.0), (32, 32, 0.05)]
    if device.type == "cuda":
        return 256, 256, list(itertools.product((128, 512, 2048), (16, 64, 256), (0.0, 0.01, 0.1)))
    return 64, 128, list(itertools.product((32, 128), (16, 64), (0.0, 0.01, 0.1)))


def rows(args):
    device, dtype = args.device, getattr(torch, args.dtype)
    f, h, shapes = grid(device, args.quick)
    backends = [b for b in rf.available_backends(device) if b not in ("auto", "parallel")]
    theirs = ["pad", "scan"] + (["triton"] if device.type == "cuda" else [])
    for (b, t, p), cell in itertools.product(shapes, ("lstm", "gru")):
        gen = torch.Generator().manual_seed(0)
        named = modules(cell, f, h, device, {OURS: dict(default_recurrent_mode=True),
                                              **{f"torchrl {k}": dict(recurrent_backend=k, default_recurrent_mode=True)
                                                 for k in theirs},
                                              "torchrl python": dict(python_based=True, default_recurrent_mode=True)})
        named = {k: m.to(dtype) for k, m in named.items()}
        params = rf.params_from_module(named["torch.nn"])
        reset = is_init((b, t), p, gen, device)
        check = TensorDict({"x": torch.randn(b, t, f, generator=gen).to(device, dtype),
                            "is_init": reset.unsqueeze(-1)}, [b, t], device=device)
        with torch.no_grad():
            agree(named[OURS](check.copy())["y"], named["torchrl pad"](check.copy())["y"])
        for grad, name in zip((False, True), MODES):
            x = torch.randn(b, t, f, generator=gen).to(device, dtype).requires_grad_(grad)
            td = TensorDict({"x": x, "is_init": reset.unsqueeze(-1)}, [b, t], device=device)
            fns = {f"ours {k}": (lambda k=k: SEQUENCE[cell](x, None, params, is_init=reset, backend=k)[0])
                   for k in ["auto", *backends]}
            fns.update({k: (lambda m=m: m(td.copy())["y"]) for k, m in named.items() if k != "torch.nn"})
            fns["torch.nn (no resets)"] = lambda: named["torch.nn"](x)[0]
            yield row(dict(cell=cell, B=b, T=t, F=f, H=h, reset_prob=p, mode=name, dtype=args.dtype),
                      {k: mode(fn, grad) for k, fn in fns.items()}, device, memory=grad and not args.quick,
                      warmup=1 if args.quick else 2, repeats=7 if args.quick else 15, max_seconds=5.0)
