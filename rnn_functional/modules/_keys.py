"""Constructor key validation of ``LSTMModule``/``GRUModule``: TorchRL's rules and exception classes."""

from __future__ import annotations

from collections.abc import Sequence

from tensordict import unravel_key_list
from tensordict.utils import NestedKey

from ._cells import ModuleCell

__all__ = ["resolve_keys"]


def _key_list(owner: str, arg: str, keys, n: int, what: str) -> list[NestedKey]:
    if not isinstance(keys, (list, tuple)):
        # TorchRL passes the value to tensordict's unravel_key_list, whose binding raises this TypeError
        raise TypeError(
            f"{owner}: incompatible function arguments: {arg} must be a list or tuple of {n} keys ({what}), "
            f"got {type(keys).__name__} {keys!r}. Use {arg[:-1]}={keys!r} to name only the "
            f"{'input' if arg == 'in_keys' else 'output'} and keep the default hidden-state keys."
        )
    return unravel_key_list(list(keys))


def resolve_keys(
    cell: ModuleCell,
    in_key: NestedKey | None,
    in_keys: Sequence[NestedKey] | None,
    out_key: NestedKey | None,
    out_keys: Sequence[NestedKey] | None,
) -> tuple[list[NestedKey], list[NestedKey]]:
    """``(in_keys, out_keys)``: ``[input, *hidden, "is_init"]`` and ``[output, *("next", hidden)]``.

    Exactly one of ``in_key``/``in_keys`` (and of ``out_key``/``out_keys``) is given; a single
    key gets TorchRL's default hidden-state keys. ``"is_init"`` is appended when absent.
    """
    owner, n = cell.module_name, 1 + len(cell.state_names)
    what = f"a value and {len(cell.state_names)} hidden state(s) {cell.state_names}"
    if not ((in_key is None) ^ (in_keys is None)):
        raise ValueError(
            f"Either in_keys or in_key must be specified but not both or none. "
            f"Got {in_keys} and {in_key} respectively."
        )
    if not ((out_key is None) ^ (out_keys is None)):
        raise ValueError(
            f"Either out_keys or out_key must be specified but not both or none. "
            f"Got {out_keys} and {out_key} respectively."
        )
    if in_key is not None:
        in_keys = [in_key, *cell.default_in_keys]
    if out_key is not None:
        out_keys = [out_key, *cell.default_out_keys]
    in_keys = _key_list(owner, "in_keys", in_keys, n, what)
    out_keys = _key_list(owner, "out_keys", out_keys, n, what)
    if len(in_keys) != n and not (len(in_keys) == n + 1 and in_keys[-1] == "is_init"):
        raise ValueError(
            f"{owner} expects {n} inputs: {what} (and optionally a final 'is_init' marker). "
            f"Got in_keys {in_keys} instead."
        )
    if len(out_keys) != n:
        raise ValueError(f"{owner} expects {n} outputs: {what}. Got out_keys {out_keys} instead.")
    if "is_init" not in in_keys:
        in_keys = in_keys + ["is_init"]
    return in_keys, out_keys
