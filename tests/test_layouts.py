"""Layout property test: every backend reads every tensor argument through its real strides.

Each argument (``x``, state, ``is_init`` with and without its trailing 1, ``reset_state``,
every param) is given as a view of column-major storage (``transposed``), a stride-2 slice
(``strided``) or a stride-0 expansion along dim 0 (``expanded``); outputs and gradients
(w.r.t. x, state, reset_state and every param) must equal the call on contiguous copies of
the same values, fp64 at ``assert_close`` defaults. Through the modules: a ``[B, T]``
transposed view of a time-major ``[T, B]`` TensorDict equals the contiguous TensorDict; under
``torch.vmap``, column-major stacked params and a transposed ``x``/``is_init`` equal contiguous ones.

Sizes are tiny (B=3, T=4, F=2, H=3): ``triton`` runs under ``TRITON_INTERPRET=1`` here and
eager ``scan`` re-traces its step on every call (~1-3 s of CPU), so ``scan``, whose ops all
read strides through torch, runs one call with every argument laid out, the kinds taken in
turn (``mixed``), and the triton step (the T=1 sequence kernels) every argument at once.
"""

from __future__ import annotations

import pytest
import torch
from helpers import flat
from layout_helpers import (
    KINDS, batch_constant, changed_arguments, in_layout, make_values, outputs_and_grads, with_layout,
)
from modules.module_helpers import HIDDEN_KEYS, make_module, make_td, weighted_sum
from tensordict import TensorDict

import rnn_functional as rf

SEQUENCE_BACKENDS = [*rf.available_backends(cell="gru"), "auto"]
STEP_BACKENDS = [b for b in SEQUENCE_BACKENDS if b != "scan"]
ALL = {"x", "state", "is_init", "reset", "params"}

# name -> (arguments laid out, is_init with a trailing 1, interior resets)
SEQUENCE_TARGETS = {
    "x": ({"x"}, False, True),
    "state": ({"state"}, False, True),
    "is_init": ({"is_init"}, False, True),
    "is_init_trailing1": ({"is_init"}, True, True),
    "reset_state": ({"reset"}, False, True),
    "params": ({"params"}, False, True),
    "all": (ALL, True, True),
    "all_no_interior_resets": (ALL, False, False),  # auto picks pad; pad applies t=0 resets to the state
}
NO_INTERIOR_BACKENDS = ("pad", "auto")  # the only ones with another path when no reset is interior
STEP_TARGETS = {k: v for k, v in SEQUENCE_TARGETS.items() if k not in ("reset_state", "all_no_interior_resets")}
# (cell, layers): both L=1 and L=2 for each cell across the two modes
CELL_LAYERS = {"sequence": [("lstm", 2), ("gru", 1)], "step": [("lstm", 1), ("gru", 2)]}


def _wanted(mode: str, backend: str, target: str, kind: str) -> bool:
    """Every (target, kind) on the cheap backends; the interpreted triton step (a T=1 sequence
    of the same kernels) with every argument laid out at once; scan in one mixed call."""
    if backend == "scan":
        return target == "all" and kind == "mixed"
    if backend == "triton" and mode == "step" and target != "all":
        return False
    if target == "all_no_interior_resets" and backend not in NO_INTERIOR_BACKENDS:
        return False
    return kind != "mixed"


def _cases(mode: str) -> list:
    backends = SEQUENCE_BACKENDS if mode == "sequence" else STEP_BACKENDS
    targets = SEQUENCE_TARGETS if mode == "sequence" else STEP_TARGETS
    return [
        pytest.param(backend, cell, layers, target, kind, id=f"{backend}-{cell}L{layers}-{target}-{kind}")
        for backend in backends
        for cell, layers in CELL_LAYERS[mode]
        for target in targets
        for kind in (*KINDS, "mixed")
        if _wanted(mode, backend, target, kind)
        and _lays_out_something(mode, backend, cell, layers, target, kind)  # e.g. a 1-D is_init has no transpose
    ]


def _lays_out_something(mode, backend, cell, layers, target, kind) -> bool:
    targets, trailing_one, interior = (SEQUENCE_TARGETS if mode == "sequence" else STEP_TARGETS)[target]
    return bool(changed_arguments(_values(mode, backend, cell, layers, kind, interior), kind, targets, trailing_one))


_EXPECTED: dict = {}


def _values(mode: str, backend: str, cell: str, layers: int, kind: str, interior: bool) -> dict:
    """The call's values; batch-constant for ``expanded``/``mixed`` (so a stride-0 batch dim can hold them).
    LSTM gets a projection where the backend serves it (triton does not)."""
    proj = 2 if cell == "lstm" and backend != "triton" else 0
    values = make_values(cell, mode, layers=layers, proj=proj, interior_resets=interior)
    if kind in ("expanded", "mixed"):
        values = {
            **values,
            "x": batch_constant(values["x"]),
            "state": [batch_constant(s) for s in values["state"]],
            "is_init": batch_constant(values["is_init"]),
            "reset": None if values["reset"] is None else [batch_constant(r) for r in values["reset"]],
            "params": {k: batch_constant(p) for k, p in values["params"].items()},
        }
    return values


def _contiguous_result(mode, backend, cell, layers, kind, interior, values):
    """Outputs and gradients of the contiguous call (cached: many cases share it)."""
    key = (mode, backend, cell, layers, kind in ("expanded", "mixed"), interior)
    if key not in _EXPECTED:
        _EXPECTED[key] = outputs_and_grads(with_layout(values, "contiguous", set()), mode, backend, **_extra(mode))
    return _EXPECTED[key]


def _extra(mode: str) -> dict:
    return {"return_segment_states": True} if mode == "sequence" else {}


def _check(mode, backend, cell, layers, target, kind):
    targets, trailing_one, interior = (SEQUENCE_TARGETS if mode == "sequence" else STEP_TARGETS)[target]
    values = _values(mode, backend, cell, layers, kind, interior)
    laid_out = changed_arguments(values, kind, targets, trailing_one)
    assert laid_out, "the case lays out no argument differently from contiguous"
    expected = _contiguous_result(mode, backend, cell, layers, kind, interior, values)
    got = outputs_and_grads(with_layout(values, kind, targets, trailing_one), mode, backend, **_extra(mode))
    torch.testing.assert_close(got, expected, msg=lambda m: f"{kind} {laid_out}: {m}")


@pytest.mark.parametrize(("backend", "cell", "layers", "target", "kind"), _cases("sequence"))
def test_sequence_layout(backend, cell, layers, target, kind) -> None:
    _check("sequence", backend, cell, layers, target, kind)


@pytest.mark.parametrize(("backend", "cell", "layers", "target", "kind"), _cases("step"))
def test_step_layout(backend, cell, layers, target, kind) -> None:
    _check("step", backend, cell, layers, target, kind)


# ----------------------------------------------------------------------------- modules

def _module_outputs_and_grads(module, td: TensorDict, leaves: list[torch.Tensor], cell: str):
    with rf.set_recurrent_mode(True):
        out = module(td)
    outs = [out["y"], *(out["next", k] for k in HIDDEN_KEYS[cell])]
    grads = torch.autograd.grad(weighted_sum(outs), leaves + list(module.parameters()))
    return [o.detach() for o in outs], list(grads)


@pytest.mark.parametrize("backend", SEQUENCE_BACKENDS)
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_module_transposed_time_major_tensordict(backend: str, cell: str) -> None:
    """A ``[B, T]`` view of a ``[T, B]`` TensorDict (what a time-major buffer gives once
    transposed to batch-major) equals the contiguous ``[B, T]`` TensorDict in recurrent mode."""
    module = make_module(cell, input_size=2, hidden=3, layers=2, recurrent_backend=backend)
    values = make_td(cell, (3, 4), input_size=2, hidden=3, layers=2, reset_prob=0.4, seed=3)
    values["is_init"][:, 2] = True  # interior resets on every row, whatever the draw
    keys = ["x", *HIDDEN_KEYS[cell]]

    contiguous = values.clone()
    leaves = [contiguous[k].requires_grad_() for k in keys]
    expected = _module_outputs_and_grads(module, contiguous, leaves, cell)

    time_major = TensorDict({k: v.transpose(0, 1).contiguous() for k, v in values.items()}, batch_size=[4, 3])
    tm_leaves = [time_major[k].requires_grad_() for k in keys]
    batch_major = time_major.transpose(0, 1)
    assert not batch_major["is_init"].is_contiguous() and not batch_major["x"].is_contiguous()
    got_outs, got_grads = _module_outputs_and_grads(module, batch_major, tm_leaves, cell)
    # gradients w.r.t. the time-major leaves, back in [B, T] order
    got_grads = [g.transpose(0, 1) for g in got_grads[: len(keys)]] + got_grads[len(keys):]
    torch.testing.assert_close((got_outs, got_grads), expected)


# ----------------------------------------------------------------------------- ensembles


@pytest.mark.parametrize("backend", STEP_BACKENDS)  # scan is left out for time (see the module docstring)
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_vmap_ensemble_layouts(backend: str, cell: str) -> None:
    """``torch.vmap`` over stacked params (column-major) with a transposed ``x``/``is_init``
    shared by the members equals the contiguous call, outputs and gradients."""
    members = [make_values(cell, "sequence", seed=s) for s in range(2)]
    values = members[0]

    def run(kind: str):
        params = rf.stack_params([TensorDict(m["params"], []) for m in members])
        params = TensorDict({k: in_layout(p, kind) for k, p in params.items()}, batch_size=params.batch_size)
        x, is_init = in_layout(values["x"], kind), in_layout(values["is_init"], kind)
        seq = rf.lstm_sequence if cell == "lstm" else rf.gru_sequence
        outs = torch.vmap(lambda p: flat(seq(x, None, p, is_init=is_init, backend=backend)), in_dims=(0,))(params)
        grads = torch.autograd.grad(weighted_sum(outs), [x, *params.values()])
        return [o.detach() for o in outs], list(grads)

    torch.testing.assert_close(run("transposed"), run("contiguous"))
