"""Trajectory slices with static shapes under ``torch.compile``: ``slice_len`` (and ``num_slices``).

A flat ``SliceSampler`` batch ``[N]`` holds trajectory slices, ``is_init`` True at each slice start.
The eager layouts of :mod:`rnn_functional.backends.segments` run them side by side, but its segment count and
longest segment are data-dependent host values; under ``torch.compile`` the call would run as one
row of ``N`` steps. A static hint from the sampler's own settings gives every shape in advance:

* ``slice_len=L`` (``SliceSampler(slice_len=L, strict_length=True)``: whole slices of exactly
  ``L`` steps): a call ``[N, T]`` (``T`` a multiple of ``L``; a flat batch is ``N = 1``) runs as
  ``[N * T / L, L]``, a reshape (:func:`split`), eagerly and compiled. The row of
  slice ``(n, k)`` starts from the call's carry for ``k = 0`` (reset there if ``is_init[n, 0]``) and
  is reset at its first step for ``k > 0``: exactly the call's semantics when ``is_init`` is True at
  every multiple of ``L``, which is checked.
* ``slice_len=L, num_slices=K`` (``strict_length=False``: at most ``K`` slices of at most ``L``
  steps, ``N`` varying between batches): under ``torch.compile`` the segments run right-aligned in
  a zero-padded ``[K, L]`` block (:func:`~rnn_functional.backends.segments.aligned` over a
  :func:`~rnn_functional.backends.segments.static_plan`); eagerly the call takes the usual route.

Resets inside a slice stay ordinary resets. The checks raise a ``ValueError`` eagerly; under
``torch.compile`` they are ``torch._assert_async`` ops in the graph (a ``RuntimeError`` from the
compiled call, no host synchronisation on CUDA).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ..backends import segments
from ..cells import Carry

__all__ = ["check_hint", "check_pair", "check_value", "split"]

_RAGGED = ("Pass slice_len=None (and num_slices=None; on a module recurrent_slice_len=None and recurrent_num_slices=None) "
           "for batches of other shapes.")
# why a slice start may lack its reset: the sampler's markers are in the batch only through a TensorDictReplayBuffer
_UNMARKED = ("SliceSampler marks slice starts in is_init in batches sampled through a TensorDictReplayBuffer; a plain "
             "ReplayBuffer returns the stored is_init alone.")


def check_value(value, arg: str = "slice_len") -> None:
    """Raise unless ``value`` is None or a positive int (``arg`` names it in the message)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        what = "the most slices in a batch" if arg.endswith("num_slices") else "the length of every slice"
        raise ValueError(f"{arg}: expected None or a positive int ({what}, as given to SliceSampler), got {value!r}.")


def check_pair(slice_len, num_slices, owner: str = "", pre: str = "") -> None:
    """Raise when ``num_slices`` is given without ``slice_len`` (``owner``/``pre``: a module's prefix and its
    ``recurrent_`` spelling of the names)."""
    if num_slices is not None and slice_len is None:
        raise ValueError(f"{owner}{pre}num_slices={num_slices} needs {pre}slice_len (the longest slice); got "
                         f"{pre}slice_len=None.")


def _check(ok: torch.Tensor, compiling: bool, message: Callable[[], str]) -> None:
    """Raise ``message()`` unless ``ok``: a ``ValueError`` eagerly, an in-graph async assert compiled."""
    if compiling:
        torch._assert_async(ok, message())
    elif not bool(ok):
        raise ValueError(message())


def check_hint(slice_len, num_slices, t_len: int, is_init: torch.Tensor | None, compiling: bool,
               host: np.ndarray | None = None) -> None:
    """Raise when the hint does not describe a call of ``T = t_len`` steps with resets ``is_init [N, T]``.

    ``host``: ``is_init`` already read on the host (a plain eager call reads it once, for this check and the
    segment plan); else the check runs on the device (an in-graph assert when ``compiling``)."""
    check_value(slice_len)
    check_value(num_slices, "num_slices")
    check_pair(slice_len, num_slices)
    if is_init is None:
        raise ValueError(f"slice_len={slice_len}: is_init is required (True at the first step of every slice); got None.")
    if num_slices is not None:
        if is_init.numel() == 0:  # an empty call: no segment
            return

        def too_many(count=None, longest=None) -> str:
            fix = f". Pass SliceSampler's slice_len and num_slices (its batch_size // slice_len). {_RAGGED}"
            if count is None:  # compiled: the numbers are in the graph
                return ("slice_len, num_slices: expected at most num_slices segments (runs between resets) of at most "
                        "slice_len steps, the batch has more or longer ones" + fix)
            return (f"slice_len={slice_len}, num_slices={num_slices}: expected at most {num_slices} segments (runs "
                    f"between resets) of at most {slice_len} steps, got {count} segments, the longest {longest} "
                    f"steps" + fix)

        if host is not None:
            first, lengths = segments.segment_starts(host)
            if len(first) > num_slices or lengths.max() > slice_len:
                raise ValueError(too_many(len(first), int(lengths.max())))
            return
        seg_of = _segment_index(is_init)
        count, lengths = seg_of[-1] + 1, _lengths(seg_of, num_slices)
        _check((count <= num_slices) & (lengths <= slice_len).all(), compiling, lambda: too_many(
            *(() if compiling else (int(count), int(_lengths(seg_of, int(count)).max())))))
        return
    if t_len % slice_len:
        raise ValueError(
            f"slice_len={slice_len}: the time dim (T={t_len}, the flat batch's length) must be a multiple of it "
            f"(whole slices of exactly {slice_len} steps, as SliceSampler(slice_len={slice_len}, strict_length=True) "
            f"returns). For truncated slices (strict_length=False) pass num_slices too. {_RAGGED}"
        )

    def not_whole(row=None, k=None, missing=None, total=None) -> str:
        if row is None:  # compiled: the numbers may be symbolic (dynamic=True), a graph cannot format them
            return ("slice_len: is_init must be True at every slice start (every multiple of slice_len along T): the "
                    f"batch is not whole slices of slice_len steps. {_UNMARKED} {_RAGGED}")
        return (f"slice_len={slice_len}: is_init must be True at every slice start (every multiple of {slice_len} "
                f"along T={t_len}), but is_init[{row}, {(k + 1) * slice_len}] is False ({missing} of {total} slice "
                f"starts are False): the batch is not whole slices of {slice_len} steps. {_UNMARKED} {_RAGGED}")

    if host is not None:
        starts = host[:, slice_len::slice_len]
        if not starts.all():
            row, k = np.argwhere(~starts)[0]
            raise ValueError(not_whole(int(row), int(k), int((~starts).sum()), starts.size))
        return
    starts = is_init[:, slice_len::slice_len]

    def message() -> str:
        if compiling:
            return not_whole()
        row, k = (~starts).nonzero()[0].tolist()
        return not_whole(row, k, int((~starts).sum()), starts.numel())

    if starts.numel():
        _check(starts.all(), compiling, message)


def _segment_index(is_init: torch.Tensor) -> torch.Tensor:
    """``[N * T]`` int64: each step's segment of ``is_init [N, T]`` (row-major; a row's first step starts one)."""
    starts = is_init.clone()
    starts[:, 0] = True
    return starts.reshape(-1).cumsum(0) - 1


def _lengths(seg_of: torch.Tensor, bound: int) -> torch.Tensor:
    """``[bound]``: the step counts of the first ``bound`` segments, zeros past the last (static shapes)."""
    seg_of = seg_of.clamp(max=bound - 1)
    return seg_of.new_zeros(bound).scatter_add(0, seg_of, torch.ones_like(seg_of))


def split(slice_len: int, x: torch.Tensor, carry: Carry, is_init: torch.Tensor, reset: Carry | None):
    """A call ``x [N, T, F]`` as ``[N * K, slice_len, F]`` (``K = T / slice_len``): ``(x, carry, is_init, reset)``.

    Row ``n * K + k`` is slice ``k`` of row ``n``; its carry is :func:`~rnn_functional.backends.segments.slice_carries`'
    (what the backend puts there, as ``is_init`` is True at its first step). The results come back with
    :func:`~rnn_functional.backends.segments.merge_slices`.
    """
    n, t_len = is_init.shape
    k = t_len // slice_len
    rows = n * k
    carry = segments.slice_carries(slice_len, k, carry, reset)
    x = x.reshape(rows, slice_len, x.shape[-1])
    is_init = is_init.reshape(rows, slice_len)
    reset = None if reset is None else tuple(r.reshape(rows, slice_len, *r.shape[2:]) for r in reset)
    return x, carry, is_init, reset
