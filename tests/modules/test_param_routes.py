"""Every route that swaps or re-creates a module's parameters leaves the eager module right.

The modules read their weights through a reference to the ``nn.LSTM``/``nn.GRU`` child's parameter
dict (``modules/_weights.py``). After each route below, an eager call must equal a fresh module
holding the same weights, and return real tensors. ``torch.export`` (non-strict) used to leave the
module returning ``FakeTensor``s: its attribute snapshot wrote back a copy of that reference taken
while the parameters were fake.
"""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from tensordict import TensorDict
from torch import nn

import rnn_functional as rf

F_IN, H, B = 3, 4, 2


def _module(cell: str, seed: int = 0):
    torch.manual_seed(seed)
    keys = ["h", "c"] if cell == "lstm" else ["h"]
    cls = rf.LSTMModule if cell == "lstm" else rf.GRUModule
    return cls(input_size=F_IN, hidden_size=H, in_keys=["x", *keys], out_keys=["y", *(("next", k) for k in keys)])


def _inputs(cell: str) -> dict:
    g = torch.Generator().manual_seed(1)
    keys = ["h", "c"] if cell == "lstm" else ["h"]
    data = {"x": torch.randn(B, F_IN, generator=g), "is_init": torch.tensor([[True], [False]])}
    data.update({k: torch.randn(B, 1, H, generator=g) for k in keys})
    return data


def _call(module, cell: str) -> list[torch.Tensor]:
    dtype = next(module.parameters()).dtype
    data = {k: v.to(dtype) if v.is_floating_point() else v for k, v in _inputs(cell).items()}
    out = module(TensorDict(data, batch_size=[B]))
    return [out["y"], *(out["next", k] for k in (["h", "c"] if cell == "lstm" else ["h"]))]


def _fresh_like(module, cell: str):
    """A new module holding ``module``'s current weights (copied as plain tensors)."""
    fresh = _module(cell, seed=123)
    fresh.load_state_dict({k: v.detach().clone() for k, v in module.state_dict().items()})
    return fresh.to(next(module.parameters()).dtype)


def _check(module, cell: str) -> None:
    got, want = _call(module, cell), _call(_fresh_like(module, cell), cell)
    for a, b in zip(got, want, strict=True):
        assert type(a) is torch.Tensor, f"the module returned a {type(a).__name__}"
        torch.testing.assert_close(a, b)


class _Policy(nn.Module):
    """Tensors in, tensors out (what export takes), our module inside (TensorDict built in forward)."""

    def __init__(self, module, cell):
        super().__init__()
        self.module, self.keys = module, ["h", "c"] if cell == "lstm" else ["h"]

    def forward(self, x, is_init, *hidden):
        td = TensorDict({"x": x, "is_init": is_init, **dict(zip(self.keys, hidden))}, batch_size=x.shape[:1])
        out = self.module(td)
        return out["y"], *(out["next", k] for k in self.keys)


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_export_leaves_the_module_intact(cell, strict):
    module = _module(cell)
    policy = _Policy(module, cell)
    data = _inputs(cell)
    args = (data["x"], data["is_init"], *(data[k] for k in policy.keys))
    before = policy(*args)
    exported = torch.export.export(policy, args, strict=strict)
    for a, b in zip(exported.module()(*args), before, strict=True):
        torch.testing.assert_close(a, b)
    after = policy(*args)
    for a, b in zip(after, before, strict=True):
        assert type(a) is torch.Tensor, f"after export the module returned a {type(a).__name__}"
        torch.testing.assert_close(a, b)
    _check(module, cell)


def _swap_functional_call(module, cell):
    new = {k: torch.randn_like(v) for k, v in module.state_dict().items()}
    got = torch.func.functional_call(module, new, (TensorDict(_inputs(cell), batch_size=[B]),))
    reference = _module(cell, seed=5)
    reference.load_state_dict(new)
    torch.testing.assert_close(got["y"], _call(reference, cell)[0])  # the call itself used the new weights
    return module  # and the module is back on its own weights


def _swap_to_module(module, cell):
    params = TensorDict.from_module(module)
    new = params.apply(lambda t: torch.randn_like(t))
    with new.to_module(module):
        torch.testing.assert_close(_call(module, cell)[0], _call(_fresh_like(module, cell), cell)[0])
    return module


def _load_state_dict_assign(module, cell):
    module.load_state_dict({k: torch.randn_like(v) for k, v in module.state_dict().items()}, assign=True)
    return module


def _double(module, cell):
    return module.double()


def _child(cell):
    """A new ``torch.nn`` child for the module (the child's attribute is the cell's name)."""
    return (nn.LSTM if cell == "lstm" else nn.GRU)(F_IN, H, batch_first=True)


def _new_child(module, cell):
    setattr(module, cell, _child(cell))
    return module


def _add_module(module, cell):  # writes the module dict without __setattr__; register_module calls it
    module.add_module(cell, _child(cell))
    return module


def _set_submodule(module, cell):
    module.set_submodule(cell, _child(cell))
    return module


def _module_dict_write(module, cell):  # as torch.ao.quantization's module swap writes a child: no hook sees it
    module._modules[cell] = _child(cell)
    return module


def _deepcopy(module, cell):
    return copy.deepcopy(module)


def _pickle(module, cell):
    buffer = io.BytesIO()
    pickle.dump(module, buffer)
    return pickle.loads(buffer.getvalue())


ROUTES = [_swap_functional_call, _swap_to_module, _load_state_dict_assign, _double, _new_child, _add_module,
          _set_submodule, _module_dict_write, _deepcopy, _pickle]


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.__name__.lstrip("_"))
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_parameter_routes_leave_the_module_right(cell, route):
    module = _module(cell)
    _call(module, cell)  # a call before the route
    _check(route(module, cell), cell)


@pytest.mark.parametrize("route", [_new_child, _add_module, _set_submodule], ids=lambda r: r.__name__.lstrip("_"))
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_a_compiled_module_computes_with_a_new_child(cell, route):
    """A new child assigned after the module was compiled: the compiled call re-reads its weights. Dynamo's guards
    and graph inputs decide that, so ``aot_eager`` (no Inductor code generation) runs the compiled call."""
    module = _module(cell)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    compiled(TensorDict(_inputs(cell), batch_size=[B]))
    route(module, cell)
    got = compiled(TensorDict(_inputs(cell), batch_size=[B]))["y"]
    torch.testing.assert_close(got, _call(_fresh_like(module, cell), cell)[0])


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_a_deleted_child_is_an_error_not_the_old_weights(cell):
    """``del module.lstm``: the call raises, naming the child; it does not compute with the weights bound before
    (TorchRL raises an ``AttributeError``)."""
    module = _module(cell)
    delattr(module, cell)
    with pytest.raises(RuntimeError, match=rf"module\.{cell} holding the weights was deleted"):
        module(TensorDict(_inputs(cell), batch_size=[B]))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_a_quantized_child_is_refused(cell):
    """``quantize_dynamic`` swaps in a child without float ``torch.nn`` parameters: the call says so, it does not
    compute with the float weights the module held before."""
    module = _module(cell)
    quantized = torch.ao.quantization.quantize_dynamic(module, {nn.LSTM, nn.GRU}, dtype=torch.qint8)
    with pytest.raises(TypeError, match=rf"{cell} must be a torch.nn.{cell.upper()} .*got torch.ao.nn.quantized"):
        quantized(TensorDict(_inputs(cell), batch_size=[B]))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_child_dropout_set_after_construction_takes_effect(compiled):
    """``module.lstm.dropout = p`` after construction changes what a training call drops, as with TorchRL's module
    (which calls its child); compiled, Dynamo guards on the value and recompiles."""
    torch.manual_seed(0)
    module = rf.LSTMModule(input_size=F_IN, hidden_size=H, num_layers=2, dropout=0.5, in_keys=["x", "h", "c"],
                           out_keys=["y", ("next", "h"), ("next", "c")]).train()
    data = TensorDict({"x": torch.randn(B, 6, F_IN), "is_init": torch.zeros(B, 6, 1, dtype=torch.bool)}, [B, 6])
    run = torch.compile(module, backend="eager") if compiled else module
    with rf.set_recurrent_mode(True):
        assert not torch.equal(run(data.clone())["y"], run(data.clone())["y"])  # p = 0.5: two calls differ
        module.lstm.dropout = 0.0
        got = run(data.clone())["y"]
        want = module.eval()(data.clone())["y"]
    torch.testing.assert_close(got, want)


def _weight_norm(child) -> list[torch.Tensor]:
    torch.nn.utils.parametrizations.weight_norm(child, "weight_hh_l0")
    return list(child.parametrizations.weight_hh_l0.parameters())


def _prune(child) -> list[torch.Tensor]:
    torch.nn.utils.prune.l1_unstructured(child, "weight_ih_l0", amount=0.5)
    return [child.weight_ih_l0_orig]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("how", [_weight_norm, _prune], ids=["weight_norm", "prune"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_weights_the_child_computes_are_used_as_it_computes_them(cell, how, compiled):
    """A parametrized (``weight_norm``) or pruned weight of the child (TorchRL's module runs both, calling its child):
    recurrent mode without resets equals the child's own forward, outputs and the gradients of the tensors behind
    the weight; the compiled module has no graph break (the parametrization is traced, the child is not)."""
    module = _module(cell).double()
    child = getattr(module, cell)
    leaves = how(child)
    x = torch.randn(B, 5, F_IN, dtype=torch.float64)
    data = TensorDict({"x": x, "is_init": torch.zeros(B, 5, 1, dtype=torch.bool)}, [B, 5])
    run = torch.compile(module, backend="eager", fullgraph=True) if compiled else module
    with rf.set_recurrent_mode(True):
        got = run(data)["y"]
    want = child(x)[0]
    torch.testing.assert_close(got, want)
    for a, b in zip(torch.autograd.grad(got.sum(), leaves), torch.autograd.grad(want.sum(), leaves), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("route", ["functional_call", "to_module"])
@pytest.mark.parametrize("backend", ["reference", "auto"])
@pytest.mark.parametrize("cls", [rf.GRUModule, rf.LSTMModule, rf.MinGRUModule])
def test_recompute_full_differentiates_the_swapped_in_weights(cls, backend, route):
    """``recurrent_recompute="full"`` recomputes chunks in the backward: with weights swapped in by
    ``functional_call`` / ``to_module`` (restored before the backward) it recomputed with the module's own, and the
    gradients of the given weights were wrong (about 1 on gradients of about 1), with no error. They equal
    ``recompute="none"``'s, in fp64."""
    g = torch.Generator().manual_seed(2)
    is_init = torch.zeros(B, 4, 1, dtype=torch.bool)
    is_init[0, 2] = True
    keys = cls(F_IN, H, in_key="x", out_key="y").in_keys[1:-1]
    td = TensorDict({"x": torch.randn(B, 4, F_IN, generator=g, dtype=torch.float64), "is_init": is_init,
                     **{k: torch.randn(B, 4, 1, H, generator=g, dtype=torch.float64) for k in keys}}, [B, 4])
    grads = []
    for recompute in ("full", "none"):
        torch.manual_seed(0)
        m = cls(F_IN, H, in_key="x", out_key="y", recurrent_backend=backend, recurrent_recompute=recompute).double()
        given = {n: (v.detach() + 0.3 * torch.randn(v.shape, generator=torch.Generator().manual_seed(3),
                                                      dtype=v.dtype)).requires_grad_() for n, v in m.named_parameters()}
        with rf.set_recurrent_mode(True):
            if route == "functional_call":
                y = torch.func.functional_call(m, given, (td.clone(),))["y"]
            else:
                with TensorDict({tuple(n.split(".")): v for n, v in given.items()}, []).to_module(m):
                    y = m(td.clone())["y"]
        grads.append(torch.autograd.grad(y.pow(2).sum(), list(given.values())))
    torch.testing.assert_close(grads[0], grads[1])
