"""What the suites share: inputs with resets, the fwd / fwd+bwd wrappers, our modules and TorchRL's on one set of
weights, and the row format every results JSON holds."""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
from torch import nn

from ._timing import interleaved, peak_memory

import rnn_functional as rf

SEQUENCE = {"lstm": rf.lstm_sequence, "gru": rf.gru_sequence}
STEP = {"lstm": rf.lstm_step, "gru": rf.gru_step}
TORCH_RNN = {"lstm": nn.LSTM, "gru": nn.GRU}
TORCH_CELL = {"lstm": nn.LSTMCell, "gru": nn.GRUCell}
OURS = {"lstm": rf.LSTMModule, "gru": rf.GRUModule}
STATE_KEYS = {"lstm": ("recurrent_state_h", "recurrent_state_c"), "gru": ("recurrent_state",)}
MODES = ("fwd", "fwd+bwd")
SKIP: re.Pattern | None = None  # contenders whose name matches are left out of this run (``--skip``)


def torchrl_module(cell: str):
    import torchrl.modules as tm

    return {"lstm": tm.LSTMModule, "gru": tm.GRUModule}[cell]


def is_init(shape: tuple[int, ...], p: float, gen: torch.Generator, device) -> torch.Tensor:
    """Bool ``shape`` (time last): True at t=0 (every row starts a trajectory), then with probability ``p``."""
    mask = torch.rand(shape, generator=gen) < p
    mask[..., 0] = True
    return mask.to(device)


def mode(fn: Callable[[], torch.Tensor], grad: bool) -> Callable[[], object]:
    """One call: the forward under ``no_grad`` (``fwd``), or the forward and ``y.sum().backward()`` (``fwd+bwd``)."""
    if grad:
        return lambda: fn().sum().backward()

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return fn()

    return forward


def modules(cell: str, f: int, h: int, device, backends: dict[str, dict], layers: int = 1) -> dict[str, nn.Module]:
    """``name -> module`` on one set of weights: ``torch.nn``'s RNN (``"torch.nn"``) and, per entry of ``backends``
    (``"ours ..."`` or ``"torchrl ..."`` -> constructor options), our module or TorchRL's, keys ``x`` -> ``y``."""
    ref = TORCH_RNN[cell](f, h, num_layers=layers, batch_first=True, device=device)
    out: dict[str, nn.Module] = {"torch.nn": ref}
    for name, options in backends.items():
        cls = OURS[cell] if name.startswith("ours") else torchrl_module(cell)
        m = cls(input_size=f, hidden_size=h, num_layers=layers, in_key="x", out_key="y", device=device, **options)
        (m.lstm if cell == "lstm" else m.gru).load_state_dict(ref.state_dict())
        out[name] = m
    return out


def agree(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Our output equals TorchRL's on the same weights and batch before anything is timed: fp32 to 1e-4 (other
    kernels sum in another order), 1e-3 on CUDA (cuDNN multiplies fp32 in TF32 by default), bf16 to 5e-2."""
    tol = 5e-2 if ours.dtype == torch.bfloat16 else 1e-3 if ours.is_cuda else 1e-4
    torch.testing.assert_close(ours, theirs, rtol=tol, atol=tol)


def row(case: dict, contenders: dict[str, Callable[[], object]], device, *, memory: bool = False, **timing) -> dict:
    """Time ``contenders`` side by side (``_timing.interleaved``) into one results row: ``case`` (what was run),
    ``ms`` (median per call), ``min_ms``, ``first_call_s`` (compilation included), ``errors`` (a contender that
    could not run this case) and, with ``memory``, ``peak_mib`` of one call."""
    got = interleaved({k: f for k, f in contenders.items() if SKIP is None or not SKIP.search(k)}, device, **timing)
    out = {"case": case, "ms": {}, "min_ms": {}, "first_call_s": {}, "errors": {}}
    for name, r in got.items():
        if "error" in r:
            out["errors"][name] = r["error"]
            continue
        out["ms"][name] = round(r["median_s"] * 1e3, 4)
        out["min_ms"][name] = round(r["min_s"] * 1e3, 4)
        out["first_call_s"][name] = round(r["first_call_s"], 3)
    if memory:
        out["peak_mib"] = {n: round(peak_memory(contenders[n], device) / 2**20, 2) for n in out["ms"]}
    return out
