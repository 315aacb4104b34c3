"""Precision of the recurrent matmul in the ``triton`` backend: ``"ieee"`` (IEEE fp32 products), ``"tf32"`` (one TF32
product, cuDNN's default), ``"tf32x3"`` (three TF32 products compensating the rounding); presets ``"fast"`` /
``"high-prec"``; ``"auto"`` defers to the next source (the order: ``docs/backends.md``, "Precision")."""

from __future__ import annotations

import os

import torch

CONCRETE_MODES = ("ieee", "tf32", "tf32x3")
PRESETS = {"fast": "tf32", "high-prec": "tf32x3"}
USER_MODES = ("auto", *CONCRETE_MODES, *PRESETS)
ENV_VAR = "RNN_FUNCTIONAL_PRECISION"
_FROM_TORCH = {"highest": "ieee", "high": "high-prec", "medium": "fast"}  # torch's names, for the env var

_global_mode = "auto"

__all__ = ["set_recurrent_matmul_precision", "get_recurrent_matmul_precision", "resolve_matmul_precision", "USER_MODES",
           "ENV_VAR"]


def check_mode(mode: str, arg: str = "matmul_precision") -> str:
    """``mode`` if it is a user mode, else a ``ValueError`` naming ``arg``."""
    if mode not in USER_MODES:
        raise ValueError(f"{arg}: expected one of {list(USER_MODES)}, got {mode!r}.")
    return mode


def set_recurrent_matmul_precision(mode: str) -> None:
    """Set the process-wide recurrent matmul precision (``"auto"`` clears it). See ``docs/backends.md``, "Precision"."""
    global _global_mode
    _global_mode = check_mode(mode, "set_recurrent_matmul_precision(mode)")


def get_recurrent_matmul_precision() -> str:
    """The process-wide setting (``"auto"`` when unset), before resolution."""
    return _global_mode


def _env_mode() -> str | None:
    value = os.environ.get(ENV_VAR)
    if not value:
        return None
    value = value.strip().lower()
    value = _FROM_TORCH.get(value, value)
    if value not in USER_MODES:
        raise ValueError(f"environment variable {ENV_VAR}: expected one of {list(USER_MODES) + list(_FROM_TORCH)}, "
                         f"got {os.environ[ENV_VAR]!r}. Fix or unset it.")
    return value


def _from_torch() -> str:
    """torch's own settings as a mode: its fp32 matmul precision where the user changed it (the per-backend
    ``torch.backends.cuda.matmul.fp32_precision`` once that API is in use), else cuDNN's RNN rule."""
    try:
        torch_mode = torch.get_float32_matmul_precision()
    except RuntimeError:  # "mix of the legacy and new APIs"
        torch_mode = "medium" if torch.backends.cuda.matmul.fp32_precision == "tf32" else "highest"
    if torch_mode != "highest":  # the user asked torch for TF32 products
        return _FROM_TORCH[torch_mode]
    return "fast" if torch.backends.cudnn.rnn.fp32_precision == "tf32" else "ieee"


def _has_tf32(device: torch.device | None) -> bool:
    if device is None or device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 8


def mark_constant_result(fn):
    """``torch.compiler.assume_constant_result(fn)`` without importing ``torch._dynamo`` (slow) at import: under
    ``torch.compile`` ``fn`` runs once at trace time and its result is a constant of the graph (no guard). torch's
    decorator sets this attribute (``tests/test_import_time.py`` checks that it still does)."""
    fn._dynamo_marked_constant = True
    return fn


@mark_constant_result
def resolve_matmul_precision(mode: str | None = None, device: torch.device | None = None) -> str:
    """The concrete mode (``"ieee"``, ``"tf32"`` or ``"tf32x3"``) a kernel on ``device`` uses.

    ``mode`` is the call's argument (``None`` or ``"auto"`` defers). TF32 modes become ``"ieee"`` where the device
    has no TF32. Under ``torch.compile`` the result is fixed when traced: set the global setting or the environment
    before compiling.
    """
    chosen = next((m for m in (mode, _global_mode, _env_mode()) if m is not None and check_mode(m) != "auto"),
                  None) or _from_torch()
    chosen = PRESETS.get(chosen, chosen)
    return chosen if _has_tf32(device) else "ieee"
