"""``LSTMNet`` against TorchRL's (``torchrl.testing.modules.LSTMNet``) with identical weights,
against ``torch.nn`` with ``proj_size`` (which TorchRL's cannot run), and under compile/vmap.

Float64, ``assert_close`` defaults, outputs and gradients.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rnn_functional import LSTMNet

torchrl_modules = pytest.importorskip("torchrl.testing.modules")

F64 = torch.float64
B, T, F, E, H, OUT = 4, 5, 3, 6, 5, 7  # E: MLP width = LSTM input size


def _pair(lstm_kwargs: dict, mlp_kwargs: dict, lstm_backend=None, seed: int = 0):
    """Ours and TorchRL's LSTMNet holding the same float64 weights (TorchRL's lazy layers materialised)."""
    torch.manual_seed(seed)
    theirs = torchrl_modules.LSTMNet(OUT, dict(lstm_kwargs), dict(mlp_kwargs))
    theirs(torch.zeros(1, F))  # materialise the lazy layers
    ours = LSTMNet(OUT, dict(lstm_kwargs), {"in_features": F, **mlp_kwargs}, lstm_backend=lstm_backend)
    ours.load_state_dict(theirs.state_dict())
    return ours.to(F64).eval(), theirs.to(F64).eval()


def _grads(outputs, leaves):
    g = torch.Generator().manual_seed(5)
    loss = sum((o * torch.randn(o.shape, dtype=F64, generator=g)).sum() for o in outputs)
    return torch.autograd.grad(loss, leaves)


def _compare(ours, theirs, *inputs):
    leaves_o = [*(i for i in inputs if i is not None), *ours.parameters()]
    leaves_t = [*(i for i in inputs if i is not None), *theirs.parameters()]
    out_o, out_t = ours(*inputs), theirs(*inputs)
    assert len(out_o) == len(out_t) == 5
    for a, b in zip(out_o, out_t):
        torch.testing.assert_close(a, b)
    for a, b in zip(_grads(out_o, leaves_o), _grads(out_t, leaves_t)):
        torch.testing.assert_close(a, b)
    return out_o


MLPS = [
    {"out_features": E},
    {"out_features": E, "num_cells": [8, 9], "activation_class": nn.ReLU, "activate_last_layer": True},
    {"out_features": E, "depth": 1, "num_cells": 4, "activation_class": nn.ELU, "activation_kwargs": {"alpha": 0.5},
     "bias_last_layer": False},
]


@pytest.mark.parametrize("lstm_backend", [None, "torchrl"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("mlp", range(len(MLPS)))
def test_matches_torchrl(mlp, layers, lstm_backend):
    """Sequences (with and without given hiddens), batched and unbatched single steps."""
    ours, theirs = _pair({"input_size": E, "hidden_size": H, "num_layers": layers}, MLPS[mlp], lstm_backend)
    assert [type(m) for m in ours.mlp] == [type(m) for m in theirs.mlp]
    g = torch.Generator().manual_seed(1)

    def rand(*shape):
        return torch.randn(*shape, dtype=F64, generator=g, requires_grad=True)

    out = _compare(ours, theirs, rand(B, T, F))
    assert out[0].shape == (B, T, OUT) and out[3].shape == (B, T, layers, H)
    assert not out[3][:, :-1].any() and not out[4][:, :-1].any()  # zeros before the last step
    _compare(ours, theirs, rand(B, T, F), rand(B, T, layers, H), rand(B, T, layers, H))
    out = _compare(ours, theirs, rand(B, F), rand(B, layers, H), rand(B, layers, H))
    assert out[0].shape == (B, OUT) and out[3].shape == (B, layers, H)
    _compare(ours, theirs, rand(B, F))
    out = _compare(ours, theirs, rand(F), rand(layers, H), rand(layers, H))
    assert out[0].shape == (OUT,) and out[4].shape == (layers, H)


def test_proj_size_matches_torch_nn():
    """With proj_size (TorchRL's LSTMNet builds h of width H and fails): MLP -> nn.LSTM -> head."""
    torch.manual_seed(0)
    net = LSTMNet(OUT, {"input_size": E, "hidden_size": H, "num_layers": 2, "proj_size": 2},
                  {"in_features": F, "out_features": E}).to(F64)
    lstm = nn.LSTM(E, H, 2, proj_size=2, batch_first=True, dtype=F64)
    lstm.load_state_dict({k.removeprefix("lstm."): v for k, v in net.state_dict().items() if k.startswith("lstm.")})
    g = torch.Generator().manual_seed(2)
    x = torch.randn(B, T, F, dtype=F64, generator=g, requires_grad=True)
    h0 = torch.randn(B, T, 2, 2, dtype=F64, generator=g, requires_grad=True)
    c0 = torch.randn(B, T, 2, H, dtype=F64, generator=g, requires_grad=True)
    y, _, _, h, c = net(x, h0, c0)
    y_nn, (h_nn, c_nn) = lstm(net.mlp(x), (h0[:, 0].transpose(0, 1).contiguous(), c0[:, 0].transpose(0, 1).contiguous()))
    ours = [y, h[:, -1], c[:, -1]]
    theirs = [net.linear(y_nn), h_nn.transpose(0, 1), c_nn.transpose(0, 1)]
    names = [n for n, _ in net.lstm.named_parameters()]
    leaves_ours = [x, h0, c0, *(getattr(net.lstm, n) for n in names)]
    leaves_theirs = [x, h0, c0, *(getattr(lstm, n) for n in names)]
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b)
    for a, b in zip(_grads(ours, leaves_ours), _grads(theirs, leaves_theirs)):
        torch.testing.assert_close(a, b)
    step = net(x[:, 0], h0[:, 0], c0[:, 0])  # a single step feeds the projected h back
    torch.testing.assert_close(step[0], y[:, 0])


def test_dropout_between_layers_in_training_only():
    torch.manual_seed(0)
    net = LSTMNet(OUT, {"input_size": E, "hidden_size": H, "num_layers": 2, "dropout": 0.5},
                  {"in_features": F, "out_features": E}, lstm_backend="reference").to(F64)
    x = torch.randn(B, T, F, dtype=F64)
    torch.testing.assert_close(net.eval()(x)[0], net(x)[0])
    assert not torch.allclose(net.train()(x)[0], net.eval()(x)[0])


def test_bad_arguments():
    good_lstm, good_mlp = {"input_size": E, "hidden_size": H}, {"in_features": F, "out_features": E}
    with pytest.raises(ValueError, match="batch-first"):
        LSTMNet(OUT, {**good_lstm, "batch_first": False}, good_mlp)
    with pytest.raises(ValueError, match="bidirectional"):
        LSTMNet(OUT, {**good_lstm, "bidirectional": True}, good_mlp)
    with pytest.raises(TypeError, match="unsupported mlp_kwargs \\['layer_class'\\]"):
        LSTMNet(OUT, good_lstm, {**good_mlp, "layer_class": nn.Linear})
    with pytest.raises(ValueError, match="lstm_backend"):
        LSTMNet(OUT, good_lstm, good_mlp, lstm_backend="cudnn")
    net = LSTMNet(OUT, good_lstm, good_mlp)
    with pytest.raises(RuntimeError, match="both hidden0_in and hidden1_in or neither"):  # TorchRL's class
        net(torch.zeros(B, T, F), torch.zeros(B, T, 1, H))
    with pytest.raises(ValueError, match=rf"hidden1_in must have shape \[{B}, {T}, 1, {H}\]"):
        net(torch.zeros(B, T, F), torch.zeros(B, T, 1, H), torch.zeros(B, 1, H))
    with pytest.raises(ValueError, match="input must be"):
        net(torch.zeros(2, B, T, F))


def test_compile_fullgraph_and_vmap_ensemble():
    """torch.compile(fullgraph=True) of a sequence call (``aot_eager``: the capture; the default Inductor compile of
    an ``LSTMNet`` is compile_tests/test_compile_as_called.py::test_default_compile_lstm_net), and a 2-member
    ensemble under torch.vmap."""
    torch._dynamo.reset()
    kwargs = ({"input_size": E, "hidden_size": H, "proj_size": 3}, {"in_features": F, "out_features": E})
    torch.manual_seed(0)
    nets = [LSTMNet(OUT, *kwargs).to(F64) for _ in range(2)]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(B, T, F, dtype=F64, generator=g)
    expected = [n(x) for n in nets]

    compiled = torch.compile(nets[0], fullgraph=True, backend="aot_eager")
    for a, b in zip(compiled(x), expected[0]):
        torch.testing.assert_close(a, b)

    params, buffers = torch.func.stack_module_state(nets)

    def member(p, b, x):
        return torch.func.functional_call(nets[0], (p, b), (x,))

    batched = torch.vmap(member, in_dims=(0, 0, None))(params, buffers, x)
    for i in range(2):
        for a, b in zip(batched, expected[i]):
            torch.testing.assert_close(a[i], b)
