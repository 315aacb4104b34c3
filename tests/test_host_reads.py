"""Host reads of tensor data per eager call (each one is a device sync on a GPU).

A ``TorchFunctionMode`` counts every call that moves tensor data to the host: ``.cpu()``,
``.numpy()``, ``.tolist()``, ``.item()``, ``bool(t)``, ``int(t)``, ``float(t)``, ``nonzero`` and
``repeat_interleave`` without ``output_size``. Budget (``../shared/DESIGN.md``): none on
``reference``, ``scan`` and ``triton``, whatever ``is_init`` holds (they apply every reset on the
device); none for any call without ``is_init``; none for the step functions. ``pad``/``auto`` read
``is_init`` to choose and lay out their eager path when it is given.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager

import pytest
import torch
from tensordict import TensorDict
from torch.overrides import TorchFunctionMode

import rnn_functional as rf
from helpers import CELLS

_READS = {torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__,
          torch.Tensor.__int__, torch.Tensor.__index__, torch.Tensor.__float__, torch.nonzero, torch.Tensor.nonzero}
_REPEAT = (torch.repeat_interleave, torch.Tensor.repeat_interleave)


class HostReads(TorchFunctionMode):
    """Records the name of every host read of tensor data made inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _READS or (func in _REPEAT and kwargs.get("output_size") is None):
            self.seen.append(getattr(func, "__name__", str(func)))
        return func(*args, **kwargs)


def test_the_counter_sees_host_reads():
    t = torch.ones(3, dtype=torch.bool)
    with HostReads() as reads:
        bool(t.any()), t.cpu(), t.tolist(), t.nonzero(), torch.repeat_interleave(t.long())
    assert reads.seen == ["__bool__", "cpu", "tolist", "nonzero", "repeat_interleave"]


B, T, F_IN, H = 3, 6, 3, 4


def _is_init(resets: str) -> torch.Tensor | None:
    if resets == "none":
        return None
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[:, 0] = True
    if resets == "interior":
        mask[1, 2] = mask[2, 4] = True
    return mask


def _device_backends():
    triton = pytest.mark.skipif("triton" not in rf.available_backends(), reason="triton needs CUDA or TRITON_INTERPRET=1")
    return ["reference", "scan", pytest.param("triton", marks=triton)]


@pytest.mark.parametrize("resets", ["none", "first_step", "interior"])
@pytest.mark.parametrize("backend", _device_backends())
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_device_backends_read_nothing(cell, backend, resets):
    init, _, sequence = CELLS[cell]
    params = init(F_IN, H)
    x = torch.randn(B, T, F_IN)
    with HostReads() as reads:
        sequence(x, None, params, is_init=_is_init(resets), backend=backend, return_segment_states=True)
    assert reads.seen == []


@pytest.mark.parametrize("backend", ["pad", "auto"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_no_is_init_reads_nothing(cell, backend):
    init, _, sequence = CELLS[cell]
    with HostReads() as reads:
        sequence(torch.randn(B, T, F_IN), None, init(F_IN, H), backend=backend)
    assert reads.seen == []


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_steps_read_nothing(cell):
    init, step, _ = CELLS[cell]
    with HostReads() as reads:
        step(torch.randn(B, F_IN), None, init(F_IN, H), is_init=torch.tensor([True, False, True]))
    assert reads.seen == []


def _module_td(cell: str, shape: tuple) -> TensorDict:
    keys = ["recurrent_state_h", "recurrent_state_c"] if cell == "lstm" else ["recurrent_state"]
    is_init = _is_init("interior") if len(shape) == 2 else torch.tensor([True, False, True])
    data = {"x": torch.randn(*shape, F_IN), "is_init": is_init.reshape(*shape, 1)}
    data.update({k: torch.zeros(*shape, 1, H) for k in keys})
    return TensorDict(data, batch_size=shape)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_modules_read_nothing_on_device_backends_and_in_step_mode(cell):
    cls = rf.LSTMModule if cell == "lstm" else rf.GRUModule
    recurrent = cls(F_IN, H, in_key="x", out_key="y", recurrent_backend="scan", default_recurrent_mode=True)
    sequential = cls(F_IN, H, in_key="x", out_key="y")
    with HostReads() as reads:
        recurrent(_module_td(cell, (B, T)))
        sequential(_module_td(cell, (B,)))
    assert reads.seen == []


@pytest.mark.parametrize("resets", ["first_step", "interior"])
@pytest.mark.parametrize("backend", ["pad", "auto"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("grad", [False, True])
def test_pad_and_auto_read_is_init_once(cell, backend, resets, grad):
    """pad/auto read is_init on the host once to choose and lay out their route, whatever that route is (the
    cost table picks among slices, buckets, packed and the loops); the module too."""
    init, _, sequence = CELLS[cell]
    params = init(F_IN, H)
    x = torch.randn(B, T, F_IN, requires_grad=grad)
    with torch.set_grad_enabled(grad), HostReads() as reads:
        sequence(x, None, params, is_init=_is_init(resets), backend=backend, return_segment_states=True)
    assert reads.seen == ["numpy"]
    cls = rf.LSTMModule if cell == "lstm" else rf.GRUModule
    module = cls(F_IN, H, in_key="x", out_key="y", recurrent_backend=backend, default_recurrent_mode=True)
    with torch.set_grad_enabled(grad), HostReads() as reads:
        module(_module_td(cell, (B, T)))
    assert reads.seen == ["numpy"]


@pytest.mark.parametrize("layout", ["packed", "buckets", "slices"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_every_pad_layout_reads_is_init_once(cell, layout):
    init, _, sequence = CELLS[cell]
    is_init = torch.zeros(B, T, dtype=torch.bool)
    is_init[:, ::2] = True  # whole slices of 2, so that every layout serves the call
    with HostReads() as reads:
        sequence(torch.randn(B, T, F_IN), None, init(F_IN, H), is_init=is_init, backend="pad", segment_layout=layout,
                 return_segment_states=True)
    assert reads.seen == ["numpy"]


@pytest.mark.parametrize("hint", [{"slice_len": 2}, {"slice_len": 3, "num_slices": 9}])
@pytest.mark.parametrize("backend", ["pad", "auto", "reference", "scan"])
def test_a_slice_hint_is_checked_on_the_one_read(backend, hint):
    """A hinted call (``slice_len``/``num_slices``) checks the hint on the host: on the one read that ``pad``/``auto``
    make for their plan, and on one read where the backend needs none (no hint check may go unchecked: whole
    slices run side by side, so a wrong hint would mix trajectories)."""
    init, _, sequence = CELLS["lstm"]
    is_init = torch.zeros(B, T, dtype=torch.bool)
    is_init[:, ::2] = True  # whole slices of 2: a valid hint of both kinds
    with HostReads() as reads:
        sequence(torch.randn(B, T, F_IN), None, init(F_IN, H), is_init=is_init, backend=backend,
                 return_segment_states=True, **hint)
    assert reads.seen == ["numpy"]


# ------------------------------------------------------------- on a GPU: CUDA's own count of synchronisations

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@contextmanager
def _sync_debug(mode: str):
    """CUDA's sync debug mode (``"warn"`` or ``"error"``) inside the block: it sees every device-to-host
    synchronisation, whichever method made it."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def _cuda_call(cell: str, backend: str, grad: bool):
    init, step, sequence = CELLS[cell]
    params = init(F_IN, H, device="cuda")
    x = torch.randn(B, T, F_IN, device="cuda", requires_grad=grad)
    is_init = _is_init("interior").cuda()

    def call() -> None:
        with torch.set_grad_enabled(grad):
            y, _ = sequence(x, None, params, is_init=is_init, backend=backend)
            if grad:
                y.sum().backward()
            step(x[:, 0].detach(), None, params, is_init=is_init[:, 0])

    call()  # the first call loads (or compiles) the kernels, which may synchronise
    return call


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("backend", ["triton", "reference", "scan"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_cuda_device_backends_never_synchronise(cell, backend, grad):
    """On CUDA, with interior resets, the device backends (and the step function) never wait for the GPU, forward or
    backward."""
    call = _cuda_call(cell, backend, grad)
    with _sync_debug("error"):
        call()


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("backend", ["pad", "auto"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_cuda_pad_synchronises_once(cell, backend, grad):
    """``pad`` (cuDNN), and ``auto``, which runs it in plain eager mode on CUDA, read ``is_init`` once to lay out
    their segments: one synchronisation per call (the step function, ATen's cell, none)."""
    call = _cuda_call(cell, backend, grad)
    with warnings.catch_warnings(record=True) as seen, _sync_debug("warn"):
        warnings.simplefilter("always")
        call()
    syncs = [str(w.message) for w in seen if "synchroniz" in str(w.message)]
    assert len(syncs) == 1, syncs
