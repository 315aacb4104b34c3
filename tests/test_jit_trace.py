"""``torch.jit.trace`` (and the TorchScript ONNX exporter, which traces): a traced call captures a graph, so nothing may
steer by the data of the example inputs.

An eager ``auto``/``pad`` sequence call reads ``is_init`` on the host to lay out its segments; traced, that read froze
the example's resets into the graph (no ``is_init`` input at all), and the traced function silently returned the
example's segmentation for any other reset pattern. Traced calls now apply resets on the device, as compiled ones do.
``torch.jit.trace`` of an ``nn.Module`` holding ours fails, as one holding TorchRL's does, on the deprecated
``temporal_mode`` property that TorchRL's module raises from (jit probes every attribute): a policy is traced here as
a function.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from tensordict import TensorDict
from torch import nn

import rnn_functional as rf

B, T, F_IN, H = 4, 6, 5, 8


def _patterns() -> dict[str, torch.Tensor]:
    first = torch.zeros(B, T, dtype=torch.bool)
    first[:, 0] = True
    interior = first.clone()
    interior[1, 3] = interior[2, 2] = interior[3, 5] = True
    return {"resets at t=0": first, "none": torch.zeros(B, T, dtype=torch.bool), "interior": interior,
            "every step": torch.ones(B, T, dtype=torch.bool)}


def _trace(module, example: tuple):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # shape checks of the entry: the trace is per shape
        return torch.jit.trace(module, example, check_trace=False)


class _Sequence(nn.Module):
    def __init__(self, cell: str, backend: str) -> None:
        super().__init__()
        init = getattr(rf, f"init_{cell}_params")
        self.params = nn.ParameterDict({k: nn.Parameter(v) for k, v in init(F_IN, H, 2, dtype=torch.float64).items()})
        self.sequence, self.backend, self.parts = getattr(rf, f"{cell}_sequence"), backend, 2 if cell == "lstm" else 1

    def forward(self, x, is_init, *state):
        y, final = self.sequence(x, state if self.parts == 2 else state[0], dict(self.params), is_init=is_init,
                                 backend=self.backend)
        return (y, *final) if self.parts == 2 else (y, final)


@pytest.mark.parametrize("backend", ["auto", "pad", "reference"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_traced_sequence_follows_every_reset_pattern(cell: str, backend: str) -> None:
    module = _Sequence(cell, backend)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, F_IN, dtype=torch.float64, generator=g)
    state = tuple(torch.randn(B, 2, H, dtype=torch.float64, generator=g) for _ in range(module.parts))
    patterns = _patterns()
    traced = _trace(module, (x, patterns["resets at t=0"], *state))
    with torch.no_grad():
        for name, is_init in patterns.items():
            for got, want in zip(traced(x, is_init, *state), module(x, is_init, *state), strict=True):
                torch.testing.assert_close(got, want, msg=lambda m, name=name: f"is_init {name}: {m}")


class _Policy(nn.Module):
    """Tensors in, tensors out around our module, as a deployed policy (TorchRL's export tutorial's layout)."""

    def __init__(self, cls, recurrent: bool) -> None:
        super().__init__()
        self.rnn = cls(F_IN, H, in_key="x", out_key="y", default_recurrent_mode=recurrent).double()
        self.keys = [k for k in self.rnn.in_keys[1:] if k != "is_init"]

    def forward(self, x, is_init, *hidden):
        td = TensorDict({"x": x, "is_init": is_init, **dict(zip(self.keys, hidden))}, batch_size=x.shape[:-1])
        out = self.rnn(td)
        return (out["y"], *(out["next", k] for k in self.keys))


@pytest.mark.parametrize("recurrent", [False, True], ids=["step", "recurrent"])
@pytest.mark.parametrize("cls", [rf.LSTMModule, rf.GRUModule], ids=["lstm", "gru"])
def test_traced_module_policy_equals_eager(cls, recurrent: bool) -> None:
    policy = _Policy(cls, recurrent).requires_grad_(False)  # traced as a function: its weights become constants
    g = torch.Generator().manual_seed(1)
    lead = (B, T) if recurrent else (B,)
    x = torch.randn(*lead, F_IN, dtype=torch.float64, generator=g)
    hidden = tuple(torch.randn(*lead, 1, H, dtype=torch.float64, generator=g) for _ in policy.keys)
    patterns = {k: v[..., None] if recurrent else v[:, :1] for k, v in _patterns().items()}
    traced = _trace(lambda *args: policy(*args), (x, patterns["resets at t=0"], *hidden))
    with torch.no_grad():
        for name, is_init in patterns.items():
            for got, want in zip(traced(x, is_init, *hidden), policy(x, is_init, *hidden), strict=True):
                torch.testing.assert_close(got, want, msg=lambda m, name=name: f"is_init {name}: {m}")
