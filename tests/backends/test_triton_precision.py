"""The default recurrent matmul precision is cuDNN's: TF32 while ``torch.backends.cudnn.allow_tf32``, IEEE on demand."""

from __future__ import annotations

import pytest
import torch

import rnn_functional as rf
from rnn_functional import precision

CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    """No setting from any source, torch's defaults, a GPU of compute capability >= 8 (pretended)."""
    monkeypatch.delenv(precision.ENV_VAR, raising=False)
    monkeypatch.setattr(precision, "_has_tf32", lambda device: device is not None and device.type == "cuda")
    previous = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    rf.set_recurrent_matmul_precision("auto")
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = True
    yield
    rf.set_recurrent_matmul_precision("auto")
    torch.set_float32_matmul_precision(previous[0])
    torch.backends.cudnn.allow_tf32 = previous[1]


def test_default_is_tf32_as_cudnn() -> None:
    assert torch.backends.cudnn.allow_tf32  # torch's own default, which cuDNN's RNN kernels follow
    assert precision.resolve_matmul_precision(None, CUDA) == "tf32"
    assert precision.resolve_matmul_precision("auto", CUDA) == "tf32"


def test_cudnn_switch_off_gives_ieee() -> None:
    torch.backends.cudnn.allow_tf32 = False
    assert precision.resolve_matmul_precision(None, CUDA) == "ieee"


@pytest.mark.parametrize("how", ["kwarg", "global", "env"])
def test_ieee_stays_available(monkeypatch, how: str) -> None:
    if how == "global":
        rf.set_recurrent_matmul_precision("ieee")
    if how == "env":
        monkeypatch.setenv(precision.ENV_VAR, "highest")
    assert precision.resolve_matmul_precision("ieee" if how == "kwarg" else None, CUDA) == "ieee"


@pytest.mark.parametrize("torch_mode, expected", [("high", "tf32x3"), ("medium", "tf32")])
def test_torch_setting_still_read_when_changed(torch_mode: str, expected: str) -> None:
    torch.backends.cudnn.allow_tf32 = False  # an explicit torch setting wins over cuDNN's flag
    torch.set_float32_matmul_precision(torch_mode)
    assert precision.resolve_matmul_precision(None, CUDA) == expected


def test_cpu_and_interpreter_stay_ieee() -> None:
    assert precision.resolve_matmul_precision(None, torch.device("cpu")) == "ieee"
