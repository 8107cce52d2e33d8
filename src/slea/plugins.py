"""Name -> object registries, and the plugins that fill them from outside the package.

Algorithms, policy losses and experience extractors register under a name with a decorator where they are
defined; a user's module does the same and is named in a config (``plugins: [my_pkg.my_module]``), or one of its
objects is named directly as ``"my_pkg.my_module:my_function"``. Names are case-insensitive and ``-`` equals
``_``. An unknown name is a :class:`KeyError` listing the known ones. Imports only the standard library.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

T = TypeVar("T")
O = TypeVar("O")  # a decorated object, returned as it is
MARK = "__slea_registered__"  # on a registered object: {registry kind: name}


def import_plugin(module: str) -> None:
    """Import a user's module so its decorators register what it defines; ``ImportError`` says which failed.
    The working directory is searched last (as ``python -m`` does), so ``plugins: [my_algos]`` finds
    ``./my_algos.py`` from the ``slea`` command too."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001  (any failure of the user's module is reported in one line)
        raise ImportError(f"cannot import plugin module {module!r} ({type(exc).__name__}: {exc})") from None


def norm_name(name: str, kind: str = "name") -> str:
    if not isinstance(name, str) or not name.strip():
        raise TypeError(f"a {kind} name must be a non-empty string, got {name!r}")
    return name.strip().lower().replace("-", "_")


class Registry(Generic[T]):
    """Registered objects of one ``kind``; ``builtins`` are the modules that register the built-in ones (imported
    on the first lookup that misses, so importing a registry stays cheap)."""

    def __init__(self, kind: str, builtins: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.builtins = builtins
        self._items: dict[str, T] = {}
        self._owners: dict[str, object] = {}

    def add(self, name: str, item: T, *, owner: object = None, replace: bool = False) -> str:
        """Register ``item`` as ``name``; ``owner`` (the decorated function or class, default ``item``) is marked
        so ``"module:attr"`` finds it. A name already taken by another object is an error unless ``replace``."""
        key = norm_name(name, self.kind)
        owner = item if owner is None else owner
        old = self._owners.get(key)
        if old is not None and old is not owner and not replace:
            raise ValueError(f"{self.kind} {key!r} is already registered (by {getattr(old, '__qualname__', old)})")
        self._items[key] = item
        self._owners[key] = owner
        try:
            marks = dict(getattr(owner, MARK, {}))
            marks[self.kind] = key
            setattr(owner, MARK, marks)
        except (AttributeError, TypeError):  # an object that takes no attributes is found by name only
            pass
        return key

    def remove(self, name: str) -> None:
        """Forget ``name`` (tests that register a throw-away object clean up with this)."""
        key = norm_name(name, self.kind)
        self._items.pop(key, None)
        self._owners.pop(key, None)

    def decorator(self, name: str, *, replace: bool = False,
                  wrap: Callable[[Any], T] | None = None) -> Callable[[O], O]:
        """A decorator registering the decorated object (or ``wrap(obj)``) as ``name``; returns the object."""
        def deco(obj: O) -> O:
            item = cast(T, obj) if wrap is None else wrap(obj)  # without ``wrap`` the object is the item
            self.add(name, item, owner=obj, replace=replace)
            return obj

        return deco

    def get(self, name: str) -> T:
        """The object registered as ``name``, or as ``"module:attr"`` (importing ``module``)."""
        if isinstance(name, str) and ":" in name:
            return self._from_module(name)
        key = norm_name(name, self.kind)
        if key not in self._items:
            self._import_builtins()
        try:
            return self._items[key]
        except KeyError:
            raise KeyError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names()) or '(none)'}") from None

    def names(self) -> list[str]:
        """Sorted names of everything registered (built-ins included)."""
        self._import_builtins()
        return sorted(self._items)

    def builtin_names(self) -> list[str]:
        """Sorted names that the built-in modules registered (a plugin's or a test's left out)."""
        self._import_builtins()
        return sorted(k for k, owner in self._owners.items() if getattr(owner, "__module__", None) in self.builtins)

    def _import_builtins(self) -> None:
        for module in self.builtins:
            importlib.import_module(module)

    def _from_module(self, ref: str) -> T:
        module, _, attr = (part.strip() for part in ref.partition(":"))
        import_plugin(module)
        obj = getattr(importlib.import_module(module), attr, None)
        if obj is None:
            raise KeyError(f"{self.kind} {ref!r}: module {module!r} has no {attr!r}")
        key = getattr(obj, MARK, {}).get(self.kind)
        if key is None:
            raise KeyError(f"{self.kind} {ref!r} is not registered as a {self.kind}")
        return self._items[key]
