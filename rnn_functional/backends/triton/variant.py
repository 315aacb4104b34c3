"""Which Triton kernel variant a call runs (persistent or streamed) and the switch that forces one; free of
``triton``, so the package can import it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["KERNEL_VARIANTS", "kernel_variant", "variant_for"]

KERNEL_VARIANTS = ("auto", "streamed", "persistent")
_variant = ["auto"]  # the variant kernel_variant set; read by the launcher on every call


@contextlib.contextmanager
def kernel_variant(variant: str) -> Iterator[None]:
    """Within the block, every ``triton`` call runs the ``variant`` kernels: ``"auto"`` (on CUDA the persistent
    kernels where they serve, else streamed), ``"streamed"`` (the tiled kernels, any width) or ``"persistent"``
    (wherever they serve, also in the interpreter, one step per launch); all give the same results. Read when an
    eager call launches; a graph compiled on CUDA keeps the variant it was traced with."""
    if variant not in KERNEL_VARIANTS:
        raise ValueError(f"variant: expected one of {list(KERNEL_VARIANTS)}, got {variant!r}.")
    before, _variant[0] = _variant[0], variant
    try:
        yield
    finally:
        _variant[0] = before


def variant_for(hidden: int, gates: int, itemsize: int, *, batch: int = 0, ensemble: int = 1,
                sms: int | None = None) -> str:
    """The variant a call runs for ``gates`` gate blocks of width ``hidden``, operands of ``itemsize`` bytes,
    ``batch`` rows and ``ensemble`` members on a GPU of ``sms`` SMs (``None``: not a GPU):
    ``"persistent"`` (:func:`.kernels.persistent_plan`) or ``"streamed"`` (any other call)."""
    from .kernels import persistent_plan

    chosen = _variant[0]
    # auto: on GPUs, not for fp64 (no fp64 tensor-core path worth a grid-wide flag); forced: any dtype (tests)
    wanted = chosen == "persistent" or (chosen == "auto" and sms is not None and itemsize < 8)
    plan = wanted and persistent_plan(hidden, gates, itemsize, batch, ensemble, sms or PLAN_SMS)
    return "persistent" if plan else "streamed"


PLAN_SMS = 8  # the SMs the persistent grid is planned for off a GPU (the interpreter): few, so programs loop over groups
