"""The eager layouts of a call's segments (``rnn_functional.backends.segments``) against ``reference``.

Every route that lays a call out by its segments, forced through the public ``segment_layout``
(``pad``: whole slices, length buckets of unpacked ATen calls for one layer, packed by lengths;
``reference``/``scan``: the loops over the rows or over the right-aligned segments), and whatever
``auto`` picks by the cost table, is compared with the ``reference`` loop over the rows: outputs, final
carries, segment-end states and the gradients of ``x``, the state, ``reset_state`` and every parameter
(fp64, ``assert_close`` defaults), over random segment structures drawn by hypothesis.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import pack_state, state_sizes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rnn_functional as rf
from rnn_functional.backends import segments
from rnn_functional.functional._core import read_layout

SEQUENCES = {
    "lstm": (rf.init_lstm_params, rf.lstm_sequence),
    "gru": (rf.init_gru_params, rf.gru_sequence),
    "norm_gru": (rf.init_norm_gru_params, rf.norm_gru_sequence),
}
ATEN_CELLS = ("lstm", "gru")


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


def _outputs_and_grads(cell, problem, backend, segment_layout="auto", recompute="none"):
    params, x, state, is_init, reset, leaves = problem
    y, final, seg = SEQUENCES[cell][1](x, state, params, is_init=is_init, reset_state=reset, backend=backend,
                                       recompute=recompute, return_segment_states=True, segment_layout=segment_layout)
    outs = [y, *(final if isinstance(final, tuple) else (final,)), *(seg if isinstance(seg, tuple) else (seg,))]
    grads = torch.autograd.grad(weighted_sum(outs), leaves, allow_unused=True)
    return outs, [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads)]


def _check(cell, problem, backend="auto", segment_layout="auto", recompute="none"):
    want_outs, want_grads = _outputs_and_grads(cell, problem, "reference")
    outs, grads = _outputs_and_grads(cell, problem, backend, segment_layout, recompute)
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


ROUTES = [("auto", "auto"), ("pad", "auto"), ("pad", "packed"), ("pad", "buckets"), ("reference", "aligned"),
          ("scan", "rows"), ("scan", "aligned")]


@FAST
@given(structure=structures(), cell=st.sampled_from(ATEN_CELLS), route=st.sampled_from(ROUTES),
       layers=st.sampled_from([1, 2]), with_reset=st.booleans(), seed=st.integers(0, 2**16))
def test_rebatched_paths_equal_reference(structure, cell, route, layers, with_reset, seed):
    """Every layout of every backend (forced with segment_layout), and auto's pick: outputs, final and
    segment states and the gradients of every input equal reference's."""
    batch_shape, t_len, is_init = structure
    if route[1] == "buckets" and layers > 1:
        route = ("pad", "packed")  # buckets serve one layer (test_buckets_refuse_more_than_one_layer)
    _check(cell, _problem(cell, batch_shape, t_len, is_init, layers, with_reset, seed), *route)


@settings(max_examples=10, deadline=None)
@given(structure=structures(), recompute=st.sampled_from(["none", "full"]), layers=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**16))
def test_segments_loop_serves_any_cell_and_recompute(structure, recompute, layers, seed):
    """The aligned loop runs cells without ATen kernels and the checkpointed loop (recompute='full')."""
    batch_shape, t_len, is_init = structure
    _check("norm_gru", _problem("norm_gru", batch_shape, t_len, is_init, layers, True, seed), "reference", "aligned",
           recompute)


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
def test_whole_slices_fast_path_equals_reference(cell, batch_shape, t_len, slice_len, layers):
    """Rows of whole slices (the last one shorter where slice_len does not divide T) take the view path: outputs,
    final carries, segment-end states and gradients of x, the incoming state (which the first slice of a row
    without a reset at t=0 continues), reset_state and the params equal reference's; nothing aliases x."""
    is_init = torch.zeros(*batch_shape, t_len, dtype=torch.bool)
    is_init[..., ::slice_len] = True
    is_init.view(-1, t_len)[0, 0] = False  # the first row continues the incoming state
    for with_reset in (False, True):
        _check(cell, _problem(cell, batch_shape, t_len, is_init, layers, with_reset, seed=layers), "pad", "slices")
    params, x, state, *_ = _problem(cell, batch_shape, t_len, is_init, layers, False, 0)
    if t_len % slice_len == 0 or (cell == "gru" and layers == 1):  # one call, no gather: pad's cheapest layout
        assert rf.sequence_route(cell, x, params, is_init=is_init, backend="pad").segments == "slices"
    with torch.no_grad():
        y, final = SEQUENCES[cell][1](x, state, params, is_init=is_init, backend="pad")
    inputs = {t.untyped_storage().data_ptr() for t in (x, *(state if isinstance(state, tuple) else (state,)))}
    for out in (y, *(final if isinstance(final, tuple) else (final,))):
        assert out.untyped_storage().data_ptr() not in inputs


def _strided(t: torch.Tensor) -> torch.Tensor:
    """A leaf equal to ``t`` viewed with stride 2 along its last dim (non-contiguous storage)."""
    wide = t.detach().new_zeros(*t.shape[:-1], 2 * t.shape[-1])
    wide[..., ::2] = t.detach()
    return wide[..., ::2].requires_grad_(t.requires_grad)


@pytest.mark.parametrize("cell", ATEN_CELLS)
@pytest.mark.parametrize(("pattern", "layout"), [("whole", "slices"), ("ragged", "buckets"), ("ragged", "packed")])
def test_rebatched_paths_read_strided_arguments(cell, pattern, layout):
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
    outs, grads = _outputs_and_grads(cell, laid_out, "pad", layout)
    for a, b in zip([*outs, *grads], [*want_outs, *want_grads], strict=True):
        torch.testing.assert_close(a, b)


def test_whole_slices_detection():
    """pad lays out as whole slices a call whose rows are all slices of L < T steps from t = 0 (the last one
    T mod L steps), and refuses segment_layout='slices' for any other."""
    params = rf.init_gru_params(3, 4)

    def route(rows):
        is_init = torch.tensor(rows, dtype=torch.bool)
        x = torch.zeros(*is_init.shape, 3)
        try:
            return rf.sequence_route("gru", x, params, is_init=is_init, backend="pad", segment_layout="slices").segments
        except ValueError as err:
            assert "not whole slices" in str(err)
            return None

    assert route([[1, 0, 0, 1, 0, 0, 1]]) == "slices"  # 3, 3 and a last slice of 1
    assert route([[0, 0, 1, 0], [1, 0, 1, 0]]) == "slices"  # t = 0 starts a slice with or without a reset
    assert route([[1, 1, 1]]) == "slices"
    assert route([[1, 0, 0]]) == "rows"  # one segment: no interior reset, nothing to lay out
    assert route([[1, 0, 1, 0, 0]]) is None  # a longer last slice
    assert route([[1, 0, 1, 1]]) is None  # a short slice inside the row
    assert route([[1, 0, 1, 0], [1, 0, 0, 0]]) is None  # rows differ


def test_plan_of_a_flat_row():
    """Segments, their rows, first steps, lengths and each step's place within its segment."""
    is_init = torch.tensor([[False, False, True, True, False, False, False], [True, False, False, True, False, False, True]])
    p = segments.plan(is_init.numpy(), is_init.device)
    assert p.count == 6 and p.max_len == 4
    assert (p.first // 7).tolist() == [0, 0, 0, 1, 1, 1] and (p.first % 7).tolist() == [0, 2, 3, 0, 3, 6]
    assert p.lengths_host.tolist() == p.lengths.tolist() == [2, 1, 4, 3, 3, 1]
    seg_of, pos = p.positions()
    assert pos[0].tolist() == [0, 1, 0, 0, 1, 2, 3] and seg_of[1].tolist() == [3, 3, 3, 4, 4, 4, 5]
    assert segments.alive_per_step(p).tolist() == [6, 4, 3, 1]


@pytest.mark.parametrize("lengths", [[8, 8, 5, 4, 3, 1], [64] * 40 + [3], [3], list(range(64, 0, -1)),
                                     [64] * 40 + [33, 32, 17, 16, 1]])
def test_buckets_of_sorted_lengths(lengths):
    """Buckets cover the sorted segments in order, each as long as its longest, and pad no segment to more than
    twice its length; a new bucket starts only where the length halves."""
    is_init = torch.zeros(1, sum(lengths), dtype=torch.bool)
    is_init[0, np.cumsum([0] + lengths[:-1])] = True
    ordered = sorted(lengths, reverse=True)
    cut = segments.buckets(np.array(ordered))
    assert [b[0] for b in cut] == [0] + [b[1] for b in cut[:-1]] and cut[-1][1] == len(lengths)
    for first, end, steps, full in cut:
        assert steps == ordered[first] and full == ordered[first:end].count(steps)
        assert all(2 * n > steps for n in ordered[first:end])
    for (_, _, steps, _), (first, *_) in zip(cut, cut[1:]):
        assert 2 * ordered[first] <= steps


def test_bucketed_lstm_with_short_segments_equals_reference():
    """Flat rows whose slices are shorter than their bucket: the LSTM's c after each slice is recomputed
    from the kernel's outputs (segment states and final carries checked, with gradients)."""
    is_init = torch.zeros(2, 30, dtype=torch.bool)
    is_init[0, [0, 9, 12, 13, 20, 27]] = True  # lengths 9, 3, 1, 7, 7, 3
    is_init[1, [0, 5, 6, 16]] = True  # lengths 5, 1, 10, 14
    problem = _problem("lstm", (2,), 30, is_init, 1, True, 3)
    _check("lstm", problem, "pad", "buckets")


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
    for backend, layout in (("reference", "auto"), ("pad", "buckets")):
        y, final, seg = rf.lstm_sequence(x, state, params, is_init=is_init, backend=backend,
                                         return_segment_states=True, segment_layout=layout)
        outs = [y, *final, *seg]
        results.append((outs, torch.autograd.grad(weighted_sum(outs), leaves)))
    for a, b in zip([*results[0][0], *results[0][1]], [*results[1][0], *results[1][1]]):
        torch.testing.assert_close(a, b)


def test_buckets_refuse_more_than_one_layer():
    params = rf.init_lstm_params(3, 4, 2)
    is_init = torch.tensor([[True, False, True]])
    with pytest.raises(ValueError, match="segment_layout='buckets'.*one layer.*'packed'"):
        rf.lstm_sequence(torch.zeros(1, 3, 3), None, params, is_init=is_init, backend="pad", segment_layout="buckets")


@pytest.mark.parametrize("forced", ["buckets", "slices"])
def test_a_forced_layout_is_refused_where_one_other_serves(forced):
    """Two layers and ragged resets: only 'packed' serves the call on 'pad'; a forced layout that cannot is an error
    (it was silently replaced by the one route left), as where two others serve."""
    is_init = torch.tensor([[True, True, False, False, True, False], [False, True, False, False, False, False]])
    with pytest.raises(ValueError, match=rf"segment_layout='{forced}' cannot serve this call.*\['packed'\]"):
        rf.gru_sequence(torch.zeros(2, 6, 3), None, rf.init_gru_params(3, 4, 2), is_init=is_init, backend="pad",
                        segment_layout=forced)


@pytest.mark.parametrize(("backend", "layout"), [("auto", "packed"), ("reference", "packed"), ("pad", "aligned"),
                                                 ("triton", "aligned"), ("pad", "sideways")])
def test_segment_layout_names_its_backend(backend, layout):
    with pytest.raises(ValueError, match="segment_layout"):
        rf.gru_sequence(torch.zeros(1, 3, 3), None, rf.init_gru_params(3, 4), backend=backend, segment_layout=layout)


def _cases() -> dict[str, torch.Tensor]:
    """Reset masks of the shapes RL batches take: flat slices (full, ragged, sampled), [B, T] with resets."""
    flat = torch.zeros(1, 4096, dtype=torch.bool)
    flat[0, ::20] = True  # full slices of 20
    small = torch.zeros(1, 200, dtype=torch.bool)
    small[0, torch.tensor([1, 2, 3, 5, 8, 12, 17, 23, 30, 38, 47, 57, 68, 80, 93, 107, 122, 138, 155, 173])] = True
    scattered = torch.zeros(32, 64, dtype=torch.bool)
    scattered[torch.arange(32), torch.arange(32) + 2] = True  # longest segment 62 > T / 2
    dense = torch.rand(32, 64, generator=torch.Generator().manual_seed(7)) < 0.2
    tail = torch.zeros(32, 64, dtype=torch.bool)
    tail[:, 40:] = True  # 800 segments, the longest 40 steps
    sampled = torch.zeros(1, 13 * 64 + 80, dtype=torch.bool)
    sampled[0, torch.tensor([64 * i for i in range(14)] + [13 * 64 + 30, 13 * 64 + 60])] = True
    return {"flat": flat, "small": small, "scattered": scattered, "dense": dense, "tail": tail, "sampled": sampled,
            "none": torch.zeros(32, 64, dtype=torch.bool)}


CASES = _cases()
LAYOUTS = {"reference": ("rows", "aligned"), "scan": ("rows", "aligned"), "pad": ("packed", "buckets", "slices")}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(("cell", "layers", "recompute"), [("lstm", 1, "none"), ("gru", 1, "none"), ("lstm", 2, "none"),
                                                           ("norm_gru", 1, "none"), ("gru", 1, "full")])
@pytest.mark.parametrize("records_grad", [False, True])
def test_auto_follows_its_rule(case, cell, layers, recompute, records_grad):
    """auto's eager route is the rule of docs/backends.md: pad for a cell with ATen kernels and recompute='none'
    (whole slices as their view, else length buckets for one LSTM layer under autograd, else one packed call; but
    the scan loop for a GRU under autograd whose segments do not halve the steps), else
    scan under autograd and reference without, over the aligned segments where those at most halve the steps;
    and it is a route that a named backend and segment_layout can force."""
    is_init = CASES[case]
    params = SEQUENCES[cell][0](3, 4, layers)
    x = torch.zeros(*is_init.shape, 3)
    kw = dict(is_init=is_init, records_grad=records_grad, recompute=recompute)
    chosen = rf.sequence_route(cell, x, params, **kw)
    starts = is_init.clone()
    starts[:, 0] = True
    ends = torch.nonzero(torch.cat([starts[:, 1:], torch.ones_like(starts[:, :1])], 1).reshape(-1)).squeeze(1)
    longest = int(torch.diff(ends, prepend=torch.tensor([-1])).max())
    interior = case != "none"
    gru_rows = cell == "gru" and records_grad and interior and case != "flat" and 2 * longest > is_init.shape[1]
    pad_ok = cell != "norm_gru" and recompute == "none" and not gru_rows
    assert chosen.backend == ("pad" if pad_ok else "scan" if records_grad else "reference")
    if case == "none":
        expected = "rows"
    elif not pad_ok:
        expected = "aligned" if 2 * longest <= is_init.shape[1] else "rows"
    elif case == "flat":
        expected = "slices"
    else:
        expected = "buckets" if records_grad and layers == 1 and cell == "lstm" else "packed"
    assert chosen.segments == expected
    if case != "none":  # a call without interior resets runs its rows: there is no layout to force
        forced = rf.sequence_route(cell, x, params, backend=chosen.backend, segment_layout=chosen.segments, **kw)
        assert (forced.backend, forced.segments) == (chosen.backend, chosen.segments)


@pytest.mark.parametrize("cell", ATEN_CELLS)
@pytest.mark.parametrize("records_grad", [False, True])
def test_auto_runs_whole_slices_as_a_view(cell, records_grad):
    """Full slices of one length, flat: one kernel call on the view [N * T / L, L] costs less than any gather for
    oneDNN's fused LSTM; the GRU's unpacked kernel is ATen's per-step loop, which a packed call ties."""
    is_init = CASES["flat"]
    route = rf.sequence_route(cell, torch.zeros(1, 4096, 3), SEQUENCES[cell][0](3, 4), is_init=is_init,
                              records_grad=records_grad)
    assert (route.backend, route.segments) in ([("pad", "slices")] if cell == "lstm" else [("pad", "slices"),
                                                                                          ("pad", "packed")])


@pytest.mark.parametrize("backend", ["auto", "pad"])
def test_sequence_route_under_vmap_is_the_route_the_call_takes(backend):
    """Under eager ``torch.vmap`` a call reads nothing on the host (a batched mask has no data to read) and runs
    ``reference``; ``sequence_route`` called there says so instead of failing on the read."""
    params = rf.init_lstm_params(3, 4)
    is_init = torch.tensor([[True, False, True, False]] * 2)
    routes = []

    def route(x, mask):
        routes.append(rf.sequence_route("lstm", x, params, is_init=mask, backend=backend))
        return x

    torch.vmap(route)(torch.zeros(2, 2, 4, 3), is_init.expand(2, 2, 4))
    assert routes == [rf.backends.Route("reference")]


def test_an_in_place_change_to_is_init_is_seen_by_the_next_call():
    """The route is chosen per call, from the mask as it is then (nothing is cached across calls)."""
    params = rf.init_lstm_params(3, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x, is_init = torch.randn(1, 4, 3, dtype=torch.float64), torch.tensor([[True, False, True, False]])
    for _ in range(2):
        y, _ = rf.lstm_sequence(x, None, params, is_init=is_init)
        torch.testing.assert_close(y, rf.lstm_sequence(x, None, params, is_init=is_init, backend="reference")[0])
        is_init[0, 1] = True


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("cell", ATEN_CELLS)
def test_cuda_pad_packs_segments_and_matches_reference(cell):
    """On CUDA ``pad`` runs a call with interior resets as one cuDNN call over its packed segments (the CPU cost
    table does not apply there), records gradients in cuDNN's training mode, and equals ``reference``."""
    g = torch.Generator().manual_seed(0)
    init, sequence = SEQUENCES[cell]
    params = {k: v.cuda().requires_grad_(True) for k, v in init(3, 4, 2, dtype=torch.float64, generator=g).items()}
    x = torch.randn(6, 9, 3, generator=g, dtype=torch.float64).cuda().requires_grad_(True)
    is_init = torch.rand(6, 9, generator=g) < 0.2
    is_init[:, 0] = True
    is_init[0, 4] = True  # at least one interior reset
    is_init = is_init.cuda()
    assert rf.sequence_route(cell, x, params, is_init=is_init, backend="pad").segments == "packed"
    results = []
    for backend in ("reference", "pad"):
        y, final = sequence(x, None, params, is_init=is_init, backend=backend)
        outs = [y, *(final if isinstance(final, tuple) else (final,))]
        loss = sum((o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype, device=o.device).view_as(o)).sum() for o in outs)
        results.append((outs, torch.autograd.grad(loss, [x, *params.values()])))
    (want_outs, want_grads), (outs, grads) = results
    for a, b in zip(outs + list(grads), want_outs + list(want_grads)):
        torch.testing.assert_close(a, b)
