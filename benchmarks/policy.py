"""The acting step of a recurrent policy, what a collector pays per environment step: one call on a fresh ``[B]``
TensorDict in sequential mode (``is_init`` True for ~5% of rows) under ``no_grad``.

Contenders, on one set of weights: our module eager and ``torch.compile(module, fullgraph=True)``; the same with
an MLP head (``TensorDictSequential``), eager and compiled; TorchRL's module and policy (eager: its module does not
compile whole); our ``lstm_step``/``gru_step`` on tensors, compiled (no TensorDict, no module; on CUDA also
forced to the ``reference`` step); and the bare ``nn.LSTMCell``/``GRUCell`` (+ head), no resets and no TensorDict
(the floor). F=64, H=128 (F=H=256 on CUDA); each sample is 20 calls, reported per call.
"""

from __future__ import annotations

import itertools

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn

from .common import STATE_KEYS, STEP, TORCH_CELL, modules, row

import rnn_functional as rf

OURS = "ours policy (compiled)"
BASELINES = ("torchrl policy",)
INNER = 20


def rows(args):
    device = args.device
    f, h = (256, 256) if device.type == "cuda" else (64, 128)
    sizes = (32,) if args.quick else ((1, 32, 256) if device.type == "cpu" else (1, 128, 2048))
    for b, cell in itertools.product(sizes, ("lstm", "gru")):
        torch._dynamo.reset()
        gen = torch.Generator().manual_seed(0)
        named = modules(cell, f, h, device, {"ours": {}, "torchrl": {}})
        head = nn.Sequential(nn.Linear(h, h), nn.Tanh(), nn.Linear(h, 8)).to(device)
        data = {"x": torch.randn(b, f, generator=gen), "is_init": torch.rand(b, 1, generator=gen) < 0.05,
                **{k: torch.randn(b, 1, h, generator=gen) for k in STATE_KEYS[cell]}}
        td = TensorDict(data, [b]).to(device)

        def policy(m):
            return TensorDictSequential(m, TensorDictModule(head, in_keys=["y"], out_keys=["logits"]))

        calls = {
            "ours module (eager)": (named["ours"], "y"),
            "ours module (compiled)": (torch.compile(named["ours"], fullgraph=True), "y"),
            "torchrl module": (named["torchrl"], "y"),
            "ours policy (eager)": (policy(named["ours"]), "logits"),
            OURS: (torch.compile(policy(named["ours"]), fullgraph=True), "logits"),
            "torchrl policy": (policy(named["torchrl"]), "logits"),
        }
        fns = {k: (lambda m=m, key=key: m(td.copy())[key]) for k, (m, key) in calls.items()}
        params = rf.params_from_module(named["torch.nn"])
        stored = tuple(td[k] for k in STATE_KEYS[cell])  # [B, L, H] each
        step = torch.compile(STEP[cell], fullgraph=True)
        fns["ours step fn (compiled, tensors)"] = lambda: step(
            td["x"], stored if cell == "lstm" else stored[0], params, is_init=td["is_init"])[0]
        if device.type == "cuda":  # auto gives a compiled CUDA step to triton (slower than eager on the 2026-12-04
            # lease); the reference step is two GEMMs and pointwise ops that Inductor fuses
            ref_step = torch.compile(lambda *a, **k: STEP[cell](*a, backend="reference", **k), fullgraph=True)
            fns["ours step fn (compiled, reference)"] = lambda: ref_step(
                td["x"], stored if cell == "lstm" else stored[0], params, is_init=td["is_init"])[0]
        state = tuple(s[:, 0] for s in stored) if cell == "lstm" else stored[0][:, 0]
        bare = TORCH_CELL[cell](f, h, device=device)
        bare.load_state_dict({k.removesuffix("_l0"): v for k, v in named["torch.nn"].state_dict().items()})
        keep = ~td["is_init"]

        def bare_step():
            out = bare(td["x"], tuple(s * keep for s in state) if cell == "lstm" else state * keep)
            return out[0] if cell == "lstm" else out

        fns["torch.nn cell"] = bare_step
        fns["torch.nn cell + head"] = lambda: head(bare_step())

        def repeat(fn):
            def run():
                with torch.no_grad():
                    for _ in range(INNER):
                        fn()
            return run

        r = row(dict(cell=cell, B=b, F=f, H=h), {k: repeat(fn) for k, fn in fns.items()}, device, warmup=2,
                repeats=10 if args.quick else 30, max_seconds=5.0)
        r["ms"] = {k: round(v / INNER, 5) for k, v in r["ms"].items()}  # per call
        r["min_ms"] = {k: round(v / INNER, 5) for k, v in r["min_ms"].items()}
        yield r
