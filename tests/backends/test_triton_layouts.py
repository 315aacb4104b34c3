"""The ``triton`` backend reads every tensor argument through its real strides (issue 14).

Regression: ``is_init`` given as a transposed view (``(torch.rand(T, B) < p).t()``, what a
time-major TensorDict transposed to batch-major holds) was read as if its time stride were 1,
silently giving wrong outputs and gradients. Every argument here is a view of other storage
(transposed, stride-2 slice, expanded); the triton call must equal ``reference`` on the same
views, outputs and gradients (w.r.t. the storages behind the views), fp64 at ``assert_close``
defaults. Runs under ``TRITON_INTERPRET=1`` on CPU.
"""

from __future__ import annotations

import pytest
import torch
from helpers import CELLS, flat
from tensordict import TensorDict

import rnn_functional as rf
from rnn_functional.backends import triton as tb

pytestmark = pytest.mark.skipif(
    not tb.is_available("cpu"), reason="triton on CPU needs TRITON_INTERPRET=1 (set before import)"
)

B, T, F, H, L = 3, 5, 4, 6, 2
RESET_PROB = 0.4


def _leaf(values: torch.Tensor) -> torch.Tensor:
    return values.detach().clone().requires_grad_(True)


def _view(values: torch.Tensor, how: str, leaves: list) -> torch.Tensor:
    """``values`` (shape kept) as a non-contiguous view of a new leaf storage, appended to ``leaves``.

    ``transposed``: storage with the first two dims swapped; ``strided``: every other element of
    the last dim; ``contiguous``: a plain copy.
    """
    if how == "contiguous":
        base = _leaf(values)
        view = base
    elif how == "transposed":
        base = _leaf(values.transpose(0, 1).contiguous())
        view = base.transpose(0, 1)
    elif how == "strided":
        doubled = torch.stack([values, torch.zeros_like(values)], dim=-1).flatten(-2)
        base = _leaf(doubled)
        view = base[..., ::2]
    else:
        raise AssertionError(how)
    leaves.append(base)
    assert view.shape == values.shape and torch.equal(view, values)
    return view


def _mask(how: str, trailing_one: bool, g: torch.Generator) -> torch.Tensor:
    """``is_init [B, T]`` (or ``[B, T, 1]``) as: transposed view, stride-2 slice, expanded, contiguous."""
    if how == "transposed":
        mask = (torch.rand(T, B, generator=g) < RESET_PROB).t()
    elif how == "strided":
        mask = (torch.rand(B, 2 * T, generator=g) < RESET_PROB)[:, ::2]
    elif how == "expanded":  # stride 0 over the batch: every row resets at the same steps
        mask = (torch.rand(T, generator=g) < RESET_PROB).expand(B, T)
    else:
        mask = torch.rand(B, T, generator=g) < RESET_PROB
    if trailing_one:
        mask = mask.unsqueeze(-1) if how != "transposed" else (torch.rand(T, B, 1, generator=g) < RESET_PROB).transpose(0, 1)
    return mask


def _problem(cell: str, layouts: dict, seed: int = 0) -> dict:
    """A fp64 sequence call whose arguments are laid out as ``layouts`` says (default contiguous)."""
    g = torch.Generator().manual_seed(seed)
    init = CELLS[cell][0]
    params = init(F, H, L, dtype=torch.float64, generator=g)
    n_states = 2 if cell == "lstm" else 1
    x = torch.randn(B, T, F, generator=g, dtype=torch.float64)
    states = [torch.randn(B, L, H, generator=g, dtype=torch.float64) for _ in range(n_states)]
    resets = [torch.randn(B, T, L, H, generator=g, dtype=torch.float64) for _ in range(n_states)]
    leaves: list = []
    x = _view(x, layouts.get("x", "contiguous"), leaves)
    states = [_view(s, layouts.get("state", "contiguous"), leaves) for s in states]
    resets = [_view(r, layouts.get("reset_state", "contiguous"), leaves) for r in resets]
    params_how = layouts.get("params", "contiguous")
    viewed = {}
    for key, value in params.items():
        how = "strided" if (params_how == "transposed" and value.ndim == 1) else params_how
        if how == "transposed":  # a [rows, cols] weight read through a transposed [cols, rows] storage
            base = _leaf(value.t().contiguous())
            leaves.append(base)
            viewed[key] = base.t()
        else:
            viewed[key] = _view(value, how, leaves)
    pack = (lambda ts: tuple(ts)) if cell == "lstm" else (lambda ts: ts[0])
    return {
        "cell": cell,
        "x": x,
        "state": pack(states),
        "reset_state": pack(resets),
        "params": TensorDict(viewed, batch_size=[]),
        "is_init": _mask(layouts.get("is_init", "contiguous"), layouts.get("trailing_one", False), g),
        "leaves": leaves,
    }


def _outputs_and_grads(problem: dict, backend: str) -> tuple[list, list]:
    seq = CELLS[problem["cell"]][2]
    outs = flat(seq(problem["x"], problem["state"], problem["params"], is_init=problem["is_init"],
                    reset_state=problem["reset_state"], backend=backend))
    g = torch.Generator().manual_seed(123)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outs)
    grads = torch.autograd.grad(loss, problem["leaves"], materialize_grads=True)
    return [o.detach() for o in outs], list(grads)


def _assert_matches_reference(problem: dict) -> None:
    out, grads = _outputs_and_grads(problem, "triton")
    ref_out, ref_grads = _outputs_and_grads(problem, "reference")
    for name, actual, expected in (("output", out, ref_out), ("grad", grads, ref_grads)):
        assert len(actual) == len(expected)
        for i, (a, e) in enumerate(zip(actual, expected)):
            torch.testing.assert_close(a, e, msg=lambda m, i=i, n=name: f"{n} #{i}: {m}")


LAYOUTS = {
    "is_init transposed": {"is_init": "transposed"},
    "is_init transposed [B, T, 1]": {"is_init": "transposed", "trailing_one": True},
    "is_init stride-2": {"is_init": "strided"},
    "is_init expanded": {"is_init": "expanded"},
    "x transposed": {"x": "transposed"},
    "x stride-2": {"x": "strided"},
    "state transposed": {"state": "transposed"},
    "state stride-2": {"state": "strided"},
    "reset_state transposed": {"reset_state": "transposed"},
    "reset_state stride-2": {"reset_state": "strided"},
    "params transposed": {"params": "transposed"},
    "params stride-2": {"params": "strided"},
    "everything": {"is_init": "transposed", "x": "transposed", "state": "strided", "reset_state": "transposed",
                   "params": "transposed"},
}


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("layouts", list(LAYOUTS.values()), ids=list(LAYOUTS))
def test_strided_views_match_reference(cell: str, layouts: dict) -> None:
    _assert_matches_reference(_problem(cell, layouts))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_step_with_strided_views_matches_reference(cell: str) -> None:
    """The fused step: ``x``, state and ``is_init [B]`` as strided views."""
    g = torch.Generator().manual_seed(4)
    init, step, _ = CELLS[cell]
    params = init(F, H, L, dtype=torch.float64, generator=g)
    x = torch.randn(F, B, generator=g, dtype=torch.float64).t()
    states = [torch.randn(L, B, H, generator=g, dtype=torch.float64).transpose(0, 1) for _ in range(2 if cell == "lstm" else 1)]
    state = tuple(states) if cell == "lstm" else states[0]
    is_init = (torch.rand(2 * B, generator=g) < 0.5)[::2]
    out = flat(step(x, state, params, is_init=is_init, backend="triton"))
    expected = flat(step(x, state, params, is_init=is_init, backend="reference"))
    for a, e in zip(out, expected):
        torch.testing.assert_close(a, e)


def test_gru_module_on_transposed_tensordict() -> None:
    """``GRUModule(recurrent_backend="triton")`` on a ``[B, T]`` view of a time-major ``[T, B]`` TensorDict."""
    from torchrl.modules import set_recurrent_mode

    g = torch.Generator().manual_seed(2)
    time_major = TensorDict(
        {
            "embed": torch.randn(T, B, F, generator=g, dtype=torch.float64),
            "is_init": torch.rand(T, B, 1, generator=g) < RESET_PROB,
            "recurrent_state": torch.randn(T, B, 1, H, generator=g, dtype=torch.float64),
        },
        batch_size=[T, B],
    )
    batch_major = time_major.transpose(0, 1)
    assert not batch_major["is_init"].is_contiguous()
    results = {}
    for backend in ("triton", "reference"):
        torch.manual_seed(0)
        module = rf.GRUModule(input_size=F, hidden_size=H, in_key="embed", out_key="y",
                              recurrent_backend=backend).double()
        with set_recurrent_mode(True):
            out = module(batch_major.clone(False))
        grads = torch.autograd.grad(out["y"].square().sum(), list(module.parameters()))
        results[backend] = [out["y"].detach(), *grads]
    for a, e in zip(results["triton"], results["reference"]):
        torch.testing.assert_close(a, e)
