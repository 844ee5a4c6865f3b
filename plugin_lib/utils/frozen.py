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


class _Frozen:
    """What the frozen types share: changes refused, copies of the plain type (``_plain``)."""

    _plain: type

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(f"This {self._plain.__name__} of parsed settings {_ADVICE}.")

    def __copy__(self):
        return self._plain(self)

    def __deepcopy__(self, memo: dict):
        return copy.deepcopy(self._plain(self), memo)  # its frozen items copy plain in turn

    def __reduce__(self):
        return self._plain, (self._plain(self),)


class FrozenDict(_Frozen, dict):
    """A ``dict`` whose every change in place raises ``TypeError``."""

    _plain = dict
    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _Frozen._refuse


class FrozenList(_Frozen, list):
    """A ``list`` whose every change in place raises ``TypeError``."""

    _plain = list
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _Frozen._refuse
    append = clear = extend = insert = pop = remove = reverse = sort = _Frozen._refuse


def freeze(value: Any) -> Any:
    """``value`` (parsed YAML or JSON) with every dict and list in it, at any depth, frozen."""
    if isinstance(value, dict):
        return FrozenDict((k, freeze(v)) for k, v in value.items())
    if isinstance(value, list):
        return FrozenList(freeze(v) for v in value)
    return value
