"""The persistent ``triton`` kernels (all SMs, weights on chip, one flag per step) against ``reference``.

The interpreter cannot spin between programs, so it runs the same step body one step per launch (the backward one
phase per launch) without the flag; ``kernel_variant("persistent")`` forces these kernels (``auto`` picks them on
CUDA only). Off a GPU the grid is planned for 8 SMs, so the shapes below exercise every part of the plan: hidden
slices that exchange the carry through global memory (H=32 fp64, N=70: 2 slices of 16 units x 2 row groups; H=256
fp32: 8 slices of 32 on one row-group program that loops over both groups), and a partly masked last group.

Tolerances: fp64 at ``assert_close``'s defaults (the kernels accumulate in fp64); fp32 at rtol=1e-4, atol=1e-5 as
the other backends (IEEE products in another summation order, a few ulps per step over T steps).
"""

from __future__ import annotations

import pytest
import torch
from helpers import make_problem, outputs_and_grads

from rnn_functional.backends import triton as tb
from rnn_functional.backends.triton.kernels import persistent_plan

pytestmark = pytest.mark.skipif(
    not tb.is_available("cpu"), reason="triton on CPU needs TRITON_INTERPRET=1 (set before import)"
)


def _check(problem: dict, **tol) -> None:
    with tb.kernel_variant("persistent"):
        out, grads = outputs_and_grads(problem, "triton")
    ref_out, ref_grads = outputs_and_grads(problem, "reference")
    for i, (a, e) in enumerate(zip(out + grads, ref_out + ref_grads)):
        torch.testing.assert_close(a, e, msg=lambda m, i=i: f"tensor #{i}: {m}", **tol)


# The LSTM under all four reset settings; the GRU (the same kernels with IS_LSTM off, the same reset helpers on its h
# carry) with reset_state and every step (the interpreter's cost grows with N x H, which the plan needs here)
PERSISTENT_CASES = [*(("lstm", r) for r in ("reset_state", "zeros", "every_step", "none")), ("gru", "reset_state"),
                    ("gru", "every_step")]


@pytest.mark.parametrize(("cell", "resets"), PERSISTENT_CASES)
def test_matches_reference_fp64(cell: str, resets: str) -> None:
    """H=32, N=70, T=4: 2 slices x 2 row groups (the second one 6 rows); resets at t=0, interior, every step."""
    problem = make_problem(cell, batch_shape=(70,), time=4, input_size=5, hidden=32,
                           reset_prob={"none": 0.0, "every_step": 1.0}.get(resets, 0.3),
                           with_reset_state=resets != "zeros", seed=3)
    if problem["is_init"] is not None and resets != "every_step":
        problem["is_init"][:, 0] = torch.arange(70) % 2 == 0  # resets at t=0 in half the rows, interior elsewhere
    _check(problem)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_matches_reference_fp32_wide(cell: str) -> None:
    """H=256 fp32: the weights need 8 slices, each exchanges its carry with 7 others every step, and one program
    per slice runs both row groups."""
    problem = make_problem(cell, batch_shape=(70,), time=2, input_size=6, hidden=256, dtype=torch.float32, seed=1)
    _check(problem, rtol=1e-4, atol=1e-5)


def test_plan() -> None:
    """Slices as narrow as the SMs allow (>= 16 units), never over the weights' budget; a grid within the SMs."""
    assert persistent_plan(256, 4, 4, 512, 1, 132) == (16, 8)  # 16 slices x 8 row groups = 128 of 132 SMs
    assert persistent_plan(512, 4, 4, 2048, 1, 132) == (16, 4)  # 32 slices: 4 programs each loop over 8 groups
    assert persistent_plan(64, 4, 4, 512, 1, 132) == (16, 8)
    assert persistent_plan(1024, 4, 4, 512, 1, 132) is None  # 16-unit slices of fp32 weights: 256 KiB, over budget
    assert persistent_plan(1024, 4, 2, 512, 1, 132) == (16, 2)  # bf16 fits
    assert persistent_plan(256, 4, 4, 512, 16, 132) == (32, 1)  # 16 members x 8 slices, one program per slice
    assert persistent_plan(256, 4, 4, 512, 17, 132) is None  # 17 members x 8+ slices > 132 SMs
    assert persistent_plan(48, 4, 4, 512, 1, 132) is None  # not a power of two
    for args in [(64, 3, 2, 100, 1, 8), (256, 4, 4, 512, 2, 108), (512, 3, 2, 4096, 1, 132)]:
        hs, programs = persistent_plan(*args)
        H, G, itemsize, N, E, sms = args
        assert G * H * hs * itemsize <= 128 * 1024 and H // hs * programs * E <= sms and hs >= 16


def test_variant_choice() -> None:
    """``auto`` picks the persistent kernels on a GPU (``sms`` given) where they serve; forced, also off a GPU."""
    assert tb.variant_for(256, 4, 4, batch=512, sms=132) == "persistent"
    assert tb.variant_for(256, 4, 4, batch=512) == "streamed"  # the interpreter: auto keeps today's kernels
    assert tb.variant_for(256, 4, 8, batch=512, sms=132) == "streamed"  # fp64: not on a GPU
    assert tb.variant_for(48, 4, 4, batch=512, sms=132) == "streamed"  # not a power of two
    with tb.kernel_variant("persistent"):
        assert tb.variant_for(256, 4, 4, batch=512) == "persistent"
        assert tb.variant_for(48, 4, 4, batch=512) == "streamed"  # where they cannot serve, the streamed ones run


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("hidden, precision", [(256, "ieee"), (512, "tf32")])
def test_gpu_auto_runs_them_and_matches_reference(cell: str, hidden: int, precision: str) -> None:
    """On CUDA ``auto`` runs the persistent kernels (one launch, spinning on the flag) at B=512, T=64, 3% resets.
    IEEE at the fp32 tolerances of the module doc over 64 steps (1e-4); TF32 rounds each operand to 10 bits
    (~5e-4 relative) per step: 2e-2, as cuDNN's TF32 RNN against an fp64 reference."""
    problem = make_problem(cell, batch_shape=(512,), time=64, input_size=32, hidden=hidden, dtype=torch.float32,
                           reset_prob=0.03, seed=2)
    problem = _to_cuda(problem)
    assert tb.variant_for(hidden, 4 if cell == "lstm" else 3, 4, batch=512,
                          sms=torch.cuda.get_device_properties(0).multi_processor_count) == "persistent"
    out, grads = outputs_and_grads(problem, "triton", matmul_precision=precision)
    ref_out, ref_grads = outputs_and_grads(problem, "reference")
    tol = dict(rtol=1e-4, atol=1e-4) if precision == "ieee" else dict(rtol=2e-2, atol=2e-2)
    for i, (a, e) in enumerate(zip(out + grads, ref_out + ref_grads)):
        torch.testing.assert_close(a, e, msg=lambda m, i=i: f"tensor #{i}: {m}", **tol)


def _to_cuda(problem: dict) -> dict:
    move = lambda v: tuple(t.detach().cuda() for t in v) if isinstance(v, tuple) else v.detach().cuda()  # noqa: E731
    out = {k: (move(v) if isinstance(v, (torch.Tensor, tuple)) else v) for k, v in problem.items() if k != "leaves"}
    out["params"] = problem["params"].detach().cuda()
    leaves = [out["x"], *(out["state"] if isinstance(out["state"], tuple) else (out["state"],))]
    if out["reset_state"] is not None:
        leaves += list(out["reset_state"]) if isinstance(out["reset_state"], tuple) else [out["reset_state"]]
    out["leaves"] = leaves + list(out["params"].values())
    for t in out["leaves"]:
        t.requires_grad_(True)
    return out
