"""The canonical call every backend serves, and what each backend needs from a cell.

A sequence backend is ``sequence(layout, params, x, carry, is_init, reset, opts) -> (y, carry_T, per_step)`` on a
validated, flattened call with ``N, T > 0``: ``x [N, T, F]``, ``carry`` a tuple of ``[N, L, S]``
(``layout.cell.state_names``), ``is_init [N, T]`` bool or ``None``, ``reset`` a tuple of ``[N, T, L, S]`` or
``None``. It returns ``y [N, T, P]``, the carry after the last step and, with ``opts.segment_states``, per-step
carries ``[N, T, L, S]`` exact at least at every segment end (else ``None``). ``pad.sequence`` serves resets at
``t = 0`` only (:mod:`.segments` lays out the others). A step backend is ``step(layout, params, x [N, F], carry) ->
(y [N, P], carry')``, the resets applied."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from itertools import product
from typing import NamedTuple

import torch

from ..cells import Cell

BACKENDS = ("reference", "scan", "pad", "triton", "parallel")
RECOMPUTE_MODES = ("none", "full")


class CallContext(NamedTuple):
    """Where a call runs, read once by the functional layer: under ``torch.compile`` or ``torch.jit.trace``,
    ``torch.vmap``, eager ``torch.func`` autodiff or forward-mode AD (``differentiated``), forward-mode AD alone;
    ``traced`` when any holds (eager-only kernels cannot run). A named tuple: Dynamo cannot build a dataclass."""

    compiling: bool
    vmapped: bool
    differentiated: bool
    forward: bool = False
    traced: bool = False

    @classmethod
    def of(cls, compiling: bool, vmapped: bool, differentiated: bool, forward: bool = False) -> CallContext:
        return cls(compiling, vmapped, differentiated, forward, compiling or vmapped or differentiated)


# every context is one of these: a call builds none (a policy step reads its context on every call)
CONTEXTS = {key: CallContext.of(*key) for key in product((False, True), repeat=4)}


def replayed_vjp(fn, args: tuple, cotangents: tuple) -> list:
    """A hand-written backward's replacement when autograd records it (``create_graph=True``): the vjp of ``fn(*args)``
    replayed with plain ops (every higher order exact) by the recording AD system (``torch.func``'s or autograd's).
    ``None`` entries of ``args`` (absent weights) stay fixed and get ``None``; ``None`` cotangents are zeros."""
    present = [i for i, t in enumerate(args) if t is not None]

    def of_present(*tensors):
        given = iter(tensors)
        return fn(*[None if t is None else next(given) for t in args])

    if torch._C._functorch.get_interpreter_stack():  # torch.func (grad of grad, hessian): its vjp composes
        out, pullback = torch.func.vjp(of_present, *(args[i] for i in present))
    else:  # plain autograd, whose saved-tensor hooks (save_on_cpu) torch.func refuses: the replay's own graph
        inputs = [args[i] if args[i].requires_grad else args[i].detach().requires_grad_() for i in present]
        with torch.enable_grad():
            out = of_present(*inputs)
        pullback = partial(torch.autograd.grad, out, inputs, create_graph=True, allow_unused=True,
                           materialize_grads=True)
    found = iter(pullback(tuple(torch.zeros_like(o) if g is None else g for o, g in zip(out, cotangents))))
    return [None if t is None else next(found) for t in args]


@dataclass(frozen=True)
class SequenceOptions:
    """Per-call options every backend receives (validated by the functional layer). ``compute_dtype`` and
    ``matmul_precision`` are ``triton``'s; the others compute in the params' dtype at full precision."""

    dropout: float = 0.0
    training: bool = False
    recompute: str = "none"  # "none" or "full": recompute activations in backward
    compute_dtype: torch.dtype | None = None  # operand dtype of the recurrent matmul (triton)
    matmul_precision: str | None = None  # see rnn_functional.precision (triton)
    segment_states: bool = False  # also return the per-step carries (exact at segment ends)
    context: CallContext = CONTEXTS[False, False, False, False]  # where the call runs

    def without_segment_states(self) -> SequenceOptions:
        """These options asking for no per-step carries (themselves when they ask for none: most calls)."""
        # by position: dataclasses.replace is slower on a tiny call, and Dynamo cannot trace a dataclass's __dict__
        if not self.segment_states:
            return self
        return SequenceOptions(self.dropout, self.training, self.recompute, self.compute_dtype, self.matmul_precision,
                               False, self.context)


def backends_for(cell: Cell) -> list[str]:
    """The backends that can run ``cell``: ``reference`` and ``scan`` any; ``pad`` needs its ATen kernels,
    ``triton`` its Triton kernel family, ``parallel`` a cell linear in its state."""
    hooks = {"pad": cell.aten, "triton": cell.triton, "parallel": cell.linear_in_state or None}
    return [name for name in BACKENDS if hooks.get(name, True) is not None]


def no_kernel_for(backend: str, cell: Cell, serving: list[str] | None = None) -> ValueError:
    """The error a backend raises for a cell it has no kernel for (``parallel``: a cell not linear in its state);
    ``serving``: the backends to name (default: every one that runs the cell, :func:`backends_for`)."""
    why = (f"it solves recurrences linear in the state (h' = a * h + b, a and b from the input alone: minGRU, RG-LRU), "
           f"and the {cell.title}'s is not" if backend == "parallel" else f"it has no {backend} kernel for it")
    return ValueError(f"backend {backend!r} cannot serve the {cell.title} cell: {why}. Use one of "
                      f"{serving or backends_for(cell)} (or backend='auto', which picks one that can).")
