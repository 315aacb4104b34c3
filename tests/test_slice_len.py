"""``slice_len`` (functions) / ``recurrent_slice_len`` (modules): whole slices run side by side.

Eager checks: equal to the ``reference`` loop without the hint on outputs, final and segment
states and gradients (fp64, ``assert_close`` defaults), for flat and batched calls, interior
resets inside a slice and stored ``reset_state``; and the errors when the hint does not match the
batch. The compiled path is checked in ``compile_tests/test_compile_flat.py``.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

import rnn_functional as rf

F_IN, HIDDEN, LAYERS = 3, 4, 2
SEQUENCE = {"lstm": rf.lstm_sequence, "gru": rf.gru_sequence, "norm_gru": rf.norm_gru_sequence}
INIT = {"lstm": rf.init_lstm_params, "gru": rf.init_gru_params, "norm_gru": rf.init_norm_gru_params}


def slice_starts(batch_shape: tuple, t_len: int, slice_len: int, interior: tuple = ()) -> torch.Tensor:
    """``is_init [*B, T]``: True at every multiple of ``slice_len`` and at the ``interior`` steps."""
    is_init = torch.zeros(*batch_shape, t_len, dtype=torch.bool)
    is_init[..., ::slice_len] = True
    for t in interior:
        is_init[..., t] = True
    return is_init


def make_call(cell: str, batch_shape: tuple, t_len: int, is_init: torch.Tensor, seed: int = 0):
    """``(leaves, kwargs)`` of a sequence call with stored reset states; every float leaf requires grad."""
    g = torch.Generator().manual_seed(seed)
    params = INIT[cell](F_IN, HIDDEN, LAYERS, dtype=torch.float64, generator=g).apply(lambda t: t.requires_grad_())
    n_states = 2 if cell == "lstm" else 1

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()

    x = rand(*batch_shape, t_len, F_IN)
    state = [rand(*batch_shape, LAYERS, HIDDEN) for _ in range(n_states)]
    reset = [rand(*batch_shape, t_len, LAYERS, HIDDEN) for _ in range(n_states)]
    pack = tuple if cell == "lstm" else (lambda parts: parts[0])
    kwargs = dict(is_init=is_init, reset_state=pack(reset), return_segment_states=True)
    leaves = [x, *state, *reset, *params.values()]
    return leaves, (x, pack(state), params), kwargs


def outputs_and_grads(cell: str, args, kwargs, leaves, **options):
    y, final, seg = SEQUENCE[cell](*args, **kwargs, **options)
    outs = [y, *(final if cell == "lstm" else (final,)), *(seg if cell == "lstm" else (seg,))]
    g = torch.Generator().manual_seed(1)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outs)
    return [o.detach() for o in outs], torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("backend", ["auto", "pad", "reference"])
@pytest.mark.parametrize("cell", ["lstm", "gru", "norm_gru"])
@pytest.mark.parametrize("batch_shape", [(), (2,)], ids=["flat", "batched"])
def test_slice_len_matches_reference(cell, backend, batch_shape):
    if backend == "pad" and cell == "norm_gru":
        pytest.skip("norm_gru has no ATen kernels (pad raises for it with or without slice_len)")
    is_init = slice_starts(batch_shape, 12, 4, interior=(6,))  # slices of 4, one reset inside a slice
    leaves, args, kwargs = make_call(cell, batch_shape, 12, is_init)
    got = outputs_and_grads(cell, args, kwargs, leaves, backend=backend, slice_len=4)
    want = outputs_and_grads(cell, args, kwargs, leaves, backend="reference")
    torch.testing.assert_close(got, want)


def test_slice_len_continues_the_incoming_state_without_a_reset_at_t0():
    """``is_init[..., 0]`` False: the first slice of each row starts from ``state``, as without the hint."""
    is_init = slice_starts((2,), 8, 4)
    is_init[..., 0] = False
    leaves, args, kwargs = make_call("lstm", (2,), 8, is_init)
    got = outputs_and_grads("lstm", args, kwargs, leaves, slice_len=4)
    want = outputs_and_grads("lstm", args, kwargs, leaves, backend="reference")
    torch.testing.assert_close(got, want)


def test_slice_len_errors_name_the_hint_expected_and_actual():
    leaves, args, kwargs = make_call("gru", (), 12, slice_starts((), 12, 4))
    with pytest.raises(ValueError, match=r"slice_len=5: the time dim \(T=12.*multiple"):
        rf.gru_sequence(*args, **kwargs, slice_len=5)
    bad = slice_starts((), 12, 4)
    bad[8] = False
    with pytest.raises(ValueError, match=r"slice_len=4: is_init must be True at every slice start.*is_init\[0, 8\] is False"
                                         r".*through a TensorDictReplayBuffer; a plain ReplayBuffer.*on a module "
                                         r"recurrent_slice_len=None"):
        rf.gru_sequence(*args, **{**kwargs, "is_init": bad}, slice_len=4)
    with pytest.raises(ValueError, match="slice_len=4: is_init is required"):
        rf.gru_sequence(*args, slice_len=4)
    for value in (0, -4, 2.0, True):
        with pytest.raises(ValueError, match="slice_len: expected None or a positive int"):
            rf.gru_sequence(*args, **kwargs, slice_len=value)
    with pytest.raises(ValueError, match="GRUModule: recurrent_slice_len: expected None or a positive int"):
        rf.GRUModule(F_IN, HIDDEN, recurrent_slice_len=0)
    with pytest.raises(ValueError, match="LSTMModule: recurrent_num_slices: expected None or a positive int"):
        rf.LSTMModule(F_IN, HIDDEN, recurrent_slice_len=4, recurrent_num_slices=-1)
    for module in (rf.LSTMModule, rf.MinGRUModule):  # caught when built, not at the first recurrent call
        with pytest.raises(ValueError, match=f"{module.__name__}: recurrent_num_slices=3 needs recurrent_slice_len"):
            module(F_IN, HIDDEN, in_key="x", out_key="y", recurrent_num_slices=3)


def test_num_slices_errors_name_the_bounds_and_the_batch():
    """Ragged slices (strict_length=False): at most num_slices segments of at most slice_len steps."""
    is_init = slice_starts((), 13, 4, interior=(6,))  # segments 4, 2, 2, 4, 1: five, the longest 4
    leaves, args, kwargs = make_call("lstm", (), 13, is_init)
    with pytest.raises(ValueError, match=r"slice_len=4, num_slices=4: expected at most 4 segments .* of at most 4 "
                                         r"steps, got 5 segments, the longest 4 steps"):
        rf.lstm_sequence(*args, **kwargs, slice_len=4, num_slices=4)
    with pytest.raises(ValueError, match="the longest 4 steps"):
        rf.lstm_sequence(*args, **kwargs, slice_len=3, num_slices=8)
    with pytest.raises(ValueError, match="num_slices=5 needs slice_len"):
        rf.lstm_sequence(*args, **kwargs, num_slices=5)
    empty = rf.lstm_sequence(args[0][:0], None, args[2], is_init=is_init[:0], slice_len=4, num_slices=5)[0]
    assert empty.shape == (0, HIDDEN)  # T = 0: no segment, nothing to check
    got = outputs_and_grads("lstm", args, kwargs, leaves, slice_len=4, num_slices=5)  # eager: the usual path
    want = outputs_and_grads("lstm", args, kwargs, leaves, backend="reference")
    torch.testing.assert_close(got, want)


def strided(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a non-contiguous view (every other element of a larger tensor), differentiable to ``t``."""
    return torch.stack([t, torch.zeros_like(t)], dim=-1)[..., 0]


@pytest.mark.parametrize("num_slices", [None, 8], ids=["whole", "truncated"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_slice_len_strided_inputs_match_reference(cell, num_slices):
    """Non-contiguous ``x``, ``state``, ``is_init`` and ``reset_state`` under the hint: the same outputs
    and gradients as the ``reference`` loop on contiguous ones."""
    is_init = slice_starts((2,), 12, 4, interior=(6,))
    leaves, (x, state, params), kwargs = make_call(cell, (2,), 12, is_init)
    want = outputs_and_grads(cell, (x, state, params), kwargs, leaves, backend="reference")
    as_strided = (lambda c: tuple(map(strided, c))) if cell == "lstm" else strided
    args = (strided(x), as_strided(state), params)
    kwargs = dict(kwargs, is_init=strided(is_init), reset_state=as_strided(kwargs["reset_state"]))
    assert not (args[0].is_contiguous() or kwargs["is_init"].is_contiguous())
    got = outputs_and_grads(cell, args, kwargs, leaves, slice_len=4, num_slices=num_slices)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_padded_block_matches_reference(cell):
    """The ``[num_slices, slice_len]`` block compiled calls use, run eagerly over the reference loop:
    ragged segments over two rows, bounds not tight (padding segments and columns)."""
    from rnn_functional.backends import Route, SequenceOptions, segments
    from rnn_functional.cells import keep_segment_ends
    from rnn_functional.functional._core import read_layout

    is_init = torch.zeros(2, 13, dtype=torch.bool)
    is_init[0, [0, 3, 4, 9]] = True
    is_init[1, [5, 8]] = True  # row 1 starts from the incoming carry
    leaves, (x, state, params), kwargs = make_call(cell, (2,), 13, is_init)
    carry, reset = ((tuple(s) if cell == "lstm" else (s,)) for s in (state, kwargs["reset_state"]))
    layout, p = read_layout(params, cell), dict(params.items())
    opts = SequenceOptions(segment_states=True)
    routes = [Route("reference", "aligned", segments.static_plan(is_init, 5, 9)), Route("reference")]
    results = []
    for route in routes:
        y, final, per_step, _ = route.run(layout, p, x, carry, is_init, reset, opts)
        outs = [y, *final, *keep_segment_ends(per_step, is_init)]
        loss = sum((o * (i + 1)).sum() for i, o in enumerate(outs))
        results.append(([o.detach() for o in outs], torch.autograd.grad(loss, leaves)))
    torch.testing.assert_close(results[0], results[1])


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_module_recurrent_slice_len_matches_module_without_it(cell):
    """A flat ``[N]`` TensorDict of slices: ``recurrent_slice_len`` changes nothing but the execution."""
    n, keys = 12, (["h", "c"] if cell == "lstm" else ["h"])
    g = torch.Generator().manual_seed(5)
    data = {"x": torch.randn(n, F_IN, generator=g, dtype=torch.float64), "is_init": slice_starts((), n, 4, (6,))[:, None]}
    for k in keys:
        data[k] = torch.randn(n, 1, HIDDEN, generator=g, dtype=torch.float64)
    results = []
    for slice_len, backend in ((4, "auto"), (None, "reference")):
        torch.manual_seed(0)
        module_cls = rf.LSTMModule if cell == "lstm" else rf.GRUModule
        module = module_cls(F_IN, HIDDEN, in_keys=["x", *keys], out_keys=["y", *[("next", k) for k in keys]],
                            recurrent_backend=backend, recurrent_slice_len=slice_len).double()
        td = TensorDict({k: v.clone().requires_grad_(v.is_floating_point()) for k, v in data.items()}, [n])
        with rf.set_recurrent_mode(True):
            out = module(td)
        outs = [out["y"], *(out["next", k] for k in keys)]
        loss = sum((o * (i + 1)).sum() for i, o in enumerate(outs))
        grads = torch.autograd.grad(loss, [td["x"], *(td[k] for k in keys), *module.parameters()])
        results.append(([o.detach() for o in outs], grads))
    torch.testing.assert_close(results[0], results[1])


@pytest.mark.parametrize("hint", [{"slice_len": 4}, {"slice_len": 4, "num_slices": 6}])
def test_vmapped_is_init_with_a_hint_follows_is_init(hint):
    """Under ``torch.vmap`` a batched ``is_init`` cannot be read to check the hint: the call follows ``is_init`` (the
    per-member loop's result where the hint is right, the hint-free result where it is not) instead of failing."""
    torch.manual_seed(0)
    p = rf.init_lstm_params(4, 8, dtype=torch.float64)
    x = torch.randn(3, 2, 8, 4, dtype=torch.float64)
    right = torch.zeros(3, 2, 8, dtype=torch.bool)
    right[:, :, 0] = right[:, :, 4] = True
    right[1, 1, 6] = True  # an extra reset inside a slice (5 segments: within num_slices=6)
    wrong = right.clone()
    wrong[2, 0, 4] = False  # not whole slices: the eager call refuses the hint

    def seq(x, is_init, **kw):
        return rf.lstm_sequence(x, None, p, is_init=is_init, **kw)[0]

    vmapped = torch.vmap(lambda x, i: seq(x, i, **hint))
    hinted = torch.stack([seq(x[m], right[m], **hint) for m in range(3)])
    torch.testing.assert_close(vmapped(x, right), hinted)
    with pytest.raises(ValueError, match="slice_len"):
        seq(x[2], wrong[2], slice_len=4)
    torch.testing.assert_close(vmapped(x, wrong), torch.stack([seq(x[m], wrong[m]) for m in range(3)]))
