"""Free capacity that reports its own changes, so the placement indexes follow in-place updates.

`empty_capacity()` and `copy_capacity()` hand out a `TrackedCapacity`: a plain dict to its users,
whose node dicts (`NodeFree`) mark themselves dirty on every change. Replacing whole node entries
makes the capacity untrusted: every later search then builds fresh indexes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self


class Changes:
    """What changed in a tracked `FreeCapacity` since the indexes last looked, and the indexes."""

    __slots__ = ("context", "dirty", "trusted")

    def __init__(self) -> None:
        self.dirty: set[str] = set()  # node ids whose free capacity changed
        # The search context (`search.SearchContext`) built over this capacity; typed loosely so
        # this module need not import the search that imports it.
        self.context: object | None = None
        # False once whole node entries were replaced: a dict put there is not tracked, so the
        # indexes could go stale; every call then builds fresh ones.
        self.trusted = True


class TrackedCapacity(dict[str, dict[str, int]]):
    """The `FreeCapacity` of `empty_capacity()`: a plain dict to its users."""

    __slots__ = ("ledger",)

    def __init__(self) -> None:
        super().__init__()
        self.ledger = Changes()

    def _untrust(self) -> None:
        self.ledger.trusted = False
        self.ledger.context = None

    def __setitem__(self, key: str, value: dict[str, int]) -> None:
        self._untrust()
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self._untrust()
        super().__delitem__(key)

    def pop(self, *args: Any) -> Any:
        self._untrust()
        return super().pop(*args)

    def popitem(self) -> tuple[str, dict[str, int]]:
        self._untrust()
        return super().popitem()

    def clear(self) -> None:
        self._untrust()
        super().clear()

    def setdefault(self, *args: Any) -> Any:
        self._untrust()
        return super().setdefault(*args)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._untrust()
        super().update(*args, **kwargs)

    # `|=` must be tracked too; typeshed's dict pairs it with `__or__` in a way no subclass can
    # restate, hence the ignore.
    def __ior__(self, other: Any) -> Self:  # type: ignore[override,misc]
        self.update(other)
        return self

    def __reduce__(self) -> Any:
        # Copies and pickles are plain dicts: the indexes belong to this object only.
        return (dict, (dict(self),))


class NodeFree(dict[str, int]):
    """One node's free capacity; every change marks the node dirty for the indexes."""

    __slots__ = ("_dirty", "_node_id")

    def __init__(self, values: Mapping[str, int], node_id: str, dirty: set[str]) -> None:
        super().__init__(values)
        self._node_id = node_id
        self._dirty = dirty

    def __setitem__(self, key: str, value: int) -> None:
        super().__setitem__(key, value)
        self._dirty.add(self._node_id)

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._dirty.add(self._node_id)

    def pop(self, *args: Any) -> Any:
        self._dirty.add(self._node_id)
        return super().pop(*args)

    def popitem(self) -> tuple[str, int]:
        self._dirty.add(self._node_id)
        return super().popitem()

    def clear(self) -> None:
        self._dirty.add(self._node_id)
        super().clear()

    def setdefault(self, *args: Any) -> Any:
        self._dirty.add(self._node_id)
        return super().setdefault(*args)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._dirty.add(self._node_id)
        super().update(*args, **kwargs)

    def __ior__(self, other: Any) -> Self:  # type: ignore[override,misc]  # see TrackedCapacity.__ior__
        self.update(other)
        return self

    def __reduce__(self) -> Any:
        return (dict, (dict(self),))
