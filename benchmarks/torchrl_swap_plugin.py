"""A pytest plugin that runs a TorchRL test module twice: with TorchRL's recurrent modules, then ours.

Loaded with ``-p benchmarks.torchrl_swap_plugin`` by the ``torchrl`` suite (``torchrl_benchmark.py``).
Every test gets a ``rnn_library`` parameter, ``"torchrl"`` or ``"ours"``: for ``"ours"`` the test
module's ``LSTMModule`` / ``GRUModule`` names (imported from ``torchrl.modules`` at its top) are
rebound to :mod:`rnn_functional`'s for that test, so both libraries run the same code in one process.

TorchRL's ``scan`` backend turns on ``torch._dynamo.config.capture_scalar_outputs`` globally when a
module is built (hoptorch's ``ensure_scan_backward``), which would also let Inductor lower *our*
``scan`` under a default ``torch.compile``: ours runs with the flag patched to False, as a
process that never built a TorchRL ``scan`` module has it.
"""

from __future__ import annotations

import pytest
import torch

import rnn_functional


@pytest.fixture(autouse=True, params=["torchrl", "ours"])
def rnn_library(request, monkeypatch):
    if request.param == "ours":
        for name in ("LSTMModule", "GRUModule"):
            if hasattr(request.module, name):
                monkeypatch.setattr(request.module, name, getattr(rnn_functional, name))
        with torch._dynamo.config.patch(capture_scalar_outputs=False):
            yield request.param
    else:
        yield request.param
