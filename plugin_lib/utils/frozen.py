"""Parsed settings that refuse to change in place: ``freeze(value)``.

profiles.yaml is parsed once per process (``harness.profile.settings``) and its entries are hashed
into run keys, so a change made in place by any reader (transformers once wrote into a twin's
``rope_scaling`` there) would move every later key without a word. Frozen, such a change raises
at the line that makes it. The frozen types are ``dict`` and ``list`` subclasses, so readers,
``json.dumps`` (the same text, so the same keys) and ``isinstance`` checks see what they saw; a
copy (``dict(x)``, ``{**x}``, ``copy.deepcopy``, pickling) is plain and free to change.
"""
from __future__ import annotations

import copy
from typing import Any, NoReturn

_ADVICE = ("is shared by every reader in this process and hashed into run keys, so it cannot be changed in "
           "place: change a copy (copy.deepcopy gives plain dicts and lists)")


class FrozenDict(dict):
    """A ``dict`` whose every change in place raises ``TypeError``."""

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(f"This mapping of parsed settings {_ADVICE}.")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse

    def __copy__(self) -> dict:
        return dict(self)

    def __deepcopy__(self, memo: dict) -> dict:
        return {copy.deepcopy(k, memo): copy.deepcopy(v, memo) for k, v in self.items()}

    def __reduce__(self):
        return dict, (dict(self),)


class FrozenList(list):
    """A ``list`` whose every change in place raises ``TypeError``."""

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(f"This list of parsed settings {_ADVICE}.")

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = clear = extend = insert = pop = remove = reverse = sort = _refuse

    def __copy__(self) -> list:
        return list(self)

    def __deepcopy__(self, memo: dict) -> list:
        return [copy.deepcopy(v, memo) for v in self]

    def __reduce__(self):
        return list, (list(self),)


def freeze(value: Any) -> Any:
    """``value`` (parsed YAML or JSON) with every dict and list in it, at any depth, frozen."""
    if isinstance(value, dict):
        return FrozenDict((k, freeze(v)) for k, v in value.items())
    if isinstance(value, list):
        return FrozenList(freeze(v) for v in value)
    return value
