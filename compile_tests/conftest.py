"""Settings shared by every torch.compile contract test.

* ``capture_scalar_outputs`` is patched to False for every test: a ``.item()`` (or any
  tensor -> Python scalar conversion) reachable from compiled code is then a graph break,
  which ``fullgraph=True`` turns into an error. We never rely on the global value (TorchRL's
  scan path may flip it on import).
* Dynamo's caches are reset before every test: parametrized tests compile the same code objects
  (a helper's closure, a policy's ``TensorDictSequential.forward``), and a cached graph compiled
  under other settings (compiler options, automatic-dynamic history) must not leak into the next
  test or into its graph and recompile counts.
* ``fail_on_recompile_limit_hit``: a function that exceeds the recompile limit raises instead
  of silently running eagerly (which would let a contract pass without compiling).
* cuDNN's TF32 is off: the ``triton`` kernels follow it by default (``rnn_functional.precision``), and on a GPU a
  compiled ``triton`` call compared at ``FP32_TOL`` with an eager cuDNN or cuBLAS call needs IEEE products on both
  sides (TF32 keeps 10 mantissa bits: differences of ~1e-4 on an H200, benchmarks/results/gpu_h200_2026-12-04).
  The TF32 default itself is tested in ``tests/backends/test_triton_precision.py``.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))


def pytest_report_header(config) -> str:
    if torch.cuda.is_available():
        return f"compile_tests: CUDA available ({torch.cuda.get_device_name()}): GPU compile tests run"
    return "compile_tests: no CUDA device: the GPU tests (mode='reduce-overhead', CUDA graphs) are skipped"


@pytest.fixture(autouse=True)
def _compile_config(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_scalar_outputs=False, fail_on_recompile_limit_hit=True):
        yield
