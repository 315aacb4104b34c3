"""Builders for the layout and edge-case tests: the same values in unusual memory layouts,
public-API calls on a problem dict, and output/input aliasing checks.

A *problem* is a dict of plain tensors: ``x``, ``state`` (list), ``is_init``, ``reset``
(list or None) and ``params`` (name -> tensor), plus ``cell``. Only the public API is used.
"""

from __future__ import annotations

import torch
from helpers import CELLS, flat, pack_state
from modules.module_helpers import weighted_sum
from tensordict import TensorDict

KINDS = ("transposed", "strided", "expanded")


def layout_applies(t: torch.Tensor, kind: str) -> bool:
    """Whether ``kind`` gives ``t`` strides that differ from the contiguous ones in a way that matters."""
    if kind == "transposed":  # at least two dims of size > 1 to swap
        return sum(s > 1 for s in t.shape) >= 2
    if kind == "expanded":  # a stride-0 dim 0
        return t.ndim >= 1 and t.shape[0] > 1
    return t.numel() > 0


def in_layout(t: torch.Tensor, kind: str) -> torch.Tensor:
    """A leaf with the values of ``t`` (``t[:1]`` repeated along dim 0 for ``expanded``) laid out as:

    - ``contiguous``: a plain copy;
    - ``transposed``: a view of column-major storage (every stride order reversed: for a
      ``[B, T]`` tensor, the ``.t()`` of ``[T, B]`` time-major storage);
    - ``strided``: every dim a stride-2 slice, from offset 1, of a twice-larger buffer;
    - ``expanded``: ``t[:1].expand(t.shape)`` (stride 0 along dim 0).

    Floating leaves require grad, so gradients can be taken w.r.t. exactly this argument.
    """
    t = t.detach()
    if kind == "contiguous":
        out = t.clone()
    elif kind == "transposed":
        order = tuple(reversed(range(t.ndim)))
        out = t.permute(order).contiguous().permute(order)
    elif kind == "strided":
        buf = torch.zeros([2 * s for s in t.shape], dtype=t.dtype)
        every_other = (slice(1, None, 2),) * t.ndim
        buf[every_other] = t
        out = buf[every_other]
    elif kind == "expanded":
        out = t[:1].clone().expand(t.shape)
    else:
        raise ValueError(f"unknown layout kind {kind!r}")
    return out.requires_grad_(t.is_floating_point())


def batch_constant(t: torch.Tensor) -> torch.Tensor:
    """``t[:1]`` repeated along dim 0, contiguous: the values an ``expanded`` layout can hold."""
    return t[:1].expand(t.shape).clone()


def make_values(
    cell: str,
    mode: str,
    *,
    batch: int = 3,
    time: int = 4,
    input_size: int = 2,
    hidden: int = 3,
    layers: int = 1,
    proj: int = 0,
    interior_resets: bool = True,
    seed: int = 0,
) -> dict:
    """Plain contiguous fp64 values of one call (``mode``: ``"sequence"`` or ``"step"``).

    ``is_init`` is a fixed pattern: with ``interior_resets`` every row resets inside the
    sequence (pad's split path), else rows reset at ``t = 0`` only or never.
    """
    g = torch.Generator().manual_seed(seed)
    kwargs = {"proj_size": proj} if cell == "lstm" else {}
    params = dict(CELLS[cell][0](input_size, hidden, layers, dtype=torch.float64, generator=g, **kwargs).items())
    sizes = [proj or hidden, hidden] if cell == "lstm" else [hidden]

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    if mode == "step":
        x = randn(batch, input_size)
        is_init = torch.tensor([True, False, True, False][:batch], dtype=torch.bool)
        reset = None
    else:
        x = randn(batch, time, input_size)
        interior = [[0, 1, 0, 0], [1, 0, 0, 1], [0, 0, 1, 1]]
        pattern = interior if interior_resets else [[1, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]]
        is_init = torch.tensor(pattern, dtype=torch.bool)[:batch, :time]
        reset = [randn(batch, time, layers, s) for s in sizes]
    state = [randn(batch, layers, s) for s in sizes]
    return {"cell": cell, "x": x, "state": state, "is_init": is_init, "reset": reset, "params": params}


def with_layout(values: dict, kind: str, targets: set[str], trailing_one: bool = False) -> dict:
    """A problem whose arguments named in ``targets`` (``x``, ``state``, ``is_init``, ``reset``,
    ``params``) are in layout ``kind`` and the others contiguous copies; ``is_init`` with a
    trailing singleton dim when ``trailing_one``.

    ``kind="mixed"``: the targeted tensors take the :data:`KINDS` in turn (the next one that
    applies), so one call sees every kind; its values must be batch-constant like ``expanded``'s.
    """
    turn = iter(range(10**6))

    def lay(name, t):
        if name not in targets:
            return in_layout(t, "contiguous")
        if kind == "mixed":
            start = next(turn)
            kinds = [KINDS[(start + i) % len(KINDS)] for i in range(len(KINDS))]
        else:
            kinds = [kind]
        return in_layout(t, next((k for k in kinds if layout_applies(t, k)), "contiguous"))

    is_init = values["is_init"].unsqueeze(-1) if trailing_one else values["is_init"]
    return {
        "cell": values["cell"],
        "x": lay("x", values["x"]),
        "state": [lay("state", s) for s in values["state"]],
        "is_init": lay("is_init", is_init),
        "reset": None if values["reset"] is None else [lay("reset", r) for r in values["reset"]],
        "params": {k: lay("params", p) for k, p in values["params"].items()},
    }


def changed_arguments(values: dict, kind: str, targets: set[str], trailing_one: bool = False) -> list[str]:
    """Names of the arguments that :func:`with_layout` lays out non-contiguously for ``kind``."""
    problem = with_layout(values, kind, targets, trailing_one)
    names = [("x", problem["x"]), *(("state", s) for s in problem["state"]), ("is_init", problem["is_init"])]
    names += [("reset", r) for r in problem["reset"] or []] + [(k, p) for k, p in problem["params"].items()]
    return [n for n, t in names if not t.is_contiguous()]


def grad_leaves(problem: dict) -> list[torch.Tensor]:
    """The differentiable arguments: ``x``, state tensors, reset tensors, params."""
    return [problem["x"], *problem["state"], *(problem["reset"] or []), *problem["params"].values()]


def input_tensors(problem: dict) -> list[torch.Tensor]:
    """Every tensor argument of the call, ``is_init`` included."""
    return grad_leaves(problem) + [problem["is_init"]]


def call(problem: dict, mode: str, backend: str, *, state_given: bool = True, **kwargs):
    """Run ``lstm_*``/``gru_*`` (``mode``: ``"sequence"`` or ``"step"``) on ``problem`` through the public API."""
    cell = problem["cell"]
    state = pack_state(cell, problem["state"]) if state_given else None
    params = TensorDict(problem["params"], batch_size=[])
    if mode == "step":
        return CELLS[cell][1](problem["x"], state, params, is_init=problem["is_init"], backend=backend)
    reset = None if problem["reset"] is None else pack_state(cell, problem["reset"])
    return CELLS[cell][2](
        problem["x"], state, params, is_init=problem["is_init"], reset_state=reset, backend=backend, **kwargs
    )


def outputs_and_grads(problem: dict, mode: str, backend: str, **kwargs) -> tuple[list, list]:
    """All outputs of the call and the gradients of a random-weighted sum of them w.r.t. every
    differentiable argument (zeros where one does not reach the outputs)."""
    outs = flat(call(problem, mode, backend, **kwargs))
    grads = torch.autograd.grad(weighted_sum(outs), grad_leaves(problem), allow_unused=True, materialize_grads=True)
    return [o.detach() for o in outs], list(grads)


def assert_fresh_outputs(outputs: list[torch.Tensor], inputs: list[torch.Tensor], what: str) -> None:
    """No output shares storage with an input, and writing into every output leaves every input unchanged.

    Empty tensors own no memory (their storage pointer can be null for both), so they are skipped.
    """
    for i, out in enumerate(outputs):
        for j, inp in enumerate(inputs):
            if out.numel() and inp.numel():
                assert out.untyped_storage().data_ptr() != inp.untyped_storage().data_ptr(), (
                    f"{what}: output {i} {tuple(out.shape)} shares storage with input {j} {tuple(inp.shape)}"
                )
    before = [t.detach().clone() for t in inputs]
    for out in outputs:
        if out.numel():
            out.detach().add_(1.0)
    for j, (inp, old) in enumerate(zip(inputs, before)):
        assert torch.equal(inp.detach(), old), f"{what}: writing into the outputs changed input {j} {tuple(inp.shape)}"
