"""LSTMModule / GRUModule against torch.nn and the functional core (fp64, assert_close defaults)."""

from __future__ import annotations

import copy
import pickle
import re
import subprocess
import sys

import pytest
import torch
from module_helpers import HIDDEN_KEYS, make_module, make_td, nn_recurrent, nn_step, torch_rnn, weighted_sum
from tensordict import TensorDict
from torch import nn

import rnn_functional as rf

CELL_CASES = [("lstm", 1, 0), ("lstm", 2, 0), ("lstm", 2, 3), ("gru", 1, 0), ("gru", 2, 0)]
BACKENDS = {"pad": {}, "python": {"python_based": True}, "scan": {"recurrent_backend": "scan"}}


def _leaves(td: TensorDict, cell: str) -> list[torch.Tensor]:
    leaves = [td["x"], *(td[k] for k in HIDDEN_KEYS[cell])]
    for t in leaves:
        t.requires_grad_(True)
    return leaves


def _module_outputs(module, td, cell):
    out = module(td)
    return [out["y"], *(out["next", k] for k in HIDDEN_KEYS[cell])]


def _recurrent_case(cell, layers, proj, batch_shape, backend):
    module = make_module(cell, layers=layers, proj=proj, **BACKENDS[backend])
    td = make_td(cell, batch_shape, layers=layers, proj=proj, seed=1)
    return module, td


def _check_recurrent(cell, layers, proj, batch_shape, backend):
    module, td = _recurrent_case(cell, layers, proj, batch_shape, backend)
    leaves = _leaves(td, cell)
    params = list(module.parameters())
    with rf.set_recurrent_mode(True):
        ours = _module_outputs(module, td.clone(False), cell)
    is_init = td["is_init"].squeeze(-1)
    y_ref, h_ref = nn_recurrent(torch_rnn(module), leaves[0], is_init, leaves[1:])
    expected = [y_ref, *h_ref]
    for a, b in zip(ours, expected):
        torch.testing.assert_close(a, b)
    g_ours = torch.autograd.grad(weighted_sum(ours), leaves + params)
    g_ref = torch.autograd.grad(weighted_sum(expected), leaves + params)
    for a, b in zip(g_ours, g_ref):
        torch.testing.assert_close(a, b)

    # the same call of the functional core
    seq = rf.lstm_sequence if cell == "lstm" else rf.gru_sequence
    stored = tuple(leaves[1:]) if cell == "lstm" else leaves[1]
    first = tuple(s[..., 0, :, :] for s in leaves[1:]) if cell == "lstm" else leaves[1][..., 0, :, :]
    y, _, seg = seq(
        leaves[0], first, TensorDict(dict(getattr(module, cell).named_parameters()), []), is_init=is_init, reset_state=stored,
        backend="reference", return_segment_states=True,
    )
    seg = list(seg) if cell == "lstm" else [seg]
    for a, b in zip(ours, [y, *seg]):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("backend", ["pad", "python"])
@pytest.mark.parametrize("batch_shape", [(7,), (3, 7), (2, 2, 6)], ids=["flat", "B", "BB"])
@pytest.mark.parametrize("cell,layers,proj", CELL_CASES)
def test_recurrent_mode_matches_nn_and_core(cell, layers, proj, batch_shape, backend):
    _check_recurrent(cell, layers, proj, batch_shape, backend)


def test_recurrent_mode_scan_backend_matches_nn():
    _check_recurrent("lstm", 2, 3, (3, 6), "scan")


@pytest.mark.parametrize("batch_shape", [(), (3,), (2, 3)], ids=["0d", "B", "BB"])
@pytest.mark.parametrize("cell,layers,proj", CELL_CASES)
def test_sequential_mode_matches_nn(cell, layers, proj, batch_shape):
    module = make_module(cell, layers=layers, proj=proj)
    td = make_td(cell, batch_shape, layers=layers, proj=proj, reset_prob=0.5, seed=2)
    leaves = _leaves(td, cell)
    params = list(module.parameters())
    ours = _module_outputs(module, td.clone(False), cell)
    y_ref, h_ref = nn_step(torch_rnn(module), leaves[0], td["is_init"], leaves[1:])
    expected = [y_ref, *h_ref]
    for a, b in zip(ours, expected):
        torch.testing.assert_close(a, b)
    for a, b in zip(torch.autograd.grad(weighted_sum(ours), leaves + params),
                    torch.autograd.grad(weighted_sum(expected), leaves + params)):
        torch.testing.assert_close(a, b)


def _rollout(module, cell, x, is_init, start_states):
    """Sequential mode step by step over ``[B, T]``; returns the collected TensorDict.

    Hidden is carried from ``("next", h)`` and replaced by zeros at ``is_init`` (the
    primer's value after an env reset), as a collector stores it.
    """
    B, T = is_init.shape
    stored = [torch.empty(B, T, *s.shape[1:], dtype=s.dtype) for s in start_states]
    ys, nexts = [], [torch.empty_like(s) for s in stored]
    carry = list(start_states)
    for t in range(T):
        carry = [torch.where(is_init[:, t, None, None], 0.0, c) for c in carry]
        step = TensorDict({"x": x[:, t], "is_init": is_init[:, t, None]}, [B])
        for k, c, s in zip(HIDDEN_KEYS[cell], carry, stored):
            step[k] = c
            s[:, t] = c
        with rf.set_recurrent_mode(False):
            out = module(step)
        ys.append(out["y"])
        carry = [out["next", k] for k in HIDDEN_KEYS[cell]]
        for n, c in zip(nexts, carry):
            n[:, t] = c
    data = TensorDict({"x": x, "is_init": is_init[..., None], "y": torch.stack(ys, 1)}, [B, T])
    for k, s, n in zip(HIDDEN_KEYS[cell], stored, nexts):
        data[k] = s
        data["next", k] = n
    return data


@pytest.mark.parametrize("cell,layers,proj", [("lstm", 1, 0), ("lstm", 2, 3), ("gru", 2, 0)])
def test_sequential_rollout_equals_recurrent_mode(cell, layers, proj):
    """Step-by-step collection == one recurrent call, [B, T] and flat ragged, with mid-sequence
    resets and non-zero stored hidden at slice starts (in the flat batch, where is_init is True)."""
    module = make_module(cell, layers=layers, proj=proj)
    g = torch.Generator().manual_seed(3)
    B, T = 3, 9
    x = torch.randn(B, T, 4, generator=g, dtype=torch.float64)
    is_init = torch.zeros(B, T, dtype=torch.bool)
    is_init[0, [0, 4]] = True  # an episode start, then a reset mid-row
    is_init[1, [3, 5, 6]] = True  # a slice starting mid-episode (non-zero hidden, no is_init at t=0)
    is_init[2, 0] = True
    widths = [proj or 5, 5] if cell == "lstm" else [5]
    start = [torch.randn(B, layers, w, generator=g, dtype=torch.float64) for w in widths]
    data = _rollout(module, cell, x, is_init, start)
    seg_end = torch.cat([is_init[:, 1:], torch.ones(B, 1, dtype=torch.bool)], 1)[..., None, None]

    with rf.set_recurrent_mode(True):
        rec = module(data.exclude("y", "next"))
    torch.testing.assert_close(rec["y"], data["y"])
    for k in HIDDEN_KEYS[cell]:
        torch.testing.assert_close(rec["next", k], torch.where(seg_end, data["next", k], 0.0))

    # Flat ragged batch (SliceSampler's layout): rows packed end to end, is_init True at
    # every row start, where the stored hidden is kept (non-zero for rows 0 and 1).
    flat = data.exclude("y", "next").clone()
    flat["is_init"][:, 0] = True
    flat = flat.reshape(-1)
    with rf.set_recurrent_mode(True):
        rec_flat = module(flat)
    torch.testing.assert_close(rec_flat["y"], data["y"].reshape(B * T, -1))
    for k in HIDDEN_KEYS[cell]:
        torch.testing.assert_close(
            rec_flat["next", k], torch.where(seg_end, data["next", k], 0.0).reshape(B * T, *data[k].shape[2:])
        )


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_no_hidden_leak_across_packed_trajectories(cell):
    """TorchRL tutorial's check: noisy stored hidden everywhere, two trajectories packed in one
    row; the second one's outputs equal a standalone run of it."""
    module = make_module(cell, hidden=6)
    td = make_td(cell, (1, 8), hidden=6, reset_prob=0.0, seed=4)
    td["is_init"][0, [0, 4]] = True
    with rf.set_recurrent_mode(True):
        packed = module(td.clone())
        alone = module(td[:, 4:].clone())
    torch.testing.assert_close(packed["y"][:, 4:], alone["y"])
    for k in HIDDEN_KEYS[cell]:
        torch.testing.assert_close(packed["next", k][:, 4:], alone["next", k])


# ----------------------------------------------------------------------------- parameters


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_functional_call_and_to_module(cell):
    module = make_module(cell, layers=2)
    td = make_td(cell, (2, 5), layers=2, seed=5)
    params = TensorDict.from_module(module)
    assert set(params.keys(True, True)) == {(cell, n) for n, _ in getattr(module, cell).named_parameters()}
    doubled = params.apply(lambda p: 2 * p.detach())
    with rf.set_recurrent_mode(True):
        via_call = torch.func.functional_call(module, dict(doubled.flatten_keys(".").items()), (td.clone(),))
        fresh = make_module(cell, layers=2, seed=99)
        doubled.to_module(fresh)
        via_to_module = fresh(td.clone())
        with doubled.to_module(module):
            via_ctx = module(td.clone())
        original = module(td.clone())
        reference = make_module(cell, layers=2)
        getattr(reference, cell).load_state_dict({k: 2 * v for k, v in getattr(module, cell).state_dict().items()})
        expected = reference(td.clone())
    for out in (via_call, via_to_module, via_ctx):
        torch.testing.assert_close(out["y"], expected["y"])
    assert not torch.allclose(original["y"], expected["y"])  # the swap was undone


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_wraps_existing_module_sharing_weights(cell):
    rnn = (nn.LSTM if cell == "lstm" else nn.GRU)(4, 5, 2, batch_first=True, dtype=torch.float64)
    cls = rf.LSTMModule if cell == "lstm" else rf.GRUModule
    module = cls(**{cell: rnn}, in_keys=["x", *HIDDEN_KEYS[cell]], out_keys=["y", *[("next", k) for k in HIDDEN_KEYS[cell]]])
    assert all(p is q for p, q in zip(getattr(module, cell).parameters(), rnn.parameters()))
    assert set(module.state_dict()) == {f"{cell}.{k}" for k in rnn.state_dict()}  # TorchRL's names
    td = make_td(cell, (3,), layers=2, seed=6)
    module(td)["y"].sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in rnn.parameters())
    with torch.no_grad():
        rnn.weight_ih_l0.mul_(0.5)
    y_new = module(td.clone())["y"]
    y_ref, _ = nn_step(rnn, td["x"], td["is_init"], [td[k] for k in HIDDEN_KEYS[cell]])
    torch.testing.assert_close(y_new, y_ref)


# ----------------------------------------------------------------------------- modes


def test_recurrent_mode_sources_and_nesting():
    module = make_module("gru")
    assert module.recurrent_mode is False
    assert make_module("gru", default_recurrent_mode=True).recurrent_mode is True
    assert rf.recurrent_mode() is None
    with rf.set_recurrent_mode():
        assert module.recurrent_mode is True and rf.recurrent_mode() is True
        with rf.set_recurrent_mode("sequential"):
            assert module.recurrent_mode is False
        with rf.set_recurrent_mode(None):
            assert make_module("gru", default_recurrent_mode=True).recurrent_mode is True
        assert module.recurrent_mode is True
    assert module.recurrent_mode is False

    @rf.set_recurrent_mode("recurrent")
    def decorated():
        return module.recurrent_mode

    assert decorated() is True and module.recurrent_mode is False
    with pytest.raises(ValueError, match="mode must be"):
        rf.set_recurrent_mode("sideways")
    with pytest.raises(RuntimeError, match="cannot be changed in-place"):
        module.recurrent_mode = True
    with pytest.raises(RuntimeError, match="set_recurrent_mode context manager"):
        module.set_recurrent_mode(True)


def test_recurrent_mode_switches_computation():
    """The same [B, T] TensorDict: recurrent mode threads time, sequential mode treats steps as
    independent single steps (zero state where is_init, stored state elsewhere)."""
    module = make_module("lstm")
    td = make_td("lstm", (2, 5), seed=7)
    with rf.set_recurrent_mode(True):
        rec = module(td.clone())["y"]
    seq = module(td.clone())["y"]
    y_step, _ = nn_step(torch_rnn(module), td["x"], td["is_init"], [td["h"], td["c"]])
    torch.testing.assert_close(seq, y_step)
    assert not torch.allclose(rec, seq)


# ----------------------------------------------------------------------------- options


def test_dropout_in_both_modes():
    module = make_module("lstm", layers=2, dropout=0.5)
    td = make_td("lstm", (3, 4), layers=2, seed=8)
    module.eval()
    with rf.set_recurrent_mode(True):
        y_eval = module(td.clone())["y"]
    y_ref, _ = nn_recurrent(torch_rnn(module.eval()), td["x"], td["is_init"].squeeze(-1), [td["h"], td["c"]])
    torch.testing.assert_close(y_eval, y_ref)
    module.train()
    with rf.set_recurrent_mode(True):
        torch.manual_seed(0)
        y_train = module(td.clone())["y"]
    assert not torch.allclose(y_train, y_eval)
    # sequential mode applies inter-layer dropout too: a single step equals a T=1 recurrent call
    step = td[:, 0].clone()
    torch.manual_seed(1)
    y_step = module(step.clone())["y"]
    one = step.clone().unsqueeze(-1)
    for k in ("h", "c"):
        one[k] = torch.where(one["is_init"][..., None], 0.0, one[k])
    torch.manual_seed(1)
    with rf.set_recurrent_mode(True):
        y_one = module(one)["y"][:, 0]
    torch.testing.assert_close(y_step, y_one)
    module.eval()
    assert not torch.allclose(module(step.clone())["y"], y_step)


def test_python_based_switch_changes_kernel():
    module = make_module("lstm", default_recurrent_mode=True)
    assert module.recurrent_backend == "auto"
    assert module.make_cudnn_based() is module and module.recurrent_backend == "pad"
    td = make_td("lstm", (2, 5), seed=9)

    def aten_ops():
        with torch.autograd.profiler.profile() as prof:
            out = module(td.clone())["y"]
        return {e.name for e in prof.function_events}, out

    ops_cudnn, y_cudnn = aten_ops()
    assert module.make_python_based() is module
    ops_python, y_python = aten_ops()
    assert module.make_cudnn_based() is module
    ops_back, _ = aten_ops()
    assert "aten::lstm" in ops_cudnn and "aten::lstm" in ops_back and "aten::lstm" not in ops_python
    torch.testing.assert_close(y_python, y_cudnn)


@pytest.mark.parametrize("backend", ["scan", "auto"])
def test_recompute_full_gradients_equal(backend):
    td = make_td("lstm", (2, 5), layers=2, seed=10)
    grads = {}
    for mode in ("none", "full"):
        module = make_module("lstm", layers=2, recurrent_backend=backend, recurrent_recompute=mode)
        leaves = _leaves(td.clone(), "lstm")
        src = TensorDict({"x": leaves[0], "h": leaves[1], "c": leaves[2], "is_init": td["is_init"]}, [2, 5])
        with rf.set_recurrent_mode(True):
            outs = _module_outputs(module, src, "lstm")
        grads[mode] = torch.autograd.grad(weighted_sum(outs), leaves + list(module.parameters()))
    for a, b in zip(grads["none"], grads["full"]):
        torch.testing.assert_close(a, b)


def _spy_cell(module, seen: dict):
    """``module`` calling spies of its cell's public functions that record their keyword arguments."""
    from dataclasses import replace

    cell = module._cell
    step = lambda *a, **kw: seen.setdefault("step", kw) and cell.step(*a, **kw)  # noqa: E731
    sequence = lambda *a, **kw: seen.setdefault("sequence", kw) and cell.sequence(*a, **kw)  # noqa: E731
    module._cell = replace(cell, step=step, sequence=sequence)
    return module


def test_options_reach_the_core():
    """recurrent_* arguments are passed to the public sequence function the module calls, never dropped, with the
    weights' layout checked when bound (not re-read per call)."""
    seen = {}
    module = _spy_cell(make_module(
        "gru", recurrent_backend="scan", recurrent_recompute="full", recurrent_compute_dtype=torch.bfloat16,
        recurrent_matmul_precision="tf32x3", default_recurrent_mode=True,
    ), seen)
    module(make_td("gru", (1, 3)))
    kw = seen["sequence"]
    assert kw["backend"] == "scan" and kw["recompute"] == "full"
    assert kw["compute_dtype"] is torch.bfloat16 and kw["matmul_precision"] == "tf32x3"
    assert kw["return_segment_states"] is True
    assert kw["layout"] is module._layout


@pytest.mark.parametrize("option, value, exc, message", [
    ("recurrent_backend", "cudnn", ValueError, "GRUModule: recurrent_backend: expected one of ['auto', "),
    ("recurrent_backend", "parallel", ValueError, "backend 'parallel' cannot serve the GRU cell"),
    ("recurrent_recompute", "yes", ValueError, "GRUModule: recurrent_recompute: expected one of ['none', 'full'], got 'yes'"),
    ("recurrent_compute_dtype", torch.int32, TypeError, "GRUModule: recurrent_compute_dtype must be None"),
    ("recurrent_matmul_precision", "fastest", ValueError, "GRUModule: recurrent_matmul_precision: expected one of"),
])
def test_options_assigned_later_are_checked(option, value, exc, message):
    """An option assigned after construction is checked as the constructor checks it, at the assignment: a bad value
    is not left for the next call to trip on (a bare KeyError) or to ignore (recompute, compute dtype)."""
    module = make_module("gru", default_recurrent_mode=True)
    before = getattr(module, option)
    with pytest.raises(exc, match=re.escape(message)):
        setattr(module, option, value)
    assert getattr(module, option) == before


def test_options_assigned_later_are_checked_together_and_reach_the_core():
    module = make_module("lstm", default_recurrent_mode=True, recurrent_recompute="full")
    td = make_td("lstm", (2, 5), seed=12)
    want = module(td.clone())["y"]
    with pytest.raises(ValueError, match=re.escape("recurrent_backend 'pad' cannot serve recurrent_recompute='full'")):
        module.recurrent_backend = "pad"
    module.recurrent_recompute = "none"
    module.recurrent_backend = "pad"
    with torch.autograd.profiler.profile() as prof:
        got = module(td.clone())["y"]
    assert "aten::lstm" in {e.name for e in prof.function_events}  # the pad backend ran
    torch.testing.assert_close(got, want)
    for copied in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        assert (copied.recurrent_backend, copied.recurrent_recompute) == ("pad", "none")
        with pytest.raises(ValueError, match="recurrent_backend: expected one of"):
            copied.recurrent_backend = "cudnn"


def test_module_pickled_with_public_option_names_loads():
    """A module pickled whole before the options were checked properties (``__dict__`` holding
    ``recurrent_backend``, not ``_recurrent_backend``) loads and runs with its options."""
    module = make_module("gru", default_recurrent_mode=True, recurrent_backend="scan")
    td = make_td("gru", (2, 5), seed=13)
    want = module(td.clone())["y"]
    old = {(k[1:] if k.lstrip("_") in ("recurrent_backend", "recurrent_recompute", "recurrent_compute_dtype",
                                       "recurrent_matmul_precision") else k): v for k, v in module.__dict__.items()}
    assert "recurrent_backend" in old and "_recurrent_backend" not in old
    loaded = type(module).__new__(type(module))
    loaded.__setstate__(copy.copy(old))
    assert loaded.recurrent_backend == "scan" and loaded.recurrent_recompute == "none"
    torch.testing.assert_close(loaded(td.clone())["y"], want)


@pytest.mark.skipif("triton" not in rf.available_backends(), reason="triton backend not available here")
def test_triton_backend_module_matches_nn():
    module = make_module("lstm", recurrent_backend="triton", recurrent_matmul_precision="ieee")
    td = make_td("lstm", (2, 5), seed=11)
    with rf.set_recurrent_mode(True):
        out = module(td.clone())
    y_ref, h_ref = nn_recurrent(torch_rnn(module), td["x"], td["is_init"].squeeze(-1), [td["h"], td["c"]])
    torch.testing.assert_close(out["y"], y_ref)
    torch.testing.assert_close(out["next", "h"], h_ref[0])


def test_canonicalize_only_rnn_leaves():
    module = rf.LSTMModule(3, 4, in_key="obs", out_key="out")
    base = torch.randn(5, 2, 3)
    other = torch.randn(5, 2, 1)
    td = TensorDict({"obs": base.transpose(0, 1), "reward": other.transpose(0, 1)}, [2, 5])
    assert not td["obs"].is_contiguous()
    out = module.canonicalize(td)
    assert out is not td and out["obs"].is_contiguous()
    assert not td["obs"].is_contiguous()  # the input is untouched
    assert out["reward"].data_ptr() == td["reward"].data_ptr() and not out["reward"].is_contiguous()
    torch.testing.assert_close(out["obs"], td["obs"])
    same = module.canonicalize(td, inplace=True)
    assert same is td and td["obs"].is_contiguous()
    assert module.canonical_keys == module.in_keys + module.out_keys
    empty = TensorDict({"reward": other}, [5, 2])
    assert module.canonicalize(empty) is empty


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(in_key="x", in_keys=["x", "h", "c"], out_key="y"), ValueError, "not both or none"),
        (dict(out_key="y"), ValueError, "not both or none"),
        (dict(in_key="x", out_key="y", out_keys=["y", "a", "b"]), ValueError, "not both or none"),
        (dict(in_keys=["x", "h"], out_key="y"), ValueError, "expects 3 inputs"),
        (dict(in_keys=["x", "h", "c", "done"], out_key="y"), ValueError, "expects 3 inputs"),
        (dict(in_key="x", out_keys=["y", ("next", "h")]), ValueError, "expects 3 outputs"),
        (dict(in_key="x", out_key="y", batch_first=False), ValueError, "batch_first=True"),
        (dict(in_key="x", out_key="y", bidirectional=True), ValueError, "bidirectional"),
        (dict(in_key="x", out_key="y", recurrent_backend="cudnn"), ValueError, "recurrent_backend: expected one of"),
        (dict(in_key="x", out_key="y", recurrent_backend="pad", recurrent_recompute="full"), ValueError, "recurrent_backend 'pad' cannot serve"),
        (dict(in_key="x", out_key="y", recurrent_recompute="some"), ValueError, "recurrent_recompute: expected one of"),
        (dict(in_key="x", out_key="y", recurrent_matmul_precision="low"), ValueError, "recurrent_matmul_precision"),
        (dict(in_key="x", out_key="y", recurrent_compute_dtype="bf16"), TypeError, "recurrent_compute_dtype"),
    ],
)
def test_constructor_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        rf.LSTMModule(3, 4, **kwargs)


def test_constructor_errors_wrapping():
    with pytest.raises(ValueError, match="batch_first=True"):
        rf.LSTMModule(lstm=nn.LSTM(3, 4), in_key="x", out_key="y")
    with pytest.raises(ValueError, match="cannot be passed along"):
        rf.GRUModule(3, 4, gru=nn.GRU(3, 4, batch_first=True), in_key="x", out_key="y")
    with pytest.raises(ValueError, match="conflicts with the wrapped"):
        rf.LSTMModule(num_layers=2, lstm=nn.LSTM(3, 4, batch_first=True), in_key="x", out_key="y")
    with pytest.raises(TypeError, match="must be a torch.nn.GRU"):
        rf.GRUModule(gru=nn.LSTM(3, 4, batch_first=True), in_key="x", out_key="y")
    with pytest.raises(ValueError, match="expects 2 inputs"):
        rf.GRUModule(3, 4, in_keys=["x", "h", "c"], out_key="y")
    with pytest.raises(TypeError, match="hidden_size must be passed"):  # TorchRL's class too
        rf.GRUModule(3, in_key="x", out_key="y")
    with pytest.raises(TypeError, match="LSTMModule: input_size must be passed .* or pass a built lstm=nn.LSTM"):
        rf.LSTMModule(hidden_size=4, in_key="x", out_key="y")


def test_call_errors():
    module = make_module("lstm")
    td = make_td("lstm", (2, 3))
    with pytest.raises(KeyError, match="InitTracker"):
        module(td.exclude("is_init"))
    with pytest.raises(RuntimeError, match="missing while"):
        module(td.exclude("c"))
    with pytest.raises(ValueError, match="at least one batch dim"), rf.set_recurrent_mode(True):
        module(make_td("lstm", ()))
    # missing hidden keys mean zeros, as in TorchRL
    y0 = module(td.exclude("h", "c"))["y"]
    zeros = td.clone()
    zeros["h"].zero_()
    zeros["c"].zero_()
    torch.testing.assert_close(y0, module(zeros)["y"])


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_sequence_rereads_the_layout_of_swapped_weights(cell):
    """Recurrent mode reads the layout checked when the weights were bound, unless the weights in the dict
    moved dtype since (``functional_call`` / ``TensorDict.to_module`` swap values into that dict): fp64
    weights swapped into an fp32 module run in fp64 and equal the fp64 module."""
    module = make_module(cell, dtype=torch.float32)
    td = make_td(cell, (2, 3))
    reference = make_module(cell, dtype=torch.float64)  # same seed: the same weights in fp64
    params64 = {f"{cell}.{k}": v.double() for k, v in module._weights.items()}
    with rf.set_recurrent_mode(True):
        got = torch.func.functional_call(module, params64, (td.clone(),))
        want = reference(td.clone())
    for key in ["y", *[("next", k) for k in HIDDEN_KEYS[cell]]]:
        assert got[key].dtype == torch.float64
        torch.testing.assert_close(got[key], want[key])


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_step_dtype_checked_after_to(cell):
    """The step reads the params' layout checked when the weights were bound (re-bound by ``.to()``, copies):
    inputs of another dtype than the weights' are refused, naming the argument and the fix."""
    module = make_module(cell, dtype=torch.float32)
    td = make_td(cell, (3,), dtype=torch.float32)
    y32 = module(td.clone())["y"]
    module.double()
    assert module._layout.dtype == torch.float64
    with pytest.raises(ValueError, match=r"key 'x': expected dtype torch.float64 .* got torch.float32.*\.to\("):
        module(td.clone())
    td64 = td.apply(lambda t: t.double() if t.is_floating_point() else t)
    torch.testing.assert_close(module(td64)["y"], y32.double(), rtol=1e-5, atol=1e-6)
    for copied in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):  # re-bound, not copied
        assert copied._layout.cell is module._layout.cell
        assert copied._weights is copied._rnn._parameters
        torch.testing.assert_close(copied(td64)["y"], module(td64)["y"])


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_validated_step_non_contiguous_inputs_match_torch_nn(cell):
    """The module's step on its own weights (checked when bound: the step skips the public step's checks) with
    non-contiguous ``x``, states and ``is_init`` (views of transposed storage, 2-d batch) equals ``torch.nn``,
    outputs and every gradient."""
    seen = {}
    module = _spy_cell(make_module(cell, layers=2), seen)
    td = make_td(cell, (3, 2), layers=2, reset_prob=0.5)
    leaves = {k: td[k].transpose(0, 1).contiguous().transpose(0, 1).requires_grad_(td[k].is_floating_point())
              for k in ["x", *HIDDEN_KEYS[cell], "is_init"]}
    assert not any(t.is_contiguous() for t in leaves.values())
    out = module(TensorDict(dict(leaves), [3, 2]))
    got = [out["y"], *(out["next", k] for k in HIDDEN_KEYS[cell])]
    assert seen["step"]["layout"] is module._layout, "the module's step did not pass its checked layout"
    rnn = torch_rnn(module)
    states = [leaves[k] for k in HIDDEN_KEYS[cell]]
    y, hn = nn_step(rnn, leaves["x"], leaves["is_init"], states)
    for name, a, b in zip(["y", *HIDDEN_KEYS[cell]], got, [y, *hn]):
        torch.testing.assert_close(a, b, msg=lambda m, name=name: f"{name}: {m}")
    inputs = [leaves["x"], *states, *module.parameters()]
    ours = torch.autograd.grad(weighted_sum(got), inputs)
    theirs = torch.autograd.grad(weighted_sum([y, *hn]), inputs)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        torch.testing.assert_close(a, b, msg=lambda m, i=i: f"gradient of input {i}: {m}")


def test_kwargs_call_through_dispatch():
    module = rf.GRUModule(3, 4, in_key="obs", out_key="out")
    out, h = module(obs=torch.randn(2, 3), is_init=torch.ones(2, 1, dtype=torch.bool))
    assert out.shape == (2, 4) and h.shape == (2, 1, 4)


@pytest.mark.parametrize("extra", [((), {"tensordict_out": None}), ((1,), {}), ((), {"obs": torch.zeros(2, 3)})])
def test_tensordict_call_with_more_arguments_names_forward(extra):
    """``module(td, tensordict_out=...)`` (a TensorDictModule habit): TorchRL raises a TypeError naming ``forward``;
    ours names it too, with what the call takes, not a private method."""
    module = rf.GRUModule(3, 4, in_key="obs", out_key="out")
    args, kwargs = extra
    with pytest.raises(TypeError, match=r"^GRUModule\.forward\(\) takes a TensorDict alone, or the in_keys' tensors"):
        module(TensorDict({"obs": torch.zeros(2, 3)}, [2]), *args, **kwargs)


def test_import_does_not_load_torchrl():
    code = "import sys, rnn_functional; assert 'torchrl' not in sys.modules, 'torchrl imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_make_cudnn_based_refuses_recompute_full():
    module = make_module("lstm", recurrent_recompute="full")
    with pytest.raises(ValueError, match=r"make_cudnn_based\(\): recurrent_recompute='full' cannot be served"):
        module.make_cudnn_based()


@pytest.mark.parametrize("recurrent", [False, True], ids=["step", "recurrent"])
@pytest.mark.parametrize("swap", ["projected_lstm_hidden_6", "gru_weights_in_lstm"])
def test_swapped_weights_whose_rows_divide_by_the_hidden_size_are_refused(swap, recurrent):
    """Weights swapped in (``TensorDict.to_module``) whose ``weight_hh`` row count is a multiple of the module's
    hidden size: a projected LSTM's of hidden size 6 for one of 4 (``[24, P]``), or a GRU's (``[3H, H]``, the same
    keys) for an LSTM's. The module's check of its bound layout compared the rows modulo the hidden size: the step ran
    on them and wrote a state of the wrong width, the sequence failed inside a kernel. Now a clear error: the module's
    sizes against the weights', or the key whose shape does not fit an LSTM."""
    from tensordict import TensorDict

    module = rf.LSTMModule(3, 4, proj_size=2 if swap.startswith("projected") else 0, in_key="x", out_key="y",
                           default_recurrent_mode=recurrent)
    params = rf.init_lstm_params(3, 6, proj_size=2) if swap.startswith("projected") else rf.init_gru_params(3, 4)
    lead = (2, 3) if recurrent else (2,)
    td = TensorDict({"x": torch.randn(*lead, 3), "is_init": torch.zeros(*lead, 1, dtype=torch.bool)}, lead)
    module(td.clone())  # the bound layout in use
    with TensorDict({"lstm": params}).to_module(module), \
            pytest.raises(ValueError, match=r"weights are for .*but the module is built for|params\['weight_hh_l0'\]: "
                                            r"expected shape \[12, 3\] for LSTM.*got \[12, 4\]. Are these params of another cell"):
        module(td.clone())


def test_weights_of_another_size_name_the_sizes_in_recurrent_mode():
    """Weights swapped in for a module of another size (TensorDict.to_module): a clear error naming both sizes,
    not a matmul shape error from inside the kernel."""
    from tensordict import TensorDict

    module = make_module("lstm", default_recurrent_mode=True)
    other = make_module("lstm", input_size=6)
    td = make_td("lstm", (2, 3))
    TensorDict.from_module(other).to_module(module)
    with pytest.raises(ValueError, match=r"weights are for .*but the module is built for"):
        module(td)
