"""Trajectory slices with static shapes under ``torch.compile`` (``docs/compile.md``): ``slice_len`` (and
``num_slices``), the ``SliceSampler``'s own settings, give every shape in advance where the segment layout would be
read on the host. The checks raise a ``ValueError`` eagerly and are in-graph ``torch._assert_async`` ops compiled."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ..backends import segments
from ..cells import Carry

__all__ = ["check_hint", "check_pair", "check_value", "split"]

_RAGGED = ("Pass slice_len=None (and num_slices=None; on a module recurrent_slice_len=None and recurrent_num_slices=None) "
           "for batches of other shapes.")
_UNMARKED = ("SliceSampler marks slice starts in is_init in batches sampled through a TensorDictReplayBuffer; a plain "
             "ReplayBuffer returns the stored is_init alone.")


def check_value(value, arg: str = "slice_len") -> None:
    """Raise unless ``value`` is None or a positive int (``arg`` names it in the message)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        what = "the most slices in a batch" if arg.endswith("num_slices") else "the length of every slice"
        raise ValueError(f"{arg}: expected None or a positive int ({what}, as given to SliceSampler), got {value!r}.")


def check_pair(slice_len, num_slices, owner: str = "", pre: str = "") -> None:
    """Raise when ``num_slices`` is given without ``slice_len`` (``owner``, ``pre``: a module's names)."""
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
               host: np.ndarray | None = None, vmapped: bool = False) -> None:
    """Raise when the hint does not describe a call of ``T = t_len`` steps with resets ``is_init [N, T]``; ``host``:
    ``is_init`` already read on the host, else the check runs on the device (in-graph when ``compiling``).
    ``vmapped``: ``is_init``'s values are not checked (a batched tensor cannot be read): the caller ignores the hint."""
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
        if vmapped:
            return
        seg_of = segments.segment_index(is_init)
        count, lengths = seg_of[-1] + 1, segments.segment_lengths(seg_of, num_slices)
        _check((count <= num_slices) & (lengths <= slice_len).all(), compiling, lambda: too_many(
            *(() if compiling else (int(count), int(segments.segment_lengths(seg_of, int(count)).max())))))
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
    if vmapped:
        return
    starts = is_init[:, slice_len::slice_len]

    def message() -> str:
        if compiling:
            return not_whole()
        row, k = (~starts).nonzero()[0].tolist()
        return not_whole(row, k, int((~starts).sum()), starts.numel())

    if starts.numel():
        _check(starts.all(), compiling, message)


def split(slice_len: int, x: torch.Tensor, carry: Carry, is_init: torch.Tensor, reset: Carry | None):
    """A call ``x [N, T, F]`` as ``[N * K, slice_len, F]`` (``K = T / slice_len``, row ``n * K + k`` slice ``k`` of
    row ``n``): ``(x, carry, is_init, reset)``; the results come back with ``segments.merge_slices``."""
    carry = segments.slice_carries(slice_len, is_init.shape[1] // slice_len, carry, reset)
    reset = None if reset is None else tuple(r.reshape(-1, slice_len, *r.shape[2:]) for r in reset)
    return x.reshape(-1, slice_len, x.shape[-1]), carry, is_init.reshape(-1, slice_len), reset
