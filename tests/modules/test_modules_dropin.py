"""TorchRL drop-in contract: ``module.lstm``/``module.gru`` is a real ``torch.nn`` RNN holding the
module's weights, every way of reaching those weights changes what the forward computes, the
exception classes match TorchRL's, TensorDict errors name the key, and compiled policies do
not graph-break. Oracles are ``torch.nn.LSTM``/``GRU`` loaded with the expected weights (fp64,
``assert_close`` defaults)."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys

import pytest
import torch
from module_helpers import HIDDEN_KEYS, make_module, make_td, nn_recurrent
from tensordict import TensorDict
from torch import nn

import rnn_functional as rf

NN_CLASS = {"lstm": nn.LSTM, "gru": nn.GRU}
LAYERS = 2


def _oracle_y(cell: str, state_dict: dict, td: TensorDict) -> torch.Tensor:
    """Recurrent-mode output of a fresh ``torch.nn`` RNN loaded with ``state_dict`` (``lstm.``-free names)."""
    rnn = NN_CLASS[cell](4, 5, LAYERS, batch_first=True, dtype=torch.float64)
    rnn.load_state_dict(state_dict)
    y, _ = nn_recurrent(rnn, td["x"], td["is_init"].squeeze(-1), [td[k] for k in HIDDEN_KEYS[cell]])
    return y


def _recurrent_y(module, td: TensorDict) -> torch.Tensor:
    with rf.set_recurrent_mode(True):
        return module(td.clone())["y"]


def _child_weights(module, cell: str) -> dict:
    return {k: v.detach().clone() for k, v in getattr(module, cell).state_dict().items()}


# ----------------------------------------------------------------------------- the child


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_child_is_a_real_nn_rnn_holding_the_same_parameters(cell):
    module = make_module(cell, layers=LAYERS)
    child = getattr(module, cell)
    assert type(child) is NN_CLASS[cell] and child.batch_first
    assert (child.input_size, child.hidden_size, child.num_layers) == (4, 5, LAYERS)
    assert [p for p in module.parameters()] == [p for p in child.parameters()]  # one set of weights
    assert set(module.state_dict()) == {f"{cell}.{k}" for k in NN_CLASS[cell](4, 5, LAYERS).state_dict()}
    # the forward reads exactly these Parameter objects: an in-place edit shows up in its output
    td = make_td(cell, (2, 5), layers=LAYERS, seed=1)
    with torch.no_grad():
        child.weight_hh_l1.mul_(-0.5)
    torch.testing.assert_close(_recurrent_y(module, td), _oracle_y(cell, _child_weights(module, cell), td))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_calling_the_child_equals_the_forward(cell):
    module = make_module(cell, layers=LAYERS)
    td = make_td(cell, (3, 6), layers=LAYERS, reset_prob=0.0, stored="zeros", seed=2)
    td["is_init"][:, 0] = True
    with rf.set_recurrent_mode(True):
        out = module(td.clone())
    y, final = getattr(module, cell)(td["x"])  # torch.nn's own call: zeros in, batch_first
    final = final if isinstance(final, tuple) else (final,)
    torch.testing.assert_close(out["y"], y)
    for key, state in zip(HIDDEN_KEYS[cell], final):  # [L, B, S] -> the last step's [B, L, S]
        torch.testing.assert_close(out["next", key][:, -1], state.transpose(0, 1))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_given_child_is_kept(cell):
    rnn = NN_CLASS[cell](4, 5, LAYERS, batch_first=True, dtype=torch.float64)
    cls = rf.LSTMModule if cell == "lstm" else rf.GRUModule
    module = cls(**{cell: rnn}, in_keys=["x", *HIDDEN_KEYS[cell]], out_keys=["y", *[("next", k) for k in HIDDEN_KEYS[cell]]])
    assert getattr(module, cell) is rnn
    td = make_td(cell, (2, 5), layers=LAYERS, seed=3)
    torch.testing.assert_close(_recurrent_y(module, td), _oracle_y(cell, rnn.state_dict(), td))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_kernel_switches_keep_an_nn_rnn(cell):
    module = make_module(cell, layers=LAYERS, default_recurrent_mode=True)
    child = getattr(module, cell)
    td = make_td(cell, (2, 5), layers=LAYERS, seed=4)
    expected = _oracle_y(cell, _child_weights(module, cell), td)
    for switch in (module.make_python_based, module.make_cudnn_based, module.make_python_based):
        assert switch() is module
        assert getattr(module, cell) is child and isinstance(child, NN_CLASS[cell])
        torch.testing.assert_close(module(td.clone())["y"], expected)
    assert module.python_based


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_python_based_child_is_torchrl_python_rnn_when_torchrl_is_loaded(cell):
    trm = pytest.importorskip("torchrl.modules")
    trl_class = trm.LSTM if cell == "lstm" else trm.GRU
    module = make_module(cell, layers=LAYERS)
    child = getattr(module, cell)
    module.make_python_based()
    assert isinstance(child, trl_class) and isinstance(child, NN_CLASS[cell])
    td = make_td(cell, (2, 5), layers=LAYERS, reset_prob=0.0, seed=5)
    y_python, _ = child(td["x"])  # TorchRL's Python loop
    y_nn, _ = NN_CLASS[cell].forward(child, td["x"])
    torch.testing.assert_close(y_python, y_nn)
    restored = pickle.loads(pickle.dumps(module))
    assert type(getattr(restored, cell)) is type(child)
    torch.testing.assert_close(_recurrent_y(restored, td), _recurrent_y(module, td))
    module.make_cudnn_based()
    assert type(child) is NN_CLASS[cell]
    built = (rf.LSTMModule if cell == "lstm" else rf.GRUModule)(4, 5, python_based=True, in_key="x", out_key="y")
    assert isinstance(getattr(built, cell), trl_class)


# ----------------------------------------------------------------------------- routes to the weights


def _double(weights: dict) -> dict:
    return {k: 2 * v for k, v in weights.items()}


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_to_module_reaches_the_forward(cell):
    module = make_module(cell, layers=LAYERS)
    td = make_td(cell, (2, 5), layers=LAYERS, seed=6)
    original = _child_weights(module, cell)
    params = TensorDict.from_module(module)
    assert set(params.keys(True, True)) == {(cell, k) for k in original}
    doubled = params.apply(lambda p: 2 * p.detach())
    with doubled.to_module(module):
        torch.testing.assert_close(_recurrent_y(module, td), _oracle_y(cell, _double(original), td))
        fresh = NN_CLASS[cell](4, 5, LAYERS, batch_first=True, dtype=torch.float64)
        fresh.load_state_dict(_double(original))
        torch.testing.assert_close(getattr(module, cell)(td["x"])[0], fresh(td["x"])[0])  # the child sees it too
    torch.testing.assert_close(_recurrent_y(module, td), _oracle_y(cell, original, td))  # the swap was undone
    doubled.to_module(module)  # permanent swap
    torch.testing.assert_close(_recurrent_y(module, td), _oracle_y(cell, _double(original), td))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_functional_call_reaches_the_forward(cell):
    module = make_module(cell, layers=LAYERS)
    td = make_td(cell, (2, 5), layers=LAYERS, seed=7)
    original = _child_weights(module, cell)
    swapped = {f"{cell}.{k}": v for k, v in _double(original).items()}
    with rf.set_recurrent_mode(True):
        y = torch.func.functional_call(module, swapped, (td.clone(),))["y"]
    torch.testing.assert_close(y, _oracle_y(cell, _double(original), td))
    torch.testing.assert_close(_recurrent_y(module, td), _oracle_y(cell, original, td))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_vmap_over_stacked_params_reaches_the_forward(cell):
    module = make_module(cell, layers=LAYERS)
    td = make_td(cell, (2, 5), layers=LAYERS, seed=8)
    original = _child_weights(module, cell)
    params = TensorDict.from_module(module).detach()
    stacked = torch.stack([params, params.apply(lambda p: 2 * p), params.apply(lambda p: -p)])

    def member(p, data):
        with p.to_module(module), rf.set_recurrent_mode(True):
            return module(data.clone())["y"]

    ys = torch.vmap(member, (0, None))(stacked, td)
    for y, scale in zip(ys, (1, 2, -1)):
        torch.testing.assert_close(y, _oracle_y(cell, {k: scale * v for k, v in original.items()}, td))


@pytest.mark.parametrize("route", ["deepcopy", "pickle"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_copies_read_their_own_weights(cell, route):
    module = make_module(cell, layers=LAYERS)
    td = make_td(cell, (2, 5), layers=LAYERS, seed=9)
    original = _child_weights(module, cell)
    clone = copy.deepcopy(module) if route == "deepcopy" else pickle.loads(pickle.dumps(module))
    clone_child = getattr(clone, cell)
    assert clone_child.weight_ih_l0 is not getattr(module, cell).weight_ih_l0
    with torch.no_grad():
        for p in clone_child.parameters():
            p.mul_(2)  # only the copy's weights change
    torch.testing.assert_close(_recurrent_y(clone, td), _oracle_y(cell, _double(original), td))
    torch.testing.assert_close(_recurrent_y(module, td), _oracle_y(cell, original, td))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_dtype_moves_and_state_dicts_reach_the_forward(cell):
    module = make_module(cell, layers=LAYERS, dtype=torch.float32)
    td = make_td(cell, (2, 5), layers=LAYERS, seed=10)
    module.double()  # .to() replaces the parameters' data (or the Parameters) in the child's dict
    assert all(p.dtype == torch.float64 for p in module.parameters())
    y = _recurrent_y(module, td)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, _oracle_y(cell, _child_weights(module, cell), td))
    target = _double(_child_weights(module, cell))
    getattr(module, cell).load_state_dict(target)
    torch.testing.assert_close(_recurrent_y(module, td), _oracle_y(cell, target, td))
    module.load_state_dict({f"{cell}.{k}": -v for k, v in target.items()}, assign=True)
    torch.testing.assert_close(_recurrent_y(module, td), _oracle_y(cell, {k: -v for k, v in target.items()}, td))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_assigning_a_new_child_rebinds_the_forward(cell):
    module = make_module(cell, layers=LAYERS)
    td = make_td(cell, (2, 5), layers=LAYERS, seed=11)
    new = NN_CLASS[cell](4, 5, LAYERS, batch_first=True, dtype=torch.float64)
    setattr(module, cell, new)
    torch.testing.assert_close(_recurrent_y(module, td), _oracle_y(cell, new.state_dict(), td))


# ----------------------------------------------------------------------------- constructor errors

_LSTM_KEYS = dict(in_keys=["obs", "h0", "h1"], out_keys=["out", ("next", "h0"), ("next", "h1")])
_GRU_KEYS = dict(in_keys=["obs", "h"], out_keys=["out", ("next", "h")])
# (cell, constructor kwargs, exception class TorchRL raises): the cases of TorchRL's test_errs
CONSTRUCTOR_ERRORS = [
    ("lstm", dict(batch_first=False, **_LSTM_KEYS), ValueError),
    ("lstm", dict(in_keys=["obs", "h0"], out_keys=_LSTM_KEYS["out_keys"]), ValueError),
    ("lstm", dict(in_keys="abc", out_keys=_LSTM_KEYS["out_keys"]), TypeError),
    ("lstm", dict(in_key="x", in_keys=["obs", "h0"], out_keys=_LSTM_KEYS["out_keys"]), ValueError),
    ("lstm", dict(in_keys=_LSTM_KEYS["in_keys"], out_keys=["out", ("next", "h0")]), ValueError),
    ("lstm", dict(in_keys=_LSTM_KEYS["in_keys"], out_keys="abc"), TypeError),
    ("lstm", dict(in_keys=_LSTM_KEYS["in_keys"], out_key="y", out_keys=["out", ("next", "h0")]), ValueError),
    ("lstm", dict(recurrent_backend="other", **_LSTM_KEYS), ValueError),
    ("gru", dict(batch_first=False, **_GRU_KEYS), ValueError),
    ("gru", dict(in_keys=["obs", "h0", "h1"], out_keys=_GRU_KEYS["out_keys"]), ValueError),
    ("gru", dict(in_keys="abc", out_keys=_GRU_KEYS["out_keys"]), TypeError),
    ("gru", dict(in_keys=_GRU_KEYS["in_keys"], out_keys=["out", ("next", "h"), "other"]), ValueError),
    ("gru", dict(in_keys=_GRU_KEYS["in_keys"], out_keys="abc"), TypeError),
    ("gru", dict(in_keys=_GRU_KEYS["in_keys"], out_key="y", out_keys=["out", ("next", "h")]), ValueError),
]


@pytest.mark.parametrize("cell,kwargs,exc", CONSTRUCTOR_ERRORS)
def test_constructor_exception_classes_match_torchrl(cell, kwargs, exc):
    cls = rf.LSTMModule if cell == "lstm" else rf.GRUModule
    with pytest.raises(Exception) as ours:
        cls(3, 12, **kwargs)
    assert type(ours.value) is exc, ours.value
    try:
        import torchrl.modules as trm
    except ImportError:
        return
    with pytest.raises(Exception) as theirs:
        (trm.LSTMModule if cell == "lstm" else trm.GRUModule)(3, 12, **kwargs)
    assert type(theirs.value) is type(ours.value)


def test_key_type_error_names_the_fix():
    with pytest.raises(TypeError, match=r"in_keys must be a list or tuple of 3 keys .* Use in_key='abc'"):
        rf.LSTMModule(3, 12, in_keys="abc", out_key="y")


# ----------------------------------------------------------------------------- TensorDict errors


def _bad_td_message(module, td, exc, recurrent):
    with pytest.raises(exc) as info, rf.set_recurrent_mode(recurrent):
        module(td)
    return str(info.value)


@pytest.mark.parametrize("recurrent", [False, True], ids=["sequential", "recurrent"])
def test_missing_input_key_is_named(recurrent):
    module = rf.LSTMModule(4, 5, in_key="obs", out_key="y")
    td = TensorDict({"observation": torch.randn(2, 3, 4), "is_init": torch.zeros(2, 3, 1, dtype=torch.bool)}, [2, 3])
    msg = _bad_td_message(module, td, KeyError, recurrent)
    assert "'obs' not found" in msg and "'observation'" in msg and "in_key=" in msg


def test_missing_one_hidden_key_is_named():
    module = make_module("lstm")
    td = make_td("lstm", (2, 3))
    msg = _bad_td_message(module, td.exclude("c"), RuntimeError, True)
    assert "['c'] are missing" in msg and "provide all of ['h', 'c']" in msg


@pytest.mark.parametrize("recurrent", [False, True], ids=["sequential", "recurrent"])
def test_hidden_without_layer_dim_is_named(recurrent):
    module = make_module("gru")
    td = make_td("gru", (2, 3))
    td = td.set("h", td["h"].squeeze(-2))  # [B, T, H] instead of [B, T, L, H]
    msg = _bad_td_message(module, td, ValueError, recurrent)
    assert "hidden state key 'h' holds shape [2, 3, 5]" in msg
    assert "expected [2, 3, 1, 5]" in msg
    assert "td['h'] = td['h'].unsqueeze(-2)" in msg


def test_hidden_of_wrong_width_is_named():
    module = make_module("lstm", layers=2)
    td = make_td("lstm", (2, 3), layers=2)
    td = td.set("c", torch.zeros(2, 3, 2, 7, dtype=torch.float64))
    msg = _bad_td_message(module, td, ValueError, True)
    assert "'c' holds shape [2, 3, 2, 7]" in msg and "expected [2, 3, 2, 5]" in msg and "make_tensordict_primer" in msg


def test_is_init_of_wrong_dtype_is_named():
    module = make_module("gru")
    td = make_td("gru", (2, 3))
    td = td.set("is_init", td["is_init"].float())
    msg = _bad_td_message(module, td, TypeError, True)
    assert "'is_init' holds dtype torch.float32" in msg and "expected torch.bool" in msg and ".bool()" in msg


@pytest.mark.parametrize("recurrent", [False, True], ids=["sequential", "recurrent"])
def test_is_init_of_wrong_shape_is_named(recurrent):
    module = make_module("lstm")
    td = make_td("lstm", (2, 3))
    td = td.set("is_init", torch.zeros(2, 3, 2, dtype=torch.bool))
    msg = _bad_td_message(module, td, ValueError, recurrent)
    assert "'is_init' holds shape [2, 3, 2]" in msg and "expected [2, 3, 1] or [2, 3]" in msg


def test_input_of_wrong_width_is_named():
    module = make_module("lstm")
    td = make_td("lstm", (2, 3), input_size=6)
    msg = _bad_td_message(module, td, ValueError, True)
    assert "input key 'x' holds shape [2, 3, 6]" in msg and "input_size=4" in msg


# ----------------------------------------------------------------------------- compile


@pytest.mark.parametrize("python_based", [False, True], ids=["default", "python_based"])
@pytest.mark.parametrize("recurrent", [False, True], ids=["sequential", "recurrent"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_no_graph_break_in_either_mode(cell, recurrent, python_based):
    """torch._dynamo.explain of the module's call: one graph, no break (the child is never touched)."""
    torch._dynamo.reset()
    module = make_module(cell, layers=LAYERS, dtype=torch.float32, python_based=python_based)
    td = make_td(cell, (2, 5) if recurrent else (3,), layers=LAYERS, dtype=torch.float32, seed=12)

    def run(data):
        with rf.set_recurrent_mode(recurrent):
            return module(data)

    explained = torch._dynamo.explain(run)(td.clone())
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons


def test_python_based_module_unpickles_in_a_fresh_process(tmp_path):
    pytest.importorskip("torchrl.modules")
    module = make_module("lstm", layers=LAYERS).make_python_based()
    path = tmp_path / "module.pt"
    path.write_bytes(pickle.dumps(module))
    code = (
        "import pickle, sys, torch; from torch import nn; import torchrl.modules as trm; "
        f"m = pickle.loads(open({str(path)!r}, 'rb').read()); "
        "assert isinstance(m.lstm, nn.LSTM) and isinstance(m.lstm, trm.LSTM), type(m.lstm); "
        "assert m._weights is m.lstm._parameters"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_lstm_net_child_is_an_nn_lstm_and_matches_calling_it():
    net = rf.LSTMNet(3, {"input_size": 6, "hidden_size": 5, "num_layers": LAYERS}, {"in_features": 4, "out_features": 6},
                     lstm_backend="scan").double()
    assert type(net.lstm) is nn.LSTM
    x = torch.randn(2, 7, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(13))
    _, _, _, h, c = net(x)
    _, (h_nn, c_nn) = net.lstm(net.mlp(x))
    torch.testing.assert_close(h[:, -1], h_nn.transpose(0, 1))  # the final state at the last step
    torch.testing.assert_close(c[:, -1], c_nn.transpose(0, 1))
    assert not h[:, :-1].any() and not c[:, :-1].any()  # zeros before it
