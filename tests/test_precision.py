"""Recurrent matmul precision: modes, resolution order (kwarg > global > env > torch), presets."""

from __future__ import annotations

import pytest
import torch

import rnn_functional as rf
from rnn_functional import precision

CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    """No global setting, no env var, torch's default fp32 precision, cuDNN's TF32 off (the TF32 default that follows
    it is tested in tests/backends/test_triton_precision.py); restored afterwards."""
    monkeypatch.delenv(precision.ENV_VAR, raising=False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    previous = torch.get_float32_matmul_precision()
    rf.set_recurrent_matmul_precision("auto")
    torch.set_float32_matmul_precision("highest")
    yield
    rf.set_recurrent_matmul_precision("auto")
    torch.set_float32_matmul_precision(previous)


@pytest.fixture
def tf32_gpu(monkeypatch):
    """Pretend the device is a GPU of compute capability >= 8."""
    monkeypatch.setattr(precision, "_has_tf32", lambda device: True)


@pytest.fixture
def old_gpu(monkeypatch):
    """Pretend the device is a GPU below compute capability 8."""
    monkeypatch.setattr(precision, "_has_tf32", lambda device: False)


def test_global_setting_roundtrip() -> None:
    assert rf.get_recurrent_matmul_precision() == "auto"
    rf.set_recurrent_matmul_precision("tf32x3")
    assert rf.get_recurrent_matmul_precision() == "tf32x3"
    rf.set_recurrent_matmul_precision("auto")
    assert rf.get_recurrent_matmul_precision() == "auto"


@pytest.mark.parametrize("mode", ["ieee", "tf32", "tf32x3"])
def test_concrete_modes_on_tf32_gpu(tf32_gpu, mode: str) -> None:
    assert precision.resolve_matmul_precision(mode, CUDA) == mode


@pytest.mark.parametrize("preset, on_new, on_old", [("fast", "tf32", "ieee"), ("high-prec", "tf32x3", "ieee")])
def test_presets_are_gpu_aware(monkeypatch, preset: str, on_new: str, on_old: str) -> None:
    monkeypatch.setattr(precision, "_has_tf32", lambda device: True)
    assert precision.resolve_matmul_precision(preset, CUDA) == on_new
    monkeypatch.setattr(precision, "_has_tf32", lambda device: False)
    assert precision.resolve_matmul_precision(preset, CUDA) == on_old


def test_no_tf32_on_cpu() -> None:
    """The CPU interpreter has no TF32: every mode runs as IEEE fp32."""
    for mode in ("tf32", "fast", "high-prec", "ieee"):
        assert precision.resolve_matmul_precision(mode, torch.device("cpu")) == "ieee"


def test_resolution_order(tf32_gpu, monkeypatch) -> None:
    resolve = precision.resolve_matmul_precision
    torch.set_float32_matmul_precision("medium")
    assert resolve(None, CUDA) == "tf32"  # torch "medium" -> "fast"
    monkeypatch.setenv(precision.ENV_VAR, "ieee")
    assert resolve(None, CUDA) == "ieee"  # env beats torch
    rf.set_recurrent_matmul_precision("tf32x3")
    assert resolve(None, CUDA) == "tf32x3"  # global beats env
    assert resolve("auto", CUDA) == "tf32x3"  # "auto" defers
    assert resolve("tf32", CUDA) == "tf32"  # kwarg beats everything


@pytest.mark.parametrize("torch_mode, expected", [("highest", "ieee"), ("high", "tf32x3"), ("medium", "tf32")])
def test_torch_fallback(tf32_gpu, torch_mode: str, expected: str) -> None:
    torch.set_float32_matmul_precision(torch_mode)
    assert precision.resolve_matmul_precision(None, CUDA) == expected


@pytest.mark.parametrize("value, expected", [("high", "tf32x3"), ("medium", "tf32"), ("FAST", "tf32"), ("auto", "ieee")])
def test_env_accepts_modes_and_torch_names(tf32_gpu, monkeypatch, value: str, expected: str) -> None:
    monkeypatch.setenv(precision.ENV_VAR, value)
    assert precision.resolve_matmul_precision(None, CUDA) == expected


def test_invalid_values_raise(monkeypatch) -> None:
    with pytest.raises(ValueError, match=r"set_recurrent_matmul_precision\(mode\): expected one of"):
        rf.set_recurrent_matmul_precision("tf16")
    with pytest.raises(ValueError, match="matmul_precision: expected one of"):
        precision.resolve_matmul_precision("bf16")
    monkeypatch.setenv(precision.ENV_VAR, "fastest")
    with pytest.raises(ValueError, match="environment variable RNN_FUNCTIONAL_PRECISION"):
        precision.resolve_matmul_precision(None)


def test_other_backends_ignore_it() -> None:
    """Documented: only the triton backend reads the precision; others compute at params precision."""
    params = rf.init_gru_params(3, 4, dtype=torch.float64)
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    y_default, _ = rf.gru_sequence(x, None, params, backend="reference")
    y_fast, _ = rf.gru_sequence(x, None, params, backend="reference", matmul_precision="fast")
    torch.testing.assert_close(y_fast, y_default, rtol=0, atol=0)
