"""Module options checked on every assignment, not only by the constructor."""

from __future__ import annotations


def checked_option(name: str) -> property:
    """The module option ``name``, held as ``_name``; assigning it calls the owner's ``_check_option(name, value)``
    first, which raises as the constructor does. A later ``module.recurrent_backend = "cudnn"`` then fails there,
    naming the option and its choices, rather than as a ``KeyError`` deep in the next call or, for an option only
    some backends read, not at all."""
    private = f"_{name}"

    def get(self):
        return getattr(self, private)

    def set(self, value) -> None:
        self._check_option(name, value)
        object.__setattr__(self, private, value)

    return property(get, set, doc=f"``{name}``, checked on assignment as the constructor checks it.")


def options_state(state: dict, names: tuple[str, ...]) -> dict:
    """A pickled module's ``__dict__`` with the options ``names`` under their private names: a module pickled whole
    before they were :func:`checked_option` properties holds them under their public names."""
    for name in names:
        if name in state:
            state[f"_{name}"] = state.pop(name)
    return state
