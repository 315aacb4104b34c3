"""The modules' forward: read and check TensorDict entries, then one call of the functional core.

Shapes (``*B`` batch dims, ``T`` time, ``L`` layers, ``S`` a state's width): input
``[*B, F]`` (step) or ``[*B, T, F]`` (sequence); states ``[*B, L, S]`` / ``[*B, T, L, S]``;
``is_init`` bool ``[*B]`` or ``[*B, 1]`` (``T`` included in recurrent mode).
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey

from ..backends import SequenceOptions
from ..cells import Layout
from ..functional._core import check_dtype_device, current_layout, execute, flatten, restore, run_validated_step
from ._cells import ModuleCell

__all__ = ["bound_layout", "read_inputs", "run_step", "run_sequence", "write_outputs"]

Tensor = torch.Tensor
States = tuple[Tensor, ...]


def _keys_of(td: TensorDictBase) -> list:
    return list(td.keys(include_nested=True, leaves_only=True))


def read_inputs(
    cell: ModuleCell,
    td: TensorDictBase,
    in_keys: list[NestedKey],
    input_size: int,
    state_shapes: tuple[tuple[int, int], ...],
    recurrent: bool,
) -> tuple[Tensor, States | None, Tensor]:
    """``(x, states or None (zeros), is_init)`` from ``td``, each checked against the input's dims.

    Every error names the key, the shape the TensorDict holds, the expected one and the fix.
    """
    owner, n = cell.module_name, len(cell.state_names)
    input_key, hidden_keys, init_key = in_keys[0], in_keys[1 : 1 + n], in_keys[-1]
    if recurrent and td.ndim == 0:
        raise ValueError(
            f"{owner} in recurrent mode needs a TensorDict with at least one batch dim (time, the "
            f"last one); got batch_size {list(td.batch_size)}. Use sequential mode for single steps."
        )
    x = td.get(input_key, None)
    if x is None:
        raise KeyError(
            f"{owner}: input key {input_key!r} not found in the TensorDict (keys: {_keys_of(td)}). "
            f"Store the input there ([*batch{', T' if recurrent else ''}, {input_size}]) or name its key with "
            f"in_key=... / in_keys=[...]."
        )
    if x.ndim == 0 or x.shape[-1] != input_size:
        raise ValueError(
            f"{owner}: input key {input_key!r} holds shape {list(x.shape)}; expected [*batch"
            f"{', T' if recurrent else ''}, {input_size}] (input_size={input_size} features last)."
        )
    lead = tuple(x.shape[:-1])
    dims = "[*batch, T" if recurrent else "[*batch"
    is_init = td.get(init_key, None)
    if is_init is None:
        raise KeyError(
            f"{owner}: key {init_key!r} not found in the TensorDict (keys: {_keys_of(td)}). It marks "
            f"trajectory starts: add torchrl.envs.InitTracker() to the env (Collector(..., "
            f"auto_register_policy_transforms=True) does), or set it yourself (bool {list(lead) + [1]})."
        )
    if is_init.dtype != torch.bool:
        raise TypeError(
            f"{owner}: key {init_key!r} holds dtype {is_init.dtype}; expected torch.bool. Store "
            f"td[{init_key!r}] = td[{init_key!r}].bool()."
        )
    if tuple(is_init.shape) not in (lead, (*lead, 1)):
        raise ValueError(
            f"{owner}: key {init_key!r} holds shape {list(is_init.shape)}; expected {list(lead) + [1]} or "
            f"{list(lead)} ({dims}(, 1)], the input's leading dims). Store one flag per "
            f"{'step' if recurrent else 'batch element'}."
        )
    states = tuple(td.get(key, None) for key in hidden_keys)
    missing = [key for key, s in zip(hidden_keys, states) if s is None]
    if len(missing) == n:
        return x, None, is_init  # zeros, as TorchRL
    if missing:
        raise RuntimeError(
            f"{owner}: hidden state keys {missing} are missing while "
            f"{[k for k in hidden_keys if k not in missing]} are present; provide all of {hidden_keys} or "
            f"none (zeros)."
        )
    for key, state, (layers, width) in zip(hidden_keys, states, state_shapes):
        if tuple(state.shape) != (*lead, layers, width):
            hint = (
                f" It lacks the layer dim: store td[{key!r}] = td[{key!r}].unsqueeze(-2)."
                if tuple(state.shape) == (*lead, width) and layers == 1
                else " Build env hidden states with module.make_tensordict_primer()."
            )
            raise ValueError(
                f"{owner}: hidden state key {key!r} holds shape {list(state.shape)}; expected "
                f"{[*lead, layers, width]} ({dims}, num_layers, {width}]).{hint}"
            )
    return x, states, is_init


def bound_layout(cell: ModuleCell, params, layout: Layout | None, x: Tensor, states: States | None,
                 in_keys: list[NestedKey], state_shapes: tuple[tuple[int, int], ...],
                 owner: str | None = None) -> tuple[dict, Layout]:
    """``(params as a dict, their layout)``, with ``x`` and ``states`` (already checked against the module's
    configuration by :func:`read_inputs`) checked against the params' dtype, device and sizes.

    ``layout``: the layout of the module's own weights, checked when they were bound; other params
    (``functional_call``, ``TensorDict.to_module``, an ensemble's members) are read and checked here.
    """
    params = params if isinstance(params, dict) else dict(params.items())
    layout = current_layout(cell.core, params, layout)
    owner = owner or cell.module_name  # the error's prefix: the calling module's class
    if layout.input_size != x.shape[-1] or tuple(zip((layout.num_layers,) * len(layout.state_sizes),
                                                     layout.state_sizes)) != tuple(state_shapes):
        raise ValueError(
            f"{owner}: the weights are for input_size={layout.input_size}, num_layers={layout.num_layers} and state "
            f"widths {list(layout.state_sizes)}, but the module is built for input_size={x.shape[-1]}, states "
            f"{[list(s) for s in state_shapes]}. Load weights of the module's sizes (or build the module for these)."
        )
    for key, t in zip(in_keys, (x, *(states or ()))):
        check_dtype_device(t, f"{owner}: key {key!r}", layout,
                           "Convert the TensorDict (td.to(...)) or the module (module.to(...)).")
    return params, layout


def run_sequence(
    x: Tensor,
    first: States | None,
    resets: States | None,
    params: dict[str, Tensor],
    layout: Layout,
    is_init: Tensor | None,
    *,
    backend: str,
    slice_len: int | None = None,
    num_slices: int | None = None,
    **options,
) -> tuple[Tensor, States]:
    """``(y [*B, T, P], segment states [*B, T, L, S])``: the core's :func:`~rnn_functional.functional._core.execute`
    on the checked call (:func:`read_inputs`, :func:`bound_layout`).

    ``first``: states before ``t = 0``; ``resets``: stored per-step states restarted from where
    ``is_init`` (zeros without them). The segment states hold each segment's final state at its
    last step and zeros elsewhere (TorchRL's ``("next", hidden)`` layout). ``options``: the
    core's :class:`~rnn_functional.backends.SequenceOptions` (``dropout``, ``training``, ...).
    """
    c = flatten(layout, params, x, first, is_init, resets)
    out = execute(c, backend, SequenceOptions(**options, segment_states=True), slice_len, num_slices)
    y, *segment = restore(c.batch_shape, (out.y, *out.segment))
    return y, tuple(segment)


def run_step(
    cell: ModuleCell,
    x: Tensor,
    states: States | None,
    params: dict[str, Tensor],
    is_init: Tensor | None,
    *,
    dropout: float,
    training: bool,
    backend: str | None,
    layout: Layout | None = None,
) -> tuple[Tensor, States]:
    """``(y [*B, P], states [*B, L, S])``: one step, zero states where ``is_init``; ``y`` shares no memory with the
    states (the core's step returns the top layer's ``h`` as both, as ``nn.LSTMCell`` does; TorchRL's module returns
    two tensors, and an in-place op on ``y``, e.g. ``nn.ReLU(inplace=True)`` next in a policy, must not rewrite the
    state carried to the next step).

    ``layout``: the params' layout when the caller checked them (the module's own weights, checked
    when bound) and ``read_inputs`` checked the rest: the step then skips the core's validation
    (:func:`~rnn_functional.functional._core.run_validated_step`), which is what a compiled policy
    step pays for in guards on every call.
    The core's step functions have no dropout: a training step with dropout runs as a
    length-1 sequence (same reset, inter-layer dropout) on the sequence ``backend`` (read only
    then; ``None`` is fine otherwise).
    """
    if not (training and dropout > 0):
        if layout is not None and states is not None and x.numel() > 0:
            y, new = run_validated_step(layout, params, x, states, is_init)
            return y.clone(), new
        y, state = cell.step(x, cell.pack(states), params, is_init=is_init)
        return y.clone(), cell.unpack(state)
    if is_init is not None and is_init.shape == x.shape[:-1]:
        is_init = is_init.unsqueeze(-1)  # [*B] -> [*B, T=1]
    y, state = cell.sequence(
        x.unsqueeze(-2), cell.pack(states), params, is_init=is_init, backend=backend, dropout=dropout, training=True
    )
    return y.squeeze(-2), cell.unpack(state)


def write_outputs(td: TensorDictBase, out_keys: list[NestedKey], y: Tensor, states: States) -> TensorDictBase:
    """Write ``y`` and the states at ``out_keys`` (``[output, *hidden]``) into ``td``; returns ``td``."""
    td.set(out_keys[0], y)
    for key, value in zip(out_keys[1:], states):
        td.set(key, value)
    return td
