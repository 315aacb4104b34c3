"""Which Triton kernel variant a call runs (resident or streamed), and the public switch that forces the streamed one.

Its own module, free of ``triton``: the package and the launcher (:mod:`.ops`) both read it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["KERNEL_VARIANTS", "kernel_variant", "variant_for"]

KERNEL_VARIANTS = ("auto", "streamed")
_variant = ["auto"]  # the variant kernel_variant set; read by the launcher on every call


@contextlib.contextmanager
def kernel_variant(variant: str) -> Iterator[None]:
    """Within the block, every ``triton`` call runs the ``variant`` kernels: ``"auto"`` (resident where the recurrent
    weights fit on chip, else streamed) or ``"streamed"`` (the tiled kernels at any width), for tests and benchmarks of
    the streamed kernels at widths where ``auto`` picks the resident ones; both give the same results. Read when an
    eager call launches its kernels; a graph compiled on CUDA keeps the variant it was traced with."""
    if variant not in KERNEL_VARIANTS:
        raise ValueError(f"variant: expected one of {list(KERNEL_VARIANTS)}, got {variant!r}.")
    before, _variant[0] = _variant[0], variant
    try:
        yield
    finally:
        _variant[0] = before


def variant_for(hidden: int, gates: int, itemsize: int) -> str:
    """The variant a call runs for ``gates`` gate blocks of width ``hidden`` and operands of ``itemsize`` bytes:
    ``"resident"`` or ``"streamed"`` (:func:`kernel_variant`, :func:`.kernels.resident`)."""
    from .kernels import resident

    return "resident" if _variant[0] == "auto" and resident(hidden, gates, itemsize) else "streamed"
