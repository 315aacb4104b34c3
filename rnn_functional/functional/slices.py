"""Fixed-length slices: a flat batch of whole slices re-batched with static shapes (``slice_len``).

``SliceSampler(slice_len=L, strict_length=True)`` returns a flat batch ``[N]`` of ``N / L`` whole
trajectory slices of exactly ``L`` steps, each starting with ``is_init`` True. Declared with
``slice_len=L``, a call ``[N, T]`` (``T`` a multiple of ``L``; a flat batch is ``N = 1``) runs as
``[N * T / L, L]``: the slices side by side, with no data-dependent shape, so it compiles with
``fullgraph=True`` and no dynamo flag, and eagerly it runs as a rectangular batch.

The row of slice ``(n, k)`` starts from the call's carry for ``k = 0`` (reset there if
``is_init[n, 0]``) and is reset at its first step for ``k > 0`` (to ``reset_state`` there, or
zeros): exactly the call's semantics when ``is_init`` is True at every multiple of ``L``, which is
checked (eagerly a ``ValueError``; under ``torch.compile`` a ``torch._assert_async`` in the graph,
a ``RuntimeError`` when the compiled call runs). Resets inside a slice stay ordinary resets.
"""

from __future__ import annotations

import torch

from ..cells import Carry

__all__ = ["check_value", "check_slice_len", "split", "merge"]


def check_value(slice_len, arg: str = "slice_len") -> None:
    """Raise unless ``slice_len`` is None or a positive int (``arg`` names it in the message)."""
    if slice_len is not None and (isinstance(slice_len, bool) or not isinstance(slice_len, int) or slice_len < 1):
        raise ValueError(
            f"{arg}: expected None or a positive int (the length of every slice, SliceSampler's slice_len), "
            f"got {slice_len!r}."
        )


def check_slice_len(slice_len: int, t_len: int, is_init: torch.Tensor | None, compiling: bool) -> None:
    """Raise when ``slice_len`` does not describe a call of ``T = t_len`` steps with resets ``is_init [N, T]``."""
    check_value(slice_len)
    if t_len % slice_len:
        raise ValueError(
            f"slice_len={slice_len}: the time dim (T={t_len}, the flat batch's length) must be a multiple of it "
            f"(whole slices of exactly {slice_len} steps, as SliceSampler(slice_len={slice_len}, strict_length=True) "
            f"returns). Pass slice_len=None for ragged slices (strict_length=False)."
        )
    if is_init is None:
        raise ValueError(
            f"slice_len={slice_len}: is_init is required (True at the first step of every slice); got None."
        )
    starts = is_init[:, slice_len::slice_len]
    if compiling:
        torch._assert_async(
            starts.all(),
            f"slice_len={slice_len}: is_init must be True at every slice start (every multiple of {slice_len} "
            f"along T); this batch is not whole slices of {slice_len} steps. Pass slice_len=None for ragged slices.",
        )
        return
    if starts.numel() and not bool(starts.all()):
        row, k = (~starts).nonzero()[0].tolist()
        raise ValueError(
            f"slice_len={slice_len}: expected is_init True at every slice start (every multiple of {slice_len} "
            f"along T={t_len}), but is_init[{row}, {(k + 1) * slice_len}] is False ({int((~starts).sum())} of "
            f"{starts.numel()} slice starts are False): the batch is not whole slices of {slice_len} steps. Pass "
            f"the sampler's slice_len with strict_length=True, or slice_len=None for ragged slices."
        )


def split(slice_len: int, x: torch.Tensor, carry: Carry, is_init: torch.Tensor, reset: Carry | None):
    """A call ``x [N, T, F]`` as ``[N * K, slice_len, F]`` (``K = T / slice_len``): ``(x, carry, is_init, reset)``.

    Row ``n * K + k`` is slice ``k`` of row ``n``; its carry is the call's for ``k = 0`` and zeros
    otherwise (``is_init`` is True there, so the backend replaces it before the first step).
    """
    n, t_len = is_init.shape
    k = t_len // slice_len
    rows = n * k
    carry = tuple(
        torch.cat([s.unsqueeze(1), s.new_zeros(n, k - 1, *s.shape[1:])], dim=1).reshape(rows, *s.shape[1:])
        for s in carry
    )
    x = x.reshape(rows, slice_len, x.shape[-1])
    is_init = is_init.reshape(rows, slice_len)
    reset = None if reset is None else tuple(r.reshape(rows, slice_len, *r.shape[2:]) for r in reset)
    return x, carry, is_init, reset


def merge(n: int, t_len: int, y: torch.Tensor, final: Carry, per_step: Carry | None):
    """Inverse of :func:`split` on the results: ``(y [N, T, P], carry_T [N, ...], per-step [N, T, ...])``."""
    k = final[0].shape[0] // n
    y = y.reshape(n, t_len, y.shape[-1])
    final = tuple(s.reshape(n, k, *s.shape[1:])[:, -1] for s in final)
    if per_step is not None:
        per_step = tuple(s.reshape(n, t_len, *s.shape[2:]) for s in per_step)
    return y, final, per_step
