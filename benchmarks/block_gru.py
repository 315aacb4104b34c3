"""DreamerV3's block GRU: our ``DreamerV3BlockGRU`` against TorchRL's module of the same name, on the same weights,
forward + backward of a ``[B, T]`` sequence with 5% resets, eager and compiled (``fullgraph=True``).

TorchRL's module runs its ``reference`` and ``scan`` backends; ours ``auto``. Shapes: ``small`` B=32, T=64,
F=H=P=128, 4 blocks (``--quick``: T=16); ``torchrl`` B=16, T=64, F=H=P=512, 8 blocks (TorchRL's own benchmark
shape).
"""

from __future__ import annotations

import torch

from .common import is_init, mode, row

import rnn_functional as rf

OURS = "ours auto"
BASELINES = ("torchrl reference", "torchrl scan")
SHAPES = {"small": dict(B=32, T=64, F=128, blocks=4), "torchrl": dict(B=16, T=64, F=512, blocks=8)}


def rows(args):
    import torchrl.modules as tm

    device = args.device
    shapes = {"small": {**SHAPES["small"], "T": 16}} if args.quick else SHAPES
    for name, s in shapes.items():
        torch._dynamo.reset()
        gen = torch.Generator().manual_seed(0)
        f = s["F"]
        theirs = {k: tm.DreamerV3BlockGRU(f, f, projection_size=f, num_blocks=s["blocks"], recurrent_backend=k,
                                          device=device) for k in ("reference", "scan")}
        theirs["scan"].load_state_dict(theirs["reference"].state_dict())
        ours = rf.DreamerV3BlockGRU(f, f, projection_size=f, num_blocks=s["blocks"], device=device)
        ours.load_state_dict(theirs["reference"].state_dict())
        x = torch.randn(s["B"], s["T"], f, generator=gen).to(device)
        reset = is_init((s["B"], s["T"]), 0.05, gen, device)
        compiled = {"ours auto (compiled)": torch.compile(ours, fullgraph=True),
                    "torchrl reference (compiled)": torch.compile(theirs["reference"], fullgraph=True)}
        modules = {OURS: ours, **{f"torchrl {k}": m for k, m in theirs.items()}, **compiled}
        fns = {k: (lambda m=m: m(x, None, reset)[0]) for k, m in modules.items()}
        yield row(dict(shape=name, **s, reset_prob=0.05, mode="fwd+bwd"), {k: mode(fn, True) for k, fn in fns.items()},
                  device, warmup=2, repeats=5 if args.quick else 11, max_seconds=10.0)
