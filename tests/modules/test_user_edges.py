"""Edges users hit one step off the main road: ensembles copied or built twice from one template, data
collected under ``torch.inference_mode()`` then trained on, weights of another size swapped in, an empty
sequence through ``LSTMNet``. Each test failed before its fix."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential

import rnn_functional as rf
from module_helpers import make_module, make_td


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_ensemble_deepcopies(cell):
    ens = rf.EnsembleModule(make_module(cell), 3)
    clone = copy.deepcopy(ens)
    td = make_td(cell, (2, 4))
    with rf.set_recurrent_mode(True):
        torch.testing.assert_close(clone(td.clone())["y"], ens(td.clone())["y"])
        with torch.no_grad():
            next(clone.parameters()).add_(1.0)  # the copy owns its members
        assert not torch.equal(clone(td.clone())["y"], ens(td.clone())["y"])


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_building_an_ensemble_leaves_the_template_unchanged(cell):
    template = make_module(cell)
    before = {k: (v, v.clone()) for k, v in template.state_dict(keep_vars=True).items()}
    td = make_td(cell, (2, 4))
    with rf.set_recurrent_mode(True):
        want = template(td.clone())["y"]
        first, second = rf.EnsembleModule(template, 2), rf.EnsembleModule(template, 3)
        assert second(td.clone())["y"].shape == (3, 2, 4, 5)
        assert first(td.clone())["y"].shape == (2, 2, 4, 5)
        torch.testing.assert_close(template(td.clone())["y"], want)
    for k, v in template.state_dict(keep_vars=True).items():
        assert v is before[k][0] and v.device.type == "cpu"
        torch.testing.assert_close(v, before[k][1])


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("backend", ["auto", "reference", "scan", "pad"])
@pytest.mark.parametrize("recurrent", [False, True])
def test_inference_mode_inputs_train_like_normal_ones(cell, backend, recurrent):
    """Rollouts collected under ``torch.inference_mode()`` then trained on: ``nn.LSTM``/``GRU`` and TorchRL accept
    them; the gradients equal those of the same data as normal tensors."""
    module = make_module(cell, recurrent_backend=backend)
    td = make_td(cell, (3, 6))
    with torch.inference_mode():
        frozen = td.clone()
    assert frozen["x"].is_inference()
    params = list(module.parameters())
    grads = []
    for data in (frozen, td):
        with rf.set_recurrent_mode(recurrent):
            out = module(data if recurrent else data[:, 0])
        grads.append(torch.autograd.grad(out["y"].sum(), params))
    torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.parametrize("fn", ["sequence", "step"])
def test_inference_mode_inputs_train_through_the_functions(fn):
    params = rf.init_gru_params(3, 4, dtype=torch.float64).apply(lambda t: t.requires_grad_(True))
    with torch.inference_mode():
        x = torch.randn(2, 5, 3, dtype=torch.float64)
        h = torch.randn(2, 1, 4, dtype=torch.float64)
        is_init = torch.tensor([[False, False, True, False, False], [False, True, False, False, True]])
        reset = torch.randn(2, 5, 1, 4, dtype=torch.float64)
    if fn == "sequence":
        y, _ = rf.gru_sequence(x, h, params, is_init=is_init, reset_state=reset)
        want, _ = rf.gru_sequence(x.clone(), h.clone(), params, is_init=is_init.clone(), reset_state=reset.clone())
    else:
        y, _ = rf.gru_step(x[:, 0], h, params, is_init=is_init[:, 1])
        want, _ = rf.gru_step(x[:, 0].clone(), h.clone(), params, is_init=is_init[:, 1].clone())
    weights = list(params.values())
    torch.testing.assert_close(torch.autograd.grad(y.sum(), weights), torch.autograd.grad(want.sum(), weights))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("recurrent", [False, True])
@pytest.mark.parametrize("other", [{"input_size": 6}, {"hidden": 7}])
def test_weights_of_another_size_name_the_sizes_in_both_modes(cell, recurrent, other):
    module = make_module(cell)
    td = make_td(cell, (2, 3))
    with TensorDict.from_module(make_module(cell, **other)).to_module(module), rf.set_recurrent_mode(recurrent):
        with pytest.raises(ValueError, match=r"Module: the weights are for input_size=\d+, num_layers=1 and state "
                                             r"widths \[.*\], but the module is built for .*Load weights of the module's sizes"):
            module(td if recurrent else td[:, 0])
    with rf.set_recurrent_mode(recurrent):  # the module's own weights back: served again
        assert module(td if recurrent else td[:, 0])["y"].shape[-1] == 5


@pytest.mark.parametrize("backend", ["auto", "pad", "scan", "reference"])
def test_lstm_net_on_an_empty_sequence(backend):
    net = rf.LSTMNet(4, {"input_size": 3, "hidden_size": 5}, {"num_cells": [6], "out_features": 3}, lstm_backend=backend)
    x = torch.randn(2, 0, 3, requires_grad=True)
    out = net(x)
    assert [tuple(o.shape) for o in out] == [(2, 0, 4)] + [(2, 0, 1, 5)] * 4
    sum(o.sum() for o in out).backward()
    assert x.grad.shape == (2, 0, 3)


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_step_output_shares_no_memory_with_the_next_state(cell, layers, grad):
    """An in-place op on the step's output (``nn.ReLU(inplace=True)`` next in a policy) leaves the state carried to
    the next step as it was, as with TorchRL's module: the core's step returns the top layer's ``h`` as ``y`` and in
    the state, the module a copy."""
    module = make_module(cell, layers=layers)
    td = make_td(cell, (3,), layers=layers)
    with torch.set_grad_enabled(grad):
        out = module(td.clone())
        keys = [("next", k) for k in ["h", "c"][: len(module.out_keys) - 1]]
        states = [out[k].detach().clone() for k in keys]
        y_ptr = out["y"].untyped_storage().data_ptr()
        assert all(out[k].untyped_storage().data_ptr() != y_ptr for k in keys)
        policy = TensorDictSequential(module, TensorDictModule(torch.nn.ReLU(inplace=True), ["y"], ["z"]))
        out = policy(td.clone())
    assert (out["z"] >= 0).all() and out["y"].data_ptr() == out["z"].data_ptr()  # the ReLU ran in place on y
    for k, want in zip(keys, states):
        torch.testing.assert_close(out[k], want)


@pytest.mark.parametrize("module_class", [rf.LSTMModule, rf.GRUModule, rf.MinGRUModule, rf.RGLRUModule])
@pytest.mark.parametrize("batch", [(3, 0), (0,)], ids=["empty_time", "empty_flat"])
def test_recurrent_mode_on_an_empty_time_dim_with_stored_states(module_class, batch):
    """A batch with no steps that carries its stored states (a replay-buffer sample filtered to nothing) returns
    empty outputs, as it does without the state keys (it raised an IndexError from ``select``; TorchRL's does too)."""
    m = module_class(input_size=3, hidden_size=4, num_layers=2, in_key="obs", out_key="feat")
    hidden = m.in_keys[1:-1]
    td = TensorDict({"obs": torch.randn(*batch, 3), "is_init": torch.zeros(*batch, 1, dtype=torch.bool),
                     **{k: torch.zeros(*batch, 2, 4) for k in hidden}}, list(batch))
    with rf.set_recurrent_mode(True):
        out = m(td)
    assert out["feat"].shape == (*batch, 4)
    for key in hidden:
        assert out["next", key].shape == (*batch, 2, 4)
