"""The ``triton`` backend called from two threads at once equals serial calls, bit for bit (issue 14).

Triton's interpreter (``TRITON_INTERPRET=1``) patches ``triton.language`` for the duration of a
launch; two concurrent launches used to crash ("Did you forget to add @triton.jit ?"). The
backend serialises interpreter launches. On CUDA the same property is checked on the device.
"""

from __future__ import annotations

import threading

import pytest
import torch
from helpers import CELLS, flat, make_problem

from rnn_functional.backends import triton as tb

ROUNDS = 3  # calls per thread: the threads overlap for several launches


def _outputs_and_grads(problem: dict) -> list[torch.Tensor]:
    """Outputs of a triton sequence call and the grads of a fixed random loss w.r.t. every leaf."""
    seq = CELLS[problem["cell"]][2]
    outs = flat(seq(problem["x"], problem["state"], problem["params"], is_init=problem["is_init"],
                    reset_state=problem["reset_state"], backend="triton"))
    g = torch.Generator().manual_seed(123)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype).to(o.device)).sum() for o in outs)
    grads = torch.autograd.grad(loss, problem["leaves"], materialize_grads=True)
    return [o.detach() for o in outs] + list(grads)


def _concurrent_equals_serial(problems: list[dict]) -> None:
    serial = [_outputs_and_grads(p) for p in problems]
    results: list = [None] * len(problems)
    errors: list = []
    start = threading.Barrier(len(problems))

    def work(i: int) -> None:
        try:
            start.wait()
            for _ in range(ROUNDS):
                results[i] = _outputs_and_grads(problems[i])
        except Exception as exc:  # re-raised in the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(problems))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    for concurrent, alone in zip(results, serial):
        assert len(concurrent) == len(alone)
        for a, e in zip(concurrent, alone):
            torch.testing.assert_close(a, e, rtol=0, atol=0)  # bit-identical


@pytest.mark.skipif(not tb.is_available("cpu"), reason="triton on CPU needs TRITON_INTERPRET=1 (set before import)")
def test_two_threads_equal_serial_interpreter() -> None:
    problems = [
        make_problem("lstm", batch_shape=(3,), time=3, input_size=4, hidden=16, layers=2, seed=1),  # the interpreter's
        make_problem("gru", batch_shape=(2,), time=4, input_size=5, hidden=16, layers=1, seed=2),  # cost grows with T
    ]
    _concurrent_equals_serial(problems)


def _to_cuda(problem: dict) -> dict:
    def move(v):
        if v is None:
            return None
        if isinstance(v, tuple):
            return tuple(move(t) for t in v)
        return v.detach().cuda().requires_grad_(v.dtype.is_floating_point)

    moved = dict(problem, x=move(problem["x"]), state=move(problem["state"]), reset_state=move(problem["reset_state"]),
                 is_init=None if problem["is_init"] is None else problem["is_init"].cuda())
    moved["params"] = problem["params"].detach().cuda()
    for t in moved["params"].values():
        t.requires_grad_(True)
    moved["leaves"] = flat([moved["x"], moved["state"], *([moved["reset_state"]] if moved["reset_state"] is not None else [])])
    moved["leaves"] += list(moved["params"].values())
    return moved


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_two_threads_equal_serial_cuda() -> None:
    problems = [
        _to_cuda(make_problem("lstm", batch_shape=(64,), time=32, input_size=16, hidden=128, layers=2,
                              dtype=torch.float32, seed=1)),
        _to_cuda(make_problem("gru", batch_shape=(48,), time=40, input_size=16, hidden=256, layers=1,
                              dtype=torch.float32, seed=2)),
    ]
    _concurrent_equals_serial(problems)
    torch.cuda.synchronize()
