"""``triton``: fused LSTM/GRU layer kernels with in-kernel resets; variants in docs/backends.md ("Triton kernels").

Per layer, one op (:mod:`.ops`): a GEMM projects the input for all steps, one launch runs the time loop; the backward
is one reverse-loop kernel plus whole-sequence GEMMs (``recompute="full"`` replays the forward). Limits: no
``proj_size``; params fp32, bf16 (fp32 accumulation and state) or fp64; ``E * N * (T + 1) * 4 * H < 2**31`` (32-bit
indexing). ``triton`` is imported only when a kernel runs.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from ...cells import Carry, Layout, TritonKernels, between_layers
from ...precision import check_mode, resolve_matmul_precision
from ..base import SequenceOptions, backends_for, no_kernel_for
from .variant import kernel_variant, variant_for

__all__ = ["is_available", "check_supported", "kernel_variant", "serves", "variant_for", "sequence", "step"]

# Read once, at import (triton reads TRITON_INTERPRET at its own import): Dynamo cannot trace importlib's find_spec
# (a fullgraph compile of a CUDA call failed on it, docs/gpu.md).
_INSTALLED = importlib.util.find_spec("triton") is not None
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
_COMPUTE = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float64: "float64"}


def is_available(device: torch.device | str | None = None) -> bool:
    """True on CUDA with triton installed, and on CPU when ``TRITON_INTERPRET=1``."""
    if not _INSTALLED:  # the package stays importable without it
        return False
    device = torch.device("cpu" if device is None else device)
    return torch.cuda.is_available() if device.type == "cuda" else device.type == "cpu" and _INTERPRETED


def kernel_family(layout: Layout) -> TritonKernels:
    """The cell's Triton kernel family; ``ValueError`` naming the backends that can serve it when it has none."""
    if layout.cell.triton is None:
        raise no_kernel_for("triton", layout.cell)
    return layout.cell.triton


def check_supported(layout: Layout, opts: SequenceOptions) -> None:
    """Raise ``ValueError`` naming the option this backend cannot serve and who can."""
    kernel_family(layout)
    others = ", ".join(name for name in backends_for(layout.cell) if name != "triton")
    if layout.proj_size:
        raise ValueError(f"backend 'triton' does not support proj_size (got proj_size={layout.proj_size}); "
                         f"use one of {others}.")
    if layout.dtype not in _COMPUTE:
        raise ValueError(f"backend 'triton' does not support params of dtype {layout.dtype} (supported: fp32, bf16, "
                         f"fp64); use one of {others}, or convert the params.")
    cdt = opts.compute_dtype or layout.dtype  # a torch.dtype or None (the functional layer checks)
    allowed = (torch.float64,) if layout.dtype == torch.float64 else (torch.float32, torch.bfloat16)
    if cdt not in allowed:
        raise ValueError(f"compute_dtype: backend 'triton' with {layout.dtype} params accepts {list(allowed)}, "
                         f"got {cdt}.")
    if opts.matmul_precision is not None:
        check_mode(opts.matmul_precision)


def serves(layout: Layout, device: torch.device, opts: SequenceOptions | None = None) -> bool:
    """True when this backend can run on ``device`` and serve ``layout`` with ``opts`` (for ``auto``)."""
    if not is_available(device):
        return False
    try:
        check_supported(layout, opts if opts is not None else SequenceOptions())
    except ValueError:
        return False
    return True


def sequence(layout: Layout, params, x: torch.Tensor, carry: Carry, is_init, reset, opts: SequenceOptions):
    """``x [N, T, F]`` -> ``(y [N, T, H], carry, per-step carries or None)``; see :mod:`..base`. One fused op per
    layer, on ``[N, T, F_k]`` with an ensemble dim ``E=1``, returns ``(hs, cs)``, each ``[N, T+1, H]``: the state
    before step 0 and after every step (``cs`` empty for GRU)."""
    from .ops import layer_ops

    lstm = kernel_family(layout).is_lstm
    fwd = layer_ops(x.device).fwd
    compute = _COMPUTE[opts.compute_dtype or layout.dtype]
    precision = resolve_matmul_precision(opts.matmul_precision, x.device)
    one = lambda t: None if t is None else t.unsqueeze(0)  # noqa: E731 - the ensemble dim E=1
    inp, per_layer = x, []  # (hs, cs) of every layer
    for k in range(layout.num_layers):
        inp = between_layers(inp, opts.dropout, opts.training) if k else inp
        w = layout.cell.layer_weights(params, layout, k)
        rh = None if reset is None else reset[0][:, :, k]
        rc = None if (reset is None or not lstm) else reset[1][:, :, k]
        hs, cs, _ = fwd(one(inp), one(w.weight_ih), one(w.bias_ih), one(w.weight_hh), one(w.bias_hh),
                        one(carry[0][:, k]), one(carry[1][:, k]) if lstm else None, one(is_init), one(rh), one(rc),
                        lstm, opts.recompute == "none", compute, precision)
        hs, cs = hs[0].to(inp.dtype), cs[0].to(inp.dtype)  # states come in the accumulation dtype
        per_layer.append((hs, cs) if lstm else (hs,))
        inp = hs[:, 1:]
    new_carry = tuple(torch.stack([states[i][:, -1] for states in per_layer], dim=1) for i in range(len(carry)))
    per_step = tuple(torch.stack([states[i][:, 1:] for states in per_layer], dim=2)
                     for i in range(len(carry))) if opts.segment_states else None
    # y as every backend returns it, contiguous: the last layer's hs[:, 1:] is a strided view of the buffer the
    # kernel's backward saves (an in-place op on it failed the backward; y.view(-1, H) raised)
    return inp.contiguous(), new_carry, per_step


def step(layout: Layout, params, x: torch.Tensor, carry: Carry) -> tuple[torch.Tensor, Carry]:
    """One fused step of all layers: ``x [N, F]``, carry of ``[N, L, S]`` (resets already applied)."""
    y, new_carry, _ = sequence(layout, params, x[:, None], carry, None, None, SequenceOptions())
    return y[:, 0], new_carry
