"""How far one warm eager call walks (``benchmarks/walk.py``): the distinct package functions and files it runs
through stay within issue 53's targets (TorchRL's modules walk 9-12 functions in their one ``rnn.py``)."""

from __future__ import annotations

import pytest

from benchmarks import walk

# call: (at most this many distinct functions, at most this many files)
TARGETS = {
    "LSTMModule step": (15, 6),
    "GRUModule step": (15, 6),
    "LSTMModule recurrent reference": (25, 7),
    "GRUModule recurrent reference": (25, 7),
    "lstm_step": (10, 4),
    "gru_step": (10, 4),
}


@pytest.fixture(scope="module")
def cases() -> dict:
    return walk.cases()


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_walk_within_target(cases, name) -> None:
    fn, where = cases[name]
    _, functions = walk.count(fn, where)
    most_functions, most_files = TARGETS[name]
    files = {f for f, _, _ in functions}
    assert len(functions) <= most_functions, f"{name}: {len(functions)} functions: {functions}"
    assert len(files) <= most_files, f"{name}: {len(files)} files: {sorted(files)}"


@pytest.mark.parametrize("cell, picked", [("LSTMModule", "pad"), ("GRUModule", "scan")])
def test_auto_adds_at_most_five_functions_over_the_backend_it_picks(cases, cell, picked) -> None:
    """On this call (CPU, under autograd, one interior reset) ``auto`` picks ``pad`` for the LSTM and the ``scan`` loop
    for the GRU, whose CPU kernel gains nothing from re-batched segments; ``auto``'s rule (with the host read that
    decides it) is a few functions over the backend it picks."""
    auto, forced = (set(walk.count(*cases[f"{cell} recurrent {b}"])[1]) for b in ("auto", picked))
    assert len(auto - forced) <= 5, sorted(auto - forced)
