"""Linear recurrences (minGRU, Griffin's RG-LRU) with episode resets: the ``parallel`` backend (an associative scan
over time) against the step loops (``scan``, ``reference``) and ``torch.nn.GRU`` (no resets, the nonlinear floor).

Per cell, ``[B, T]`` with 5% resets, forward (``no_grad``) and forward + backward, eager; with ``--quick`` one
shape, else also a long one and ``parallel`` compiled. F=H=128.
"""

from __future__ import annotations

import itertools

import torch

from .common import MODES, is_init, mode, row

import rnn_functional as rf

OURS = "ours parallel"
BASELINES = ("ours scan", "ours reference")
CELLS = {"min_gru": (rf.init_min_gru_params, rf.min_gru_sequence),
         "rglru": (rf.init_rglru_params, rf.rglru_sequence)}
H = 128


def rows(args):
    device = args.device
    shapes = ((16, 128),) if args.quick else ((16, 128), (16, 1024))
    for (b, t), cell in itertools.product(shapes, CELLS):
        torch._dynamo.reset()
        gen = torch.Generator().manual_seed(0)
        init, seq = CELLS[cell]
        params = init(H, H, device=device, generator=gen)
        gru = torch.nn.GRU(H, H, batch_first=True, device=device)
        reset = is_init((b, t), 0.05, gen, device)
        compiled = torch.compile(lambda x, reset: seq(x, None, params, is_init=reset, backend="parallel")[0],
                                 fullgraph=True)
        for grad, m in zip((False, True), MODES):
            params.apply_(lambda p: p.requires_grad_(grad))
            x = torch.randn(b, t, H, generator=gen).to(device).requires_grad_(grad)
            fns = {f"ours {k}": (lambda k=k: seq(x, None, params, is_init=reset, backend=k)[0])
                   for k in ("parallel", "scan", "reference")}
            if not args.quick:
                fns["ours parallel (compiled)"] = lambda: compiled(x, reset)
            fns["torch.nn.GRU (no resets)"] = lambda: gru(x)[0]
            yield row(dict(cell=cell, B=b, T=t, H=H, reset_prob=0.05, mode=m), {k: mode(f, grad) for k, f in fns.items()},
                      device, memory=grad and not args.quick, warmup=1, repeats=5 if args.quick else 11,
                      max_seconds=5.0)
