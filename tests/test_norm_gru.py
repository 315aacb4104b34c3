"""The layer-normalised GRU (DreamerV2/V3) against an independent plain-PyTorch loop.

fp64 at ``assert_close`` defaults: outputs and gradients w.r.t. ``x``, the state,
``reset_state`` and every parameter, on every backend that serves the cell; ``pad`` and
``triton`` refuse it with the error naming those that can; compiled (fullgraph) equals
eager; ``torch.vmap`` over stacked params equals a loop over the members.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import exec_as_module

import rnn_functional as rf
from rnn_functional.backends import SequenceOptions, triton_backend
from rnn_functional.cells.norm_gru import NORM_GRU
from rnn_functional.functional import _core
from rnn_functional.functional._core import CallContext

F_IN, H, B, T = 3, 4, 3, 5


# ----------------------------------------------------------------------------- the independent loop


def _layer_norm(z: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    mean = z.mean(-1, keepdim=True)
    var = ((z - mean) ** 2).mean(-1, keepdim=True)
    return (z - mean) / torch.sqrt(var + 1e-3) * weight + bias


def loop_norm_gru(x, h0, params, is_init=None, reset=None, dropout=0.0):
    """``x [B, T, F]``, ``h0 [B, L, H]``, ``is_init [B, T]``, ``reset [B, T, L, H]``: the issue's math, step by step."""
    num_layers = h0.shape[1]
    h = [h0[:, k] for k in range(num_layers)]
    ys = []
    for t in range(x.shape[1]):
        if is_init is not None:
            m = is_init[:, t, None]
            h = [torch.where(m, torch.zeros_like(hk) if reset is None else reset[:, t, k], hk) for k, hk in enumerate(h)]
        inp = x[:, t]
        for k in range(num_layers):
            z = torch.cat([inp, h[k]], -1) @ params[f"weight_l{k}"].T
            r, c, u = _layer_norm(z, params[f"norm_weight_l{k}"], params[f"norm_bias_l{k}"]).chunk(3, -1)
            r = torch.sigmoid(r)
            c = torch.tanh(r * c)
            u = torch.sigmoid(u - 1)
            h[k] = u * c + (1 - u) * h[k]
            inp = torch.nn.functional.dropout(h[k], dropout, training=True) if dropout and k < num_layers - 1 else h[k]
        ys.append(inp)
    return torch.stack(ys, 1), torch.stack(h, 1)


def make_params(layers: int, seed: int = 0, dtype=torch.float64):
    """Init, then non-trivial layer-norm weights (the init's ones/zeros would hide their gradients)."""
    g = torch.Generator().manual_seed(seed)
    params = rf.init_norm_gru_params(F_IN, H, layers, dtype=dtype, generator=g)
    for k in range(layers):
        params[f"norm_weight_l{k}"] = 1 + 0.3 * torch.randn(3 * H, generator=g, dtype=dtype)
        params[f"norm_bias_l{k}"] = 0.2 * torch.randn(3 * H, generator=g, dtype=dtype)
    return params


RESETS = ["none", "t0", "every", "random-zeros", "random-reset_state"]


def make_case(layers: int, resets: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed + 1)
    params = make_params(layers, seed)
    x = torch.randn(B, T, F_IN, generator=g, dtype=torch.float64)
    h0 = torch.randn(B, layers, H, generator=g, dtype=torch.float64)
    is_init = {
        "none": None,
        "t0": torch.zeros(B, T, dtype=torch.bool).index_fill_(1, torch.tensor([0]), True),
        "every": torch.ones(B, T, dtype=torch.bool),
    }.get(resets, torch.rand(B, T, generator=g) < 0.4)
    reset = torch.randn(B, T, layers, H, generator=g, dtype=torch.float64) if resets != "random-zeros" and is_init is not None else None
    leaves = [x, h0, *([reset] if reset is not None else []), *params.values()]
    for t in leaves:
        t.requires_grad_(True)
    return SimpleNamespace(params=params, x=x, h0=h0, is_init=is_init, reset=reset, leaves=leaves)


def _grads(outputs, leaves):
    g = torch.Generator().manual_seed(7)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outputs)
    return torch.autograd.grad(loss, leaves, allow_unused=True, materialize_grads=True)


# ----------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("resets", RESETS)
@pytest.mark.parametrize("backend,recompute", [("reference", "none"), ("scan", "none"), ("auto", "none"),
                                               ("reference", "full"), ("scan", "full")])
def test_sequence_matches_loop(backend: str, recompute: str, layers: int, resets: str) -> None:
    c = make_case(layers, resets)
    want = loop_norm_gru(c.x, c.h0, c.params, c.is_init, c.reset)
    got = rf.norm_gru_sequence(c.x, c.h0, c.params, is_init=c.is_init, reset_state=c.reset, backend=backend,
                               recompute=recompute)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(_grads(got, c.leaves), _grads(want, c.leaves))


@pytest.mark.parametrize("backend", ["reference", "scan"])
def test_segment_states(backend: str) -> None:
    """``return_segment_states``: the carry at every segment end, zeros elsewhere."""
    c = make_case(2, "random-reset_state")
    y, h_T, seg = rf.norm_gru_sequence(c.x, c.h0, c.params, is_init=c.is_init, reset_state=c.reset,
                                       backend=backend, return_segment_states=True)
    ends = torch.cat([c.is_init[:, 1:], torch.ones(B, 1, dtype=torch.bool)], 1)
    for t in range(T):
        _, h_t = loop_norm_gru(c.x[:, : t + 1], c.h0, c.params, c.is_init[:, : t + 1], c.reset[:, : t + 1])
        torch.testing.assert_close(seg[:, t], torch.where(ends[:, t, None, None], h_t, 0.0))
    torch.testing.assert_close(seg[:, -1], h_T)


@pytest.mark.parametrize("layers", [1, 2])
def test_step_matches_loop(layers: int) -> None:
    c = make_case(layers, "none")
    is_init = torch.tensor([True, False, True])
    for backend in ("reference", "auto"):
        y, h = rf.norm_gru_step(c.x[:, 0], c.h0, c.params, is_init=is_init, backend=backend)
        want_y, want_h = loop_norm_gru(c.x[:, :1], c.h0, c.params, is_init[:, None])
        torch.testing.assert_close((y, h), (want_y[:, 0], want_h))
        torch.testing.assert_close(_grads((y, h), c.leaves), _grads((want_y, want_h), c.leaves))


def test_multi_step_rollout_equals_sequence() -> None:
    """Imagination: ``T`` calls of the step equal one sequence call, batch dims ``[2, 3]``."""
    params = make_params(2)
    x = torch.randn(2, 3, T, F_IN, dtype=torch.float64)
    y_seq, h_seq = rf.norm_gru_sequence(x, None, params)
    h, ys = None, []
    for t in range(T):
        y, h = rf.norm_gru_step(x[:, :, t], h, params)
        ys.append(y)
    torch.testing.assert_close((torch.stack(ys, 2), h), (y_seq, h_seq))
    assert h.shape == (2, 3, 2, H)


def test_dropout_between_layers_matches_loop() -> None:
    """The reference loop draws dropout masks step by step, layer by layer, as the independent loop does."""
    c = make_case(2, "random-zeros")
    torch.manual_seed(3)
    got = rf.norm_gru_sequence(c.x, c.h0, c.params, is_init=c.is_init, backend="reference", dropout=0.4, training=True)
    torch.manual_seed(3)
    want = loop_norm_gru(c.x, c.h0, c.params, c.is_init, dropout=0.4)
    torch.testing.assert_close(got, want)
    torch.manual_seed(3)
    scan_y, _ = rf.norm_gru_sequence(c.x, c.h0, c.params, backend="scan", dropout=0.4, training=True)
    assert not torch.allclose(scan_y, loop_norm_gru(c.x, c.h0, c.params)[0])  # dropout applied
    torch.testing.assert_close(  # eval mode: no dropout
        rf.norm_gru_sequence(c.x, c.h0, c.params, backend="scan", dropout=0.4), loop_norm_gru(c.x, c.h0, c.params)
    )


def test_init() -> None:
    params = rf.init_norm_gru_params(F_IN, 16, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert {k: tuple(v.shape) for k, v in params.items()} == {
        "weight_l0": (48, F_IN + 16), "norm_weight_l0": (48,), "norm_bias_l0": (48,),
        "weight_l1": (48, 32), "norm_weight_l1": (48,), "norm_bias_l1": (48,),
    }
    bound = 1 / math.sqrt(16)
    for k in range(2):
        w = params[f"weight_l{k}"]
        assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound
        assert torch.equal(params[f"norm_weight_l{k}"], torch.ones(48, dtype=torch.float64))
        assert torch.equal(params[f"norm_bias_l{k}"], torch.zeros(48, dtype=torch.float64))


def test_bad_params_say_which_key() -> None:
    params = rf.init_norm_gru_params(F_IN, H)
    with pytest.raises(KeyError, match=r"missing key\(s\) \['norm_bias_l0'\]"):
        rf.norm_gru_sequence(torch.randn(B, T, F_IN), None, params.exclude("norm_bias_l0"))
    with pytest.raises(KeyError, match="missing key 'weight_l0'.*init_norm_gru_params"):
        rf.norm_gru_sequence(torch.randn(B, T, F_IN), None, rf.init_gru_params(F_IN, H))
    with pytest.raises(ValueError, match=r"params\['norm_weight_l0'\]: expected shape \[12\]"):
        rf.norm_gru_sequence(torch.randn(B, T, F_IN), None, params.set("norm_weight_l0", torch.ones(5)))


# ----------------------------------------------------------------------------- backends that cannot serve it


@pytest.mark.parametrize("backend", ["pad", "triton"])
def test_pad_and_triton_refuse_it(backend: str) -> None:
    params = rf.init_norm_gru_params(F_IN, H)
    msg = rf"backend '{backend}' cannot serve the norm GRU cell.*\['reference', 'scan'\]"
    with pytest.raises(ValueError, match=msg):
        rf.norm_gru_sequence(torch.randn(B, T, F_IN), None, params, backend=backend)
    with pytest.raises(ValueError, match=rf"backend '{backend}' cannot serve the norm GRU cell.*\['reference'\] "):
        rf.norm_gru_step(torch.randn(B, F_IN), None, params, backend=backend)  # a step's backends: 'scan' runs sequences
    # also under torch.compile, where pad would otherwise be routed to scan (dynamo wraps the error)
    with pytest.raises((ValueError, torch._dynamo.exc.Unsupported), match=msg):
        torch.compile(lambda x: rf.norm_gru_sequence(x, None, params, backend=backend), fullgraph=True,
                      backend="eager")(torch.randn(B, T, F_IN))


@pytest.mark.parametrize("compiling,vmapped,differentiated", [(False, False, False), (True, False, False),
                                                              (False, True, False), (False, False, True)])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_auto_never_picks_a_backend_without_its_kernels(monkeypatch, compiling, vmapped, differentiated, recompute):
    """``auto`` for the norm GRU, in every context, also on CUDA with triton (simulated): reference or scan."""
    layout = NORM_GRU.read_layout(rf.init_norm_gru_params(F_IN, H))
    gru_layout = rf.functional._core.read_layout(rf.init_gru_params(F_IN, H), "gru")
    monkeypatch.setattr(triton_backend, "is_available", lambda device=None: True)
    ctx = CallContext.of(compiling, vmapped, differentiated)
    opts = SequenceOptions(recompute=recompute)
    is_init = torch.zeros(B, T, dtype=torch.bool)
    for device in ("cpu", "cuda"):
        x = SimpleNamespace(is_cuda=device == "cuda", device=torch.device(device), shape=is_init.shape)
        assert _core.choose("auto", layout, x, opts, None, True, ctx).backend in ("reference", "scan")
    if not differentiated:  # the control: the GRU gets cuDNN (pad) in plain eager mode on CUDA, triton elsewhere
        x = SimpleNamespace(is_cuda=True, device=torch.device("cuda"), shape=is_init.shape)
        plain = not (compiling or vmapped) and recompute == "none"
        assert _core.choose("auto", gru_layout, x, opts, None, True, ctx).backend == ("pad" if plain else "triton")


def test_auto_step_runs_reference() -> None:
    layout = NORM_GRU.read_layout(rf.init_norm_gru_params(F_IN, H))
    assert _core.resolve_step("auto", layout, torch.randn(B, F_IN), CallContext.of(False, False, False)) is rf.cells.multi_layer_step


# ----------------------------------------------------------------------------- compile and vmap


@pytest.mark.parametrize("backend", ["auto"])
def test_compiled_fullgraph_equals_eager(backend: str) -> None:
    """Compiled (fullgraph, aot_eager) outputs and gradients equal eager; the gradient path is the
    cell's hand-written step backward (scan under compile with grad: ``auto`` resolves to it, so a named ``scan``
    would compile the same graph; test_auto_never_picks_a_backend_without_its_kernels checks the resolution)."""
    c = make_case(2, "random-reset_state")

    def loss_fn(x, h0, params, is_init, reset):
        y, h = rf.norm_gru_sequence(x, h0, params, is_init=is_init, reset_state=reset, backend=backend)
        return y, h

    torch._dynamo.reset()
    compiled = torch.compile(loss_fn, fullgraph=True, backend="aot_eager")
    got = compiled(c.x, c.h0, c.params, c.is_init, c.reset)
    want = loss_fn(c.x, c.h0, c.params, c.is_init, c.reset)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(_grads(got, c.leaves), _grads(want, c.leaves))


def test_compiled_step_fullgraph() -> None:
    c = make_case(2, "none")
    step = torch.compile(lambda x, h, p: rf.norm_gru_step(x, h, p), fullgraph=True, backend="aot_eager")
    got = step(c.x[:, 0], c.h0, c.params)
    want = rf.norm_gru_step(c.x[:, 0], c.h0, c.params, backend="reference")
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(_grads(got, c.leaves), _grads(want, c.leaves))


@pytest.mark.parametrize("backend", ["auto", "reference", "scan"])
def test_vmap_over_stacked_params_equals_loop(backend: str) -> None:
    members = [make_params(2, seed=s) for s in range(3)]
    stacked = rf.stack_params(members).apply(lambda t: t.detach().requires_grad_(True))
    c = make_case(2, "random-reset_state")
    run = torch.vmap(
        lambda p: rf.norm_gru_sequence(c.x, c.h0, p, is_init=c.is_init, reset_state=c.reset, backend=backend),
        in_dims=(0,),
    )
    y, h = run(stacked)
    for i, p in enumerate(rf.unstack_params(stacked)):
        torch.testing.assert_close((y[i], h[i]), loop_norm_gru(c.x, c.h0, p, c.is_init, c.reset))
    got = _grads((y, h), list(stacked.values()))
    loops = [loop_norm_gru(c.x, c.h0, p, c.is_init, c.reset) for p in rf.unstack_params(stacked)]
    want = _grads((torch.stack([o[0] for o in loops]), torch.stack([o[1] for o in loops])), list(stacked.values()))
    torch.testing.assert_close(got, want)


def test_model_based_doc_section_runs() -> None:
    """The RSSM-core example of docs/model_based.md runs (the page's other blocks are excerpts)."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "model_based.md").read_text()
    section = page.split("## A layer-normalised GRU core")[1].split("\n## ")[0]
    (code,) = re.findall(r"^```python\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    torch._dynamo.reset()
    exec_as_module(code, "docs/model_based.md[norm GRU]", "docs_model_based_norm_gru")
