"""Our RG-LRU against DeepMind's recurrentgemma RG-LRU (``recurrentgemma/torch/layers.py``: ``RGLRU``,
``BlockDiagonalLinear``, ``rnn_scan``, ``rnn_param_init``).

recurrentgemma's package imports its JAX code on import (flax, jax), so its torch layer is not importable here; the
oracle is a plain loop written below that follows its code line by line (block-diagonal gates on ``x`` fed in
directly, ``log_a = -8 r softplus(a_param)``, ``sqrt(1 - a^2)`` input normalisation, ``a = 0`` and multiplier 1 where
``segment_pos == 0``), accumulating in fp64 (its ``rnn_scan`` takes ``acc_dtype``). fp64 at ``assert_close``
defaults, outputs and gradients, on every RG-LRU backend.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import rnn_functional as rf

WIDTH, HEADS, B, T = 8, 2, 3, 7
BACKENDS = [("reference", "none"), ("scan", "none"), ("scan", "full"), ("parallel", "none"), ("auto", "none")]


def recurrentgemma_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """An RGLRU's state dict drawn as its ``reset_parameters`` draws it (normal gates, std sqrt(1 / block width)),
    with non-zero biases (its zeros would hide their gradients)."""
    g = torch.Generator().manual_seed(seed)
    bw = WIDTH // HEADS
    normal = lambda *shape, std=1.0: torch.randn(*shape, generator=g, dtype=torch.float64) * std  # noqa: E731
    square = torch.empty(WIDTH, dtype=torch.float64).uniform_(0.9 ** 2 + 1e-8, 0.999 ** 2 + 1e-8, generator=g)
    return {"a_param": torch.log(torch.exp(-0.5 * torch.log(square)) - 1.0),  # rnn_param_init
            "input_gate.w": normal(HEADS, bw, bw, std=math.sqrt(1 / bw)), "input_gate.b": normal(HEADS, bw, std=0.3),
            "a_gate.w": normal(HEADS, bw, bw, std=math.sqrt(1 / bw)), "a_gate.b": normal(HEADS, bw, std=0.3)}


def block_diagonal_linear(x, w, b):
    heads = w.shape[0]
    y = torch.einsum("...hi,hij->...hj", x.unflatten(-1, (heads, -1)), w) + b
    return y.flatten(-2)


def recurrentgemma_rglru(p, x, segment_pos, cache=None):
    """recurrentgemma's ``RGLRU.forward`` and ``rnn_scan`` (acc in fp64) -> ``(y, last_h)``."""
    reset = segment_pos == 0
    gate_x = torch.sigmoid(block_diagonal_linear(x, p["input_gate.w"], p["input_gate.b"]))
    gate_a = torch.sigmoid(block_diagonal_linear(x, p["a_gate.w"], p["a_gate.b"]))
    log_a = -8.0 * gate_a * F.softplus(p["a_param"])
    a, a_square = torch.exp(log_a), torch.exp(2 * log_a)
    multiplier = torch.sqrt(1 - a_square)
    multiplier = reset[..., None] + ~reset[..., None] * multiplier
    normalized_x = x * gate_x * multiplier
    a = a * ~reset[..., None]
    h = torch.zeros_like(x[:, 0]) if cache is None else cache
    ys = []
    for t in range(x.shape[1]):
        h = a[:, t] * h + normalized_x[:, t]
        ys.append(h)
    return torch.stack(ys, 1), h


def _grads(outputs, leaves):
    g = torch.Generator().manual_seed(7)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outputs)
    return torch.autograd.grad(loss, leaves)


def _gate_block_grads(d_weight: torch.Tensor, key: int) -> torch.Tensor:
    """Our ``weight_l0`` gradient's block ``key`` (1: a_gate, 2: input_gate) as recurrentgemma's ``w [heads, Hb, Hb]``."""
    bw = WIDTH // HEADS
    rows = d_weight[key * WIDTH : (key + 1) * WIDTH].T  # [in, out]
    return torch.stack([rows[h * bw : (h + 1) * bw, h * bw : (h + 1) * bw] for h in range(HEADS)])


@pytest.mark.parametrize("backend,recompute", BACKENDS)
def test_loaded_weights_give_recurrentgemma_outputs_and_gradients(backend: str, recompute: str) -> None:
    """Continuing from a cache (``segment_pos > 0`` everywhere: no segment starts inside the call), ours with the
    loaded weights equals recurrentgemma's layer; gradients of ``x``, the cache, ``a_param`` and both gates."""
    theirs = {k: v.requires_grad_(True) for k, v in recurrentgemma_weights().items()}
    ours = rf.rglru_params_from_recurrentgemma(theirs).apply(lambda t: t.requires_grad_(True))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, T, WIDTH, generator=g, dtype=torch.float64, requires_grad=True)
    cache = torch.randn(B, WIDTH, generator=g, dtype=torch.float64, requires_grad=True)
    segment_pos = torch.arange(5, 5 + T).expand(B, T)
    want = recurrentgemma_rglru(theirs, x, segment_pos, cache)
    y, h = rf.rglru_sequence(x, cache[:, None], ours, backend=backend, recompute=recompute)
    torch.testing.assert_close((y, h[:, 0]), want)
    got_x, got_h, d_w, d_b, d_lambda = _grads((y, h[:, 0]), [x, cache, *ours.values()])
    want_x, want_h, d_a, d_gw, d_gb, d_aw, d_ab = _grads(want, [x, cache, theirs["a_param"], theirs["input_gate.w"],
                                                              theirs["input_gate.b"], theirs["a_gate.w"],
                                                              theirs["a_gate.b"]])
    torch.testing.assert_close((got_x, got_h, -d_lambda), (want_x, want_h, d_a))
    torch.testing.assert_close((_gate_block_grads(d_w, 1), _gate_block_grads(d_w, 2)), (d_aw, d_gw))
    torch.testing.assert_close((d_b[WIDTH : 2 * WIDTH], d_b[2 * WIDTH :]), (d_ab.flatten(), d_gb.flatten()))


def test_loader_takes_the_module_or_its_state_dict_and_copies() -> None:
    weights = recurrentgemma_weights()
    module = torch.nn.Module()
    module.a_param = torch.nn.Parameter(weights["a_param"])
    for gate in ("input_gate", "a_gate"):
        sub = torch.nn.Module()
        sub.w, sub.b = torch.nn.Parameter(weights[f"{gate}.w"]), torch.nn.Parameter(weights[f"{gate}.b"])
        setattr(module, gate, sub)
    from_module, from_dict = rf.rglru_params_from_recurrentgemma(module), rf.rglru_params_from_recurrentgemma(weights)
    assert (from_module == from_dict).all()
    assert from_module["weight_l0"].shape == (3 * WIDTH, WIDTH) and not from_module["log_lambda_l0"].requires_grad
    from_module["log_lambda_l0"].add_(1.0)
    assert torch.equal(module.a_param, weights["a_param"])  # nothing shared


def test_segment_starts_differ_only_by_the_documented_factor() -> None:
    """Where ``segment_pos == 0`` (our ``is_init``, carry reset to zeros) recurrentgemma scales the gated input by 1,
    ours by ``sqrt(1 - a^2)``; everything before the first start agrees, and a start at t=0 is the same relation."""
    theirs = recurrentgemma_weights()
    ours = rf.rglru_params_from_recurrentgemma(theirs)
    x = torch.randn(B, T, WIDTH, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    segment_pos = torch.tensor([[3, 4, 5, 0, 1, 2, 3]] * B)
    cache = torch.randn(B, WIDTH, dtype=torch.float64)
    want, _ = recurrentgemma_rglru(theirs, x, segment_pos, cache)
    y, _ = rf.rglru_sequence(x, cache[:, None], ours, is_init=segment_pos == 0, backend="reference")
    torch.testing.assert_close(y[:, :3], want[:, :3])
    gate_a = torch.sigmoid(block_diagonal_linear(x[:, 3], theirs["a_gate.w"], theirs["a_gate.b"]))
    a = torch.exp(-8.0 * gate_a * F.softplus(theirs["a_param"]))
    torch.testing.assert_close(y[:, 3], want[:, 3] * torch.sqrt(1 - a * a))


def test_recurrentgemma_init_draws_its_decays() -> None:
    """``init="recurrentgemma"`` is ``rnn_param_init(min_rad=0.9, max_rad=0.999)`` with ``Λ = -a_param``: the same
    uniform draws give the same values; ``sigmoid(Λ)`` in [0.9, 0.999] (Griffin's default puts ``sigmoid(Λ)^8``
    there)."""
    g = torch.Generator().manual_seed(0)
    params = rf.init_rglru_params(3, 4096, 2, init="recurrentgemma", dtype=torch.float64, generator=g)
    g = torch.Generator().manual_seed(0)
    torch.empty(3 * 4096, 3, dtype=torch.float64).uniform_(generator=g)  # the same draws as the init, in order
    torch.empty(3 * 4096, dtype=torch.float64).uniform_(generator=g)
    square = torch.empty(4096, dtype=torch.float64).uniform_(0.9 ** 2 + 1e-8, 0.999 ** 2 + 1e-8, generator=g)
    a_param = torch.log(torch.exp(-0.5 * torch.log(square)) - 1.0)
    torch.testing.assert_close(params["log_lambda_l0"], -a_param)
    for k in range(2):
        radius = torch.sigmoid(params[f"log_lambda_l{k}"])
        assert 0.9 <= radius.min() and radius.max() <= 0.999 + 1e-8
        assert abs((radius ** 2).mean().item() - (0.81 + 0.998001) / 2) < 3e-3  # uniform on the ring's area
    griffin = torch.sigmoid(rf.init_rglru_params(3, 4096)["log_lambda_l0"].double()) ** 8
    assert 0.9 <= griffin.min() and griffin.max() <= 0.999 + 1e-6
    with pytest.raises(ValueError, match="init"):
        rf.init_rglru_params(3, 4, init="glorot")
