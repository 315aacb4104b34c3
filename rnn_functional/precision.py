"""Precision of the recurrent matmul in the ``triton`` backend.

User-facing modes:

* ``"ieee"``: full IEEE fp32 products (no tensor-core TF32);
* ``"tf32"``: one TF32 product (what cuDNN does by default; fastest on compute capability >= 8);
* ``"tf32x3"``: three TF32 products compensating the rounding (close to fp32, on tensor cores);
* ``"fast"`` / ``"high-prec"``: presets that become ``"tf32"`` / ``"tf32x3"`` on GPUs of compute
  capability >= 8 and ``"ieee"`` elsewhere (older GPUs, CPU interpreter);
* ``"auto"``: defer to the next source.

Resolution order: the call's ``matmul_precision`` argument, then the process-wide setting of
:func:`set_recurrent_matmul_precision`, then the environment variable
``RNN_FUNCTIONAL_PRECISION``, then ``torch.get_float32_matmul_precision()`` when it was changed from
torch's default (``"high"`` -> ``"high-prec"``, ``"medium"`` -> ``"fast"``; torch's per-backend
``torch.backends.cuda.matmul.fp32_precision = "tf32"`` -> ``"fast"``), and last cuDNN's RNN rule: ``"fast"``
(TF32) while ``torch.backends.cudnn.allow_tf32`` (or ``torch.backends.cudnn.rnn.fp32_precision``; TF32 by
default), else ``"ieee"``.
So by default fp32 recurrent products run as cuDNN's own RNN kernels do, in TF32 on compute capability
>= 8; ``"ieee"`` (any source above, or ``torch.backends.cudnn.allow_tf32 = False``) gives IEEE fp32.
The first source that is set and not ``"auto"`` wins. The environment variable accepts the modes above and
torch's names (``"highest"``, ``"high"``, ``"medium"``).

TF32 only concerns fp32 operands: with ``compute_dtype=torch.bfloat16`` (or fp64 params) the
kernel multiplies exactly and accumulates in fp32 (fp64), whatever the mode. The other backends
compute at the params' precision and ignore this setting.
"""

from __future__ import annotations

import os

import torch

CONCRETE_MODES = ("ieee", "tf32", "tf32x3")
PRESETS = {"fast": "tf32", "high-prec": "tf32x3"}
USER_MODES = ("auto", *CONCRETE_MODES, *PRESETS)
ENV_VAR = "RNN_FUNCTIONAL_PRECISION"
_FROM_TORCH = {"highest": "ieee", "high": "high-prec", "medium": "fast"}  # torch's names, for the env var

_global_mode = "auto"

__all__ = [
    "set_recurrent_matmul_precision",
    "get_recurrent_matmul_precision",
    "resolve_matmul_precision",
    "USER_MODES",
    "ENV_VAR",
]


def check_mode(mode: str, arg: str = "matmul_precision") -> str:
    """``mode`` if it is a user mode, else a ``ValueError`` naming ``arg``."""
    if mode not in USER_MODES:
        raise ValueError(f"{arg}: expected one of {list(USER_MODES)}, got {mode!r}.")
    return mode


def set_recurrent_matmul_precision(mode: str) -> None:
    """Set the process-wide recurrent matmul precision (``"auto"`` clears it). See the module doc."""
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
        raise ValueError(
            f"environment variable {ENV_VAR}: expected one of {list(USER_MODES) + list(_FROM_TORCH)}, "
            f"got {os.environ[ENV_VAR]!r}. Fix or unset it."
        )
    return value


def _from_torch() -> str:
    """torch's own settings as a mode: its fp32 matmul precision where the user changed it, else cuDNN's RNN rule
    (TF32 while cuDNN's RNNs may use it). ``cudnn.rnn.fp32_precision`` follows both of torch's TF32 APIs, but
    ``get_float32_matmul_precision()`` raises once the user has set the per-backend API
    (``torch.backends.cuda.matmul.fp32_precision``): that setting is then read instead, its ``"tf32"`` as ``"fast"``."""
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
    """``torch.compiler.assume_constant_result(fn)`` without importing ``torch._dynamo`` (slow) at import.

    Under ``torch.compile`` the function runs once at trace time and its result is a constant of the
    graph (no guard). torch 2.13's decorator does exactly this: it sets the attribute below
    (``tests/test_import_time.py`` checks that it still does).
    """
    fn._dynamo_marked_constant = True
    return fn


def resolve_matmul_precision(mode: str | None = None, device: torch.device | None = None) -> str:
    """The concrete mode (``"ieee"``, ``"tf32"`` or ``"tf32x3"``) a kernel on ``device`` uses.

    ``mode`` is the call's argument (``None`` or ``"auto"`` defers). TF32 modes, asked for
    explicitly or through a preset, become ``"ieee"`` where the device has no TF32 (CPU,
    compute capability < 8). Under ``torch.compile`` the result is fixed when the function
    is traced: change the global setting or the environment before compiling.
    """
    chosen = None
    for source in (mode, _global_mode, _env_mode()):
        if source is not None and check_mode(source) != "auto":
            chosen = source
            break
    if chosen is None:
        chosen = _from_torch()
    chosen = PRESETS.get(chosen, chosen)
    return chosen if _has_tf32(device) else "ieee"


mark_constant_result(resolve_matmul_precision)
