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



@pytest.fixture
def per_backend_api():
    """Sets torch's per-backend fp32 precisions (cuBLAS matmul, cuDNN RNN); puts back what was there."""
    targets = (torch.backends.cuda.matmul, torch.backends.cudnn.rnn)
    before = [t.fp32_precision for t in targets]

    def set_to(matmul: str, rnn: str) -> None:
        for target, value in zip(targets, (matmul, rnn)):
            target.fp32_precision = value

    yield set_to
    set_to(*before)


@pytest.mark.parametrize("setting, expected", [("tf32", "tf32"), ("ieee", "ieee")])
def test_torch_per_backend_api_is_read(per_backend_api, setting: str, expected: str) -> None:
    """torch's per-backend TF32 API (``fp32_precision``) makes its legacy getters raise ("mix of the legacy and new
    APIs"): the rule reads it instead. cuBLAS's ``"tf32"`` asks for TF32; cuDNN's RNN switch at ``"ieee"`` turns the
    TF32 default off."""
    per_backend_api(setting, setting)
    assert precision.resolve_matmul_precision(None, CUDA) == expected


@pytest.mark.skipif("triton" not in rf.available_backends(torch.device("cpu")),
                    reason="triton on CPU needs TRITON_INTERPRET=1")
def test_triton_call_under_torch_per_backend_api(per_backend_api) -> None:
    """A user who sets TF32 through torch's per-backend API still gets a ``triton`` call (it raised before), equal to
    ``reference`` (IEEE in the interpreter, fp64 here)."""
    per_backend_api("tf32", "tf32")
    gen = torch.Generator().manual_seed(0)
    params = rf.init_lstm_params(3, 4, generator=gen, dtype=torch.float64)
    x = torch.randn(2, 5, 3, generator=gen, dtype=torch.float64)
    is_init = torch.zeros(2, 5, dtype=torch.bool)
    is_init[1, 2] = True
    got = rf.lstm_sequence(x, None, params, is_init=is_init, backend="triton")
    want = rf.lstm_sequence(x, None, params, is_init=is_init, backend="reference")
    torch.testing.assert_close(got[0], want[0])
