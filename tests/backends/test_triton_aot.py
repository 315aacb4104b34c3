"""The ``triton`` kernels compile for Hopper (sm_90) without a GPU, with zero spills (issue 17).

Runs ``benchmarks/triton_aot.py --subset ci`` in a child process without ``TRITON_INTERPRET``
(the interpreter replaces ``triton.jit``, so nothing could be compiled in this process): both
cells, forward and backward, H = 64 and 256, fp32 (TF32, the default) and bf16 operands, every reset flag on,
gates saved, N=256 rows on an H100's 132 SMs (the persistent kernels serve all of these). Each kernel is the one the backend's launcher picks,
with its block sizes, ``num_warps`` and ``num_stages``. Skips where the installed Triton has no
ptxas that runs on this platform.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "triton_aot.py"
sys.path.insert(0, str(SCRIPT.parent))

triton = pytest.importorskip("triton")
import triton_aot  # noqa: E402

REASON = triton_aot.ptxas_available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

HIDDEN = (64, 256)


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, not interpret
    env["PYTHONPATH"] = os.pathsep.join([str(SCRIPT.parents[1]), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--subset", "ci", "--arch", "90", "--hidden", *map(str, HIDDEN), "--out", "-"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, f"AOT compilation failed:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout)


def test_every_subset_kernel_compiles(rows: list[dict]) -> None:
    got = {(r["cell"], r["kernel"], r["H"], r["dtype"]) for r in rows}
    want = {(c, k, h, d) for c in ("lstm", "gru") for k in ("fwd", "bwd") for h in HIDDEN for d in ("float32", "bfloat16")}
    assert got == want
    assert all(r["arch"] == 90 and r["registers"] > 0 for r in rows)


def test_zero_spills(rows: list[dict]) -> None:
    spilling = [f"{r['cell']} {r['kernel']} {r['variant']} H={r['H']} {r['dtype']}: {r['stack_bytes']} B"
                for r in rows if r["spills"] or r["stack_bytes"]]
    assert not spilling, f"kernels spill registers to local memory: {spilling}"


def test_registers_and_shared_memory_within_limits(rows: list[dict]) -> None:
    for r in rows:
        name = f"{r['cell']} {r['kernel']} H={r['H']} {r['dtype']}"
        assert r["registers"] <= 255, name
        assert r["shared_bytes"] <= triton_aot.SHARED_LIMIT[90], f"{name}: {r['shared_bytes']} B of shared memory"
        assert r["occupancy_h100"]["blocks_per_sm"] >= 1, name


def test_launcher_variants(rows: list[dict]) -> None:
    """On a GPU the launcher picks the persistent kernels wherever they serve (variant_for)."""
    for r in rows:
        assert r["variant"] == "persistent", r
