"""Segment-aware execution (``rnn_functional.functional.segments``) against ``reference``.

Every path that re-batches a call by its segments (``pad``: length buckets of unpacked ATen calls
for one layer, packed by lengths for more; ``packed``: packed by lengths; ``scan``: the saved-activation
loop over ``T``; ``scan_segments``: that loop over the right-aligned segments; ``segments``: the
reference loop, plain or checkpointed, over the right-aligned segments; and whatever ``auto``
picks) is compared with the ``reference`` loop over the rows: outputs, final carries, segment-end
states and the gradients of ``x``, the state, ``reset_state`` and every parameter (fp64,
``assert_close`` defaults), over random segment structures drawn by hypothesis.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import pytest
import torch
from helpers import pack_state, state_sizes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rnn_functional as rf
from rnn_functional.backends import SequenceOptions
from rnn_functional.functional import segments, selection, slices
from rnn_functional.functional._core import read_layout

SEQUENCES = {
    "lstm": (rf.init_lstm_params, rf.lstm_sequence),
    "gru": (rf.init_gru_params, rf.gru_sequence),
    "norm_gru": (rf.init_norm_gru_params, rf.norm_gru_sequence),
}
ATEN_CELLS = ("lstm", "gru")


@contextmanager
def eager_path(path: str):
    """``auto``'s eager choice forced to ``path`` (``"pad"``, ``"packed"``, ``"segments"``), or left as is (``"auto"``)."""
    if path == "auto":
        yield
        return
    real = selection._eager_fastest
    selection._eager_fastest = lambda layout, opts, is_init, records_grad, plan=None: path
    try:
        yield
    finally:
        selection._eager_fastest = real


@st.composite
def structures(draw):
    """``(batch_shape, T, is_init [*B, T])``: random rows, from one segment to a segment per step."""
    batch_shape = tuple(draw(st.lists(st.integers(0, 3), min_size=0, max_size=2)))
    t_len = draw(st.integers(1, 7))
    n = math.prod(batch_shape)
    kind = draw(st.sampled_from(["random", "every_step", "one_segment", "first_only", "sparse"]))
    if kind == "every_step":
        flags = [True] * (n * t_len)
    elif kind in ("one_segment", "first_only"):
        flags = [kind == "first_only" and i % t_len == 0 for i in range(n * t_len)]
    else:  # "random": about half the steps reset; "sparse": about one in seven
        flag = st.booleans() if kind == "random" else st.sampled_from([False] * 6 + [True])
        flags = draw(st.lists(flag, min_size=n * t_len, max_size=n * t_len))
    is_init = torch.tensor(flags, dtype=torch.bool).reshape(*batch_shape, t_len)
    return batch_shape, t_len, is_init


def _problem(cell: str, batch_shape, t_len: int, is_init, layers: int, with_reset: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    init, _ = SEQUENCES[cell]
    params = init(3, 4, layers, dtype=torch.float64, generator=g)
    sizes = state_sizes("gru" if cell == "norm_gru" else cell, 4, 0)
    x = torch.randn(*batch_shape, t_len, 3, generator=g, dtype=torch.float64)
    state = [torch.randn(*batch_shape, layers, s, generator=g, dtype=torch.float64) for s in sizes]
    reset = [torch.randn(*batch_shape, t_len, layers, s, generator=g, dtype=torch.float64) for s in sizes] if with_reset else []
    leaves = [x, *state, *reset, *params.values()]
    for t in leaves:
        t.requires_grad_(True)
    kind = "lstm" if cell == "lstm" else "gru"
    return params, x, pack_state(kind, state), is_init, pack_state(kind, reset) if with_reset else None, leaves


def _outputs_and_grads(cell, problem, backend, path="auto", recompute="none"):
    params, x, state, is_init, reset, leaves = problem
    with eager_path(path):
        y, final, seg = SEQUENCES[cell][1](x, state, params, is_init=is_init, reset_state=reset, backend=backend,
                                           recompute=recompute, return_segment_states=True)
    outs = [y, *(final if isinstance(final, tuple) else (final,)), *(seg if isinstance(seg, tuple) else (seg,))]
    grads = torch.autograd.grad(weighted_sum(outs), leaves, allow_unused=True)
    return outs, [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads)]


def _check(cell, problem, path, recompute="none"):
    want_outs, want_grads = _outputs_and_grads(cell, problem, "reference")
    outs, grads = _outputs_and_grads(cell, problem, "auto", path, recompute)
    assert len(outs) == len(want_outs)
    for a, b in zip(outs, want_outs):
        torch.testing.assert_close(a, b)
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b)


def weighted_sum(tensors, seed=123):
    """A scalar loss touching every output with random weights."""
    g = torch.Generator().manual_seed(seed)
    return sum((t * torch.randn(t.shape, generator=g, dtype=t.dtype)).sum() for t in tensors)


FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(structure=structures(), cell=st.sampled_from(ATEN_CELLS),
       path=st.sampled_from(["pad", "packed", "segments", "scan", "scan_segments", "auto"]),
       layers=st.sampled_from([1, 2]), with_reset=st.booleans(), seed=st.integers(0, 2**16))
def test_rebatched_paths_equal_reference(structure, cell, path, layers, with_reset, seed):
    batch_shape, t_len, is_init = structure
    _check(cell, _problem(cell, batch_shape, t_len, is_init, layers, with_reset, seed), path)


@settings(max_examples=10, deadline=None)
@given(structure=structures(), recompute=st.sampled_from(["none", "full"]), layers=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**16))
def test_segments_loop_serves_any_cell_and_recompute(structure, recompute, layers, seed):
    """The aligned loop runs cells without ATen kernels and the checkpointed loop (recompute='full')."""
    batch_shape, t_len, is_init = structure
    _check("norm_gru", _problem("norm_gru", batch_shape, t_len, is_init, layers, True, seed), "segments", recompute)


def test_explicit_pad_backend_with_interior_resets_equals_reference():
    """backend='pad' (not only auto) re-batches: a flat row of slices, LSTM with two layers."""
    is_init = torch.zeros(1, 12, dtype=torch.bool)
    is_init[0, [0, 3, 4, 9]] = True
    problem = _problem("lstm", (1,), 12, is_init, 2, True, 0)
    want_outs, want_grads = _outputs_and_grads("lstm", problem, "reference")
    outs, grads = _outputs_and_grads("lstm", problem, "pad")
    for a, b in zip([*outs, *grads], [*want_outs, *want_grads]):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("cell", ATEN_CELLS)
@pytest.mark.parametrize(("batch_shape", "t_len", "slice_len"), [((), 12, 4), ((), 14, 4), ((3,), 10, 3), ((2,), 6, 1)],
                         ids=["flat", "flat-tail", "batched-tail", "batched-step"])
@pytest.mark.parametrize("layers", [1, 2])
def test_whole_slices_fast_path_equals_reference(cell, batch_shape, t_len, slice_len, layers, monkeypatch):
    """Rows of whole slices (the last one shorter where slice_len does not divide T) take the view path: outputs,
    final carries, segment-end states and gradients of x, the incoming state (which the first slice of a row
    without a reset at t=0 continues), reset_state and the params equal reference's; nothing aliases x."""
    is_init = torch.zeros(*batch_shape, t_len, dtype=torch.bool)
    is_init[..., ::slice_len] = True
    is_init.view(-1, t_len)[0, 0] = False  # the first row continues the incoming state
    ran = []
    real = slices.whole_slices
    monkeypatch.setattr(slices, "whole_slices", lambda length: ran.append(length) or real(length))
    for with_reset in (False, True):
        _check(cell, _problem(cell, batch_shape, t_len, is_init, layers, with_reset, seed=layers), "pad")
    assert ran == [slice_len, slice_len]
    params, x, state, *_ = _problem(cell, batch_shape, t_len, is_init, layers, False, 0)
    with torch.no_grad():  # auto's pick (under autograd, a GRU call of <= 4 slices runs the scan loop over them)
        y, final = SEQUENCES[cell][1](x, state, params, is_init=is_init)
    assert ran == [slice_len] * 3
    inputs = {t.untyped_storage().data_ptr() for t in (x, *(state if isinstance(state, tuple) else (state,)))}
    for out in (y, *(final if isinstance(final, tuple) else (final,))):
        assert out.untyped_storage().data_ptr() not in inputs


def _strided(t: torch.Tensor) -> torch.Tensor:
    """A leaf equal to ``t`` viewed with stride 2 along its last dim (non-contiguous storage)."""
    wide = t.detach().new_zeros(*t.shape[:-1], 2 * t.shape[-1])
    wide[..., ::2] = t.detach()
    return wide[..., ::2].requires_grad_(t.requires_grad)


@pytest.mark.parametrize("cell", ATEN_CELLS)
@pytest.mark.parametrize(("pattern", "path"), [("whole", "pad"), ("ragged", "pad"), ("ragged", "packed")])
def test_rebatched_paths_read_strided_arguments(cell, pattern, path):
    """Whole slices (the view path), length buckets and packed segments, given a column-major ``x`` and stride-2
    state, ``reset_state`` and ``is_init``: outputs and gradients equal reference's on contiguous copies."""
    t_len = 12
    is_init = torch.zeros(2, t_len, dtype=torch.bool)
    if pattern == "whole":
        is_init[:, ::4] = True
    else:
        is_init[0, [0, 2, 7]] = True
        is_init[1, [5, 6]] = True
    params, x, state, _, reset, _ = problem = _problem(cell, (2,), t_len, is_init, 1, True, seed=3)
    want_outs, want_grads = _outputs_and_grads(cell, problem, "reference")

    as_tuple = (lambda v: v) if isinstance(state, tuple) else (lambda v: (v,))
    x_cm = x.detach().transpose(-1, -2).contiguous().transpose(-1, -2).requires_grad_(True)
    state_s, reset_s = tuple(_strided(t) for t in as_tuple(state)), tuple(_strided(t) for t in as_tuple(reset))
    assert not (x_cm.is_contiguous() or state_s[0].is_contiguous() or reset_s[0].is_contiguous())
    unpack = (lambda v: v) if isinstance(state, tuple) else (lambda v: v[0])
    leaves = [x_cm, *state_s, *reset_s, *params.values()]
    laid_out = (params, x_cm, unpack(state_s), _strided(is_init), unpack(reset_s), leaves)
    outs, grads = _outputs_and_grads(cell, laid_out, "auto", path)
    for a, b in zip([*outs, *grads], [*want_outs, *want_grads], strict=True):
        torch.testing.assert_close(a, b)


def test_whole_slices_detection():
    """SegmentPlan.slice_len: every row slices of L < T steps from t = 0 (the last one T mod L steps), else None."""
    def slice_len(rows):
        return segments.plan(torch.tensor(rows, dtype=torch.bool)).slice_len

    assert slice_len([[1, 0, 0, 1, 0, 0, 1]]) == 3  # 3, 3 and a last slice of 1
    assert slice_len([[0, 0, 1, 0], [1, 0, 1, 0]]) == 2  # t = 0 starts a slice with or without a reset
    assert slice_len([[1, 1, 1]]) == 1
    assert slice_len([[1, 0, 0]]) is None  # one segment: no interior reset
    assert slice_len([[1, 0, 1, 0, 0]]) is None  # a longer last slice
    assert slice_len([[1, 0, 1, 1]]) is None  # a short slice inside the row
    assert slice_len([[1, 0, 1, 0], [1, 0, 0, 0]]) is None  # rows differ


def test_plan_of_a_flat_row():
    """Segments, their rows, first steps, lengths and each step's place within its segment."""
    is_init = torch.tensor([[False, False, True, True, False, False, False], [True, False, False, True, False, False, True]])
    p = segments.plan(is_init)
    assert p.count == 6 and p.max_len == 4
    assert p.row.tolist() == [0, 0, 0, 1, 1, 1]
    assert p.start.tolist() == [0, 2, 3, 0, 3, 6]
    assert p.lengths_cpu.tolist() == [2, 1, 4, 3, 3, 1]
    assert p.pos[0].tolist() == [0, 1, 0, 0, 1, 2, 3] and p.seg_of[1].tolist() == [3, 3, 3, 4, 4, 4, 5]


def test_buckets_of_sorted_lengths():
    """Buckets cover the sorted segments in order, each as long as its longest; a few padded steps
    cost less than a call; a recompute loop over many steps costs more."""
    for lengths, recompute in (([8, 8, 5, 4, 3, 1], False), ([64] * 40 + [3], True), ([64] * 40 + [3], False),
                               ([3], True), (list(range(64, 0, -1)), True)):
        buckets = segments._buckets(lengths, recompute)
        assert [b[0] for b in buckets] == [0] + [b[1] for b in buckets[:-1]] and buckets[-1][1] == len(lengths)
        assert all(steps == lengths[first] for first, _, steps in buckets)
    assert segments._buckets([64] * 40 + [60], False) == [(0, 41, 64)]  # 4 padded steps: cheaper than a call
    assert segments._buckets([64] * 40 + [60, 60], True) == [(0, 40, 64), (40, 42, 60)]  # cheaper than recomputing
    assert segments._buckets([20] * 5 + [2] * 300, False) == [(0, 5, 20), (5, 305, 2)]


def test_bucketed_lstm_with_short_segments_equals_reference():
    """Flat rows whose slices are shorter than their bucket: the LSTM's c after each slice is recomputed
    from the kernel's outputs (segment states and final carries checked, with gradients)."""
    is_init = torch.zeros(2, 30, dtype=torch.bool)
    is_init[0, [0, 9, 12, 13, 20, 27]] = True  # lengths 9, 3, 1, 7, 7, 3
    is_init[1, [0, 5, 6, 16]] = True  # lengths 5, 1, 10, 14
    problem = _problem("lstm", (2,), 30, is_init, 1, True, 3)
    assert selection.eager_path("pad", read_layout(problem[0], "lstm"), SequenceOptions(), is_init).__qualname__ \
        == "bucketed.<locals>.sequence"
    _check("lstm", problem, "pad")


def test_bucketed_lstm_with_projection_equals_reference():
    """proj_size: h (the output, width P) comes from the kernel's outputs, c (width H) is recomputed."""
    g = torch.Generator().manual_seed(5)
    params = rf.init_lstm_params(3, 5, proj_size=2, dtype=torch.float64, generator=g)
    is_init = torch.zeros(2, 11, dtype=torch.bool)
    is_init[0, [0, 4, 5]] = True
    is_init[1, [3, 9]] = True
    x = torch.randn(2, 11, 3, dtype=torch.float64, generator=g, requires_grad=True)
    state = tuple(torch.randn(2, 1, s, dtype=torch.float64, generator=g, requires_grad=True) for s in (2, 5))
    leaves = [x, *state, *params.values()]
    for t in params.values():
        t.requires_grad_(True)
    results = []
    for backend, path in (("reference", "auto"), ("pad", "pad")):
        with eager_path(path):
            y, final, seg = rf.lstm_sequence(x, state, params, is_init=is_init, backend=backend,
                                             return_segment_states=True)
        outs = [y, *final, *seg]
        results.append((outs, torch.autograd.grad(weighted_sum(outs), leaves)))
    for a, b in zip([*results[0][0], *results[0][1]], [*results[1][0], *results[1][1]]):
        torch.testing.assert_close(a, b)


def test_bucketed_refuses_more_than_one_layer():
    params = rf.init_lstm_params(3, 4, 2)
    is_init = torch.tensor([[True, False, True]])
    run = segments.bucketed(segments.plan(is_init))
    carry = (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4))
    with pytest.raises(ValueError, match="one layer.*segments.packed"):
        run(read_layout(params, "lstm"), dict(params.items()), torch.zeros(1, 3, 3), carry, is_init, None,
            SequenceOptions())


def test_pad_sequence_refuses_interior_resets():
    """The kernel-level pad.sequence runs one call; interior resets must come through the functional layer."""
    from rnn_functional.backends import SequenceOptions, pad
    from rnn_functional.functional._core import read_layout

    params = rf.init_lstm_params(3, 4)
    is_init = torch.tensor([[False, True]])
    carry = (torch.zeros(1, 1, 4), torch.zeros(1, 1, 4))
    with pytest.raises(ValueError, match="interior reset.*backend='pad'"):
        pad.sequence(read_layout(params, "lstm"), dict(params.items()), torch.zeros(1, 2, 3), carry, is_init, None,
                     SequenceOptions())


def _auto_choice(cell, is_init, records_grad, recompute="none", layers=1, hidden=4):
    params = SEQUENCES[cell][0](3, hidden, layers)
    from rnn_functional.backends import SequenceOptions
    from rnn_functional.functional._core import read_layout

    impl = selection.resolve_backend("auto", read_layout(params, cell), torch.zeros(1, 1, 3),
                                     SequenceOptions(recompute=recompute), is_init, records_grad)
    return f"{impl.__module__.rsplit('.', 1)[-1]}.{impl.__qualname__}"


def test_auto_rule():
    """auto under autograd: the length buckets with oneDNN's fused LSTM (one layer), unless they cost 1.5x more
    than the scan loop over T (a [B, T] batch with segments of many lengths) or pad ragged slices of a call
    small enough for packed's gradient fills (packed); for the GRU (ATen's is a per-step
    loop) the scan loop over at most 4 segments, the buckets for full slices, the scan loop over at most 16
    segments of differing lengths that it pads at most 1.25x, packed otherwise, the scan loop over T for [B, T]
    with scattered resets. Forward only: the scan loop over T for [B, T] with many resets,
    the buckets for the LSTM's full slices, packed otherwise."""
    flat = torch.zeros(1, 4096, dtype=torch.bool)
    flat[0, ::20] = True  # full slices of 20
    small = torch.zeros(1, 200, dtype=torch.bool)
    small[0, torch.tensor([1, 2, 3, 5, 8, 12, 17, 23, 30, 38, 47, 57, 68, 80, 93, 107, 122, 138, 155, 173])] = True
    scattered = torch.zeros(32, 64, dtype=torch.bool)
    scattered[torch.arange(32), torch.arange(32) + 2] = True  # [B, T] = [32, 64], longest segment 62 > T / 2
    bucketed, packed = "segments.bucketed.<locals>.sequence", "segments.packed.<locals>.sequence"
    assert _auto_choice("lstm", flat, True) == "slices.whole_slices(20)"  # whole slices: a view, one call
    assert _auto_choice("gru", flat, True) == "slices.whole_slices(20)"
    assert _auto_choice("gru", flat, True, layers=2) == "slices.whole_slices(20)"
    assert _auto_choice("lstm", flat, False, layers=2) == "slices.whole_slices(20)"
    assert _auto_choice("lstm", small, True) == bucketed  # 21 segments, the longest 27: few per length
    short = torch.zeros(1, 180, dtype=torch.bool)
    short[0, torch.arange(1, 9).repeat(5).cumsum(0)[:-1]] = True  # 40 slices of 1..8 steps
    assert _auto_choice("lstm", short, True, hidden=128) == packed  # many short ragged slices, small call
    assert _auto_choice("lstm", short.repeat(1, 128), True, hidden=128) == bucketed  # fills of 8 x 23040 x 128
    assert _auto_choice("gru", small, True) == packed  # 20 segments of many lengths: buckets would pad
    assert _auto_choice("lstm", small, False) == packed  # many lengths: buckets would pad
    assert _auto_choice("lstm", flat[:, :200], False) == "slices.whole_slices(20)"
    assert _auto_choice("gru", flat[:, :200], False) == "slices.whole_slices(20)"
    assert _auto_choice("lstm", flat.view(16, 256), True, hidden=128) == bucketed  # rows do not restart their slices
    assert _auto_choice("lstm", scattered, False) == packed
    assert _auto_choice("lstm", scattered, True) == "scan.sequence"  # 64 segments of 2-62 steps
    few = torch.zeros(32, 64, dtype=torch.bool)
    few[:4, 30] = True  # 36 segments, 28 of them full rows: one call and a short one
    assert _auto_choice("lstm", few, True, hidden=128) == bucketed
    four, five = torch.zeros(1, 200, dtype=torch.bool), torch.zeros(1, 200, dtype=torch.bool)
    four[0, ::64], five[0, ::40] = True, True
    assert _auto_choice("gru", four, True) == "segments.aligned(sequence)"  # scan_segments
    assert _auto_choice("gru", five, True) == "slices.whole_slices(40)"
    assert _auto_choice("gru", four, False) == "slices.whole_slices(64)"
    dense = torch.rand(32, 64, generator=torch.Generator().manual_seed(7)) < 0.2  # 20% resets: 428 segments of <= 36
    assert _auto_choice("gru", dense, False) == packed  # loop over the segments 4.27x the loop over T
    assert _auto_choice("lstm", dense, False) == packed
    tail = torch.zeros(32, 64, dtype=torch.bool)
    tail[:, 40:] = True  # 800 segments, the longest 40 steps: 8.6x
    assert _auto_choice("gru", tail, False) == "scan.sequence"
    assert _auto_choice("lstm", tail, False) == "scan.sequence"
    assert _auto_choice("lstm", scattered, False) == packed  # 64 segments
    sampled = torch.zeros(1, 13 * 64 + 80, dtype=torch.bool)
    sampled[0, torch.tensor([64 * i for i in range(14)] + [13 * 64 + 30, 13 * 64 + 60])] = True  # 13 x 64, 30, 30, 20
    assert 1.05 < segments.bucket_padding(segments.plan(sampled), read_layout(rf.init_lstm_params(3, 4), "lstm")) < 1.15
    assert _auto_choice("lstm", sampled, False) == bucketed  # one call, padding 1.12: oneDNN's forward pays for it
    assert _auto_choice("gru", sampled, True) == "segments.aligned(sequence)"  # 16 segments padded 1.12: scan_segments
    spread = torch.zeros(1, 256, dtype=torch.bool)
    spread[0, torch.tensor([64, 10, 20, 30, 40, 50, 25, 17]).cumsum(0)[:-1]] = True
    spread[0, 0] = True  # 8 segments of 10-64 steps: the loop over them would pad 2.0
    assert _auto_choice("gru", spread, True) == packed
    ragged, starts = torch.zeros(1, 4096, dtype=torch.bool), torch.arange(1, 65).repeat(2).cumsum(0)
    ragged[0, starts[starts < 4096]] = True  # slices of 1..64 steps
    assert _auto_choice("gru", ragged[:, :2048], True, hidden=128) == packed
    assert _auto_choice("gru", ragged[:, :4096], True, hidden=128) == packed  # the per-step fills: packed still faster
    assert _auto_choice("lstm", scattered, True, layers=2) == "reference.sequence"
    assert _auto_choice("gru", scattered, True) == "scan.sequence"
    assert _auto_choice("lstm", torch.zeros(32, 64, dtype=torch.bool), True) == "pad.sequence"  # one call
    assert _auto_choice("norm_gru", flat, True).startswith("segments.aligned(")
    assert _auto_choice("lstm", flat, True, recompute="full").startswith("segments.aligned(")
    assert _auto_choice("norm_gru", scattered, True) == "reference.sequence"


def test_plan_is_shared_within_a_call_and_follows_in_place_changes(monkeypatch):
    """auto's rule and its path share one plan per call; an in-place change to is_init replans."""
    planned = []
    real = segments.plan
    monkeypatch.setattr(segments, "plan", lambda is_init: planned.append(real(is_init)) or planned[-1])
    params = rf.init_lstm_params(3, 4, generator=torch.Generator().manual_seed(0))
    x, is_init = torch.randn(1, 4, 3), torch.tensor([[True, False, True, False]])
    rf.lstm_sequence(x, None, params, is_init=is_init)
    assert [p.count for p in planned] == [2]
    is_init[0, 1] = True
    rf.lstm_sequence(x, None, params, is_init=is_init)
    assert [p.count for p in planned] == [2, 3]
