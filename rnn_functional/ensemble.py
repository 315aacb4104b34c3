"""Ensembles: E parameter sets stacked on a leading dim (``batch_size [E]``) for ``torch.vmap`` (docs/ensembles.md)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from tensordict import TensorDict, TensorDictBase

from .params import init_gru_params, init_lstm_params

__all__ = ["stack_params", "unstack_params", "ensemble_init_lstm_params", "ensemble_init_gru_params"]


def stack_params(params_list: Sequence[Mapping[str, torch.Tensor]]) -> TensorDict:
    """Stack E members' params into one TensorDict with a leading ensemble dim.

    Args:
        params_list: E params TensorDicts (or mappings) with identical keys, shapes, dtype and device.

    Returns:
        A TensorDict of ``batch_size [E]`` whose entries are ``[E, *member_shape]``, in new storage
        (``torch.stack`` of the members; differentiable where the members require grad).
    """
    if isinstance(params_list, (Mapping, torch.Tensor)) or not isinstance(params_list, Sequence):
        raise TypeError(f"params_list: expected a list of params TensorDicts, got {type(params_list).__name__}. "
                        "Wrap a single member in a list: stack_params([params]).")
    if len(params_list) == 0:
        raise ValueError("params_list: expected at least one member, got an empty list.")
    members = []
    for i, params in enumerate(params_list):
        if not isinstance(params, Mapping):
            raise TypeError(f"params_list[{i}]: expected a params TensorDict (or a mapping of tensors), got "
                            f"{type(params).__name__}.")
        members.append(params if isinstance(params, TensorDictBase) else TensorDict(dict(params), batch_size=[]))
    keys = set(members[0].keys())
    for i, member in enumerate(members[1:], start=1):
        if set(member.keys()) != keys:
            missing, extra = sorted(keys - set(member.keys())), sorted(set(member.keys()) - keys)
            raise ValueError(f"params_list[{i}]: keys differ from params_list[0] (missing {missing}, extra {extra}); "
                             "every member must have the same architecture.")
        for key in sorted(keys):
            a, b = members[0][key], member[key]
            if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
                raise ValueError(f"params_list[{i}][{key!r}]: expected shape {list(a.shape)}, dtype {a.dtype} on "
                                 f"{a.device} (as params_list[0]), got shape {list(b.shape)}, dtype {b.dtype} on "
                                 f"{b.device}.")
    return torch.stack([m.select(*sorted(keys)) for m in members], dim=0)


def unstack_params(params: TensorDictBase) -> list[TensorDictBase]:
    """The E members of stacked params, as views (``params[i]`` for each ``i``).

    Args:
        params: a stacked params TensorDict with ``batch_size [E, ...]``.
    """
    if not isinstance(params, TensorDictBase):
        raise TypeError(f"params: expected a stacked params TensorDict, got {type(params).__name__}.")
    if params.batch_dims == 0:
        raise ValueError("params: expected stacked params with a leading ensemble dim (batch_size [E]), got batch_size "
                         "[]. Build them with stack_params([...]) or ensemble_init_*_params(E, ...).")
    return list(params.unbind(0))


def _ensemble_init(init: Callable[..., TensorDict], num_members: int, *args, **kwargs) -> TensorDict:
    if isinstance(num_members, bool) or not isinstance(num_members, int) or num_members < 1:
        raise ValueError(f"num_members: expected a positive int, got {num_members!r}.")
    return stack_params([init(*args, **kwargs) for _ in range(num_members)])


def ensemble_init_lstm_params(
    num_members: int, input_size: int, hidden_size: int, num_layers: int = 1, *, bias: bool = True,
    proj_size: int = 0, dtype: torch.dtype | None = None, device: torch.device | str | None = None,
    generator: torch.Generator | None = None,
) -> TensorDict:
    """E independently initialised LSTMs (each like :func:`init_lstm_params`), stacked: ``batch_size [E]``. Member
    ``i`` equals the ``i``-th of E successive ``init_lstm_params`` calls drawing from ``generator``."""
    return _ensemble_init(init_lstm_params, num_members, input_size, hidden_size, num_layers, bias=bias,
                          proj_size=proj_size, dtype=dtype, device=device, generator=generator)


def ensemble_init_gru_params(
    num_members: int, input_size: int, hidden_size: int, num_layers: int = 1, *, bias: bool = True,
    dtype: torch.dtype | None = None, device: torch.device | str | None = None,
    generator: torch.Generator | None = None,
) -> TensorDict:
    """E independently initialised GRUs (each like :func:`init_gru_params`), stacked: ``batch_size [E]``. Member
    ``i`` equals the ``i``-th of E successive ``init_gru_params`` calls drawing from ``generator``."""
    return _ensemble_init(init_gru_params, num_members, input_size, hidden_size, num_layers, bias=bias, dtype=dtype,
                          device=device, generator=generator)
