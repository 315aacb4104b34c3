"""Module options checked on every assignment, not only by the constructor."""

from __future__ import annotations


def checked_option(name: str) -> property:
    """The option ``name``, held as ``_name``: assigning it calls the owner's ``_check_option(name, value)`` first."""
    private = f"_{name}"

    def get(self):
        return getattr(self, private)

    def set(self, value) -> None:
        self._check_option(name, value)
        object.__setattr__(self, private, value)

    return property(get, set, doc=f"``{name}``, checked on assignment as the constructor checks it.")


def options_state(state: dict, names: tuple[str, ...]) -> dict:
    """A pickled module's ``__dict__`` with the options ``names`` moved to their private names (older pickles)."""
    for name in names:
        if name in state:
            state[f"_{name}"] = state.pop(name)
    return state
