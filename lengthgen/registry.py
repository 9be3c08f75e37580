"""One registry mechanism for tasks and attention backends.

Every class registers the same way, with the registry's ``register()`` decorator. A registry
knows the package that holds its built-ins and imports every module in it on the first lookup,
so a new built-in is one new file there with a decorated class, and no list anywhere names it.
Separate packages add entries through a Python entry-point group, discovered lazily on first
lookup so a broken plugin never costs anything (nor breaks anything) until someone asks for the
list; a script or notebook can call the decorator itself. Ad-hoc local variants are reachable as
``path/to/file.py:ClassName`` or ``package.module:ClassName`` without packaging.

Names read from a result or run folder are data, and a folder may come from someone else: while
:func:`reading_data` is active, a ``file.py:Class`` or ``module:Class`` spec is imported only if
the user named it in this invocation or allowed it (:func:`trusted_plugins`, ``--trust-plugins``);
otherwise the lookup fails with :class:`UntrustedPluginError`. Installed entry points and
built-ins resolve as always.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Generic, TypeVar

from lengthgen.errors import UserError, UserNotice, exception_line

T = TypeVar("T")


class RegistryError(UserError):
    """Base class: every registry problem is a user-facing, one-line message."""


class UnknownNameError(RegistryError, LookupError):
    """Lookup of a name nobody registered; the message lists the valid names."""


class DuplicateNameError(RegistryError):
    """Two registrations under one name; the message names both origins."""


class PluginLoadError(RegistryError):
    """A ``module:Object`` / ``file.py:Object`` spec or an entry point that cannot be used."""


class UntrustedPluginError(RegistryError):
    """A plugin spec named by data (a recorded config) that the user has not allowed."""


#: Set while names come from a folder on disk rather than from the user.
_READING_DATA: ContextVar[bool] = ContextVar("lengthgen_reading_data", default=False)
#: Specs the user allowed in this invocation; ``None`` in the set means every spec.
_ALLOWED: ContextVar[frozenset[str | None]] = ContextVar("lengthgen_allowed_plugins", default=frozenset())


@contextmanager
def reading_data() -> Iterator[None]:
    """Within the block, names come from data: a plugin spec is imported only when allowed."""
    token = _READING_DATA.set(True)
    try:
        yield
    finally:
        _READING_DATA.reset(token)


@contextmanager
def trusted_plugins(specs: Iterable[str | None] = (), *, everything: bool = False) -> Iterator[None]:
    """Within the block, the plugin specs ``specs`` (typed by the user) may be imported while
    reading data, or every spec with ``everything`` (``--trust-plugins``)."""
    allowed = {s for s in specs if s is not None and ":" in s} | ({None} if everything else set())
    token = _ALLOWED.set(_ALLOWED.get() | frozenset(allowed))
    try:
        yield
    finally:
        _ALLOWED.reset(token)


def _check_trusted(kind: str, spec: str) -> None:
    allowed = _ALLOWED.get()
    if _READING_DATA.get() and None not in allowed and spec not in allowed:
        raise UntrustedPluginError(
            f"{kind} {spec!r} is named by a recorded config, and lengthgen does not import code named "
            "by data; install it as a package, or pass --trust-plugins if you trust this folder")


class PluginWarning(UserNotice):
    """A plugin was skipped on purpose (its name belongs to a built-in); the CLI prints it in one line."""


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    origin: str
    builtin: bool


def _origin_of(obj: object) -> str:
    module = getattr(obj, "__module__", "?")
    qualname = getattr(obj, "__qualname__", getattr(obj, "__name__", repr(obj)))
    return f"{module}:{qualname}"


class Registry(Generic[T]):
    """Name → object map for one kind of thing (``task``, ``attention backend``).

    ``validate`` checks that an object has the right shape (e.g. subclasses ``Task``); it raises
    ``TypeError`` with a readable message otherwise. Plugins failing it are reported, not fatal.
    ``builtins`` names the package whose modules define the built-ins (imported on first lookup;
    the import is by name, so the registry never depends on what it finds there).
    """

    def __init__(
        self,
        kind: str,
        group: str,
        validate: Callable[[object], None] | None = None,
        builtins: str | None = None,
    ) -> None:
        self.kind = kind
        self.group = group
        self._validate = validate
        self._builtins = builtins
        self._entries: dict[str, Entry[T]] = {}
        self._plugins_loaded = False
        self._builtins_loaded = False
        #: entry-point name → one-line error, for plugins that failed to load
        self.broken: dict[str, str] = {}

    # -- registration -------------------------------------------------------------------------
    def register(self, name: str | None = None) -> Callable[[T], T]:
        """Decorator registering a class under ``name`` (default: its ``name``): a built-in when its
        module is in the built-in package, else an in-process registration (a script, a notebook)."""

        def decorate(obj: T) -> T:
            key = name or getattr(obj, "name", None)
            if not isinstance(key, str) or not key:
                raise RegistryError(f"cannot register {_origin_of(obj)}: no name given")
            self.add(key, obj, builtin=self._is_builtin(obj))
            return obj

        return decorate

    def _is_builtin(self, obj: object) -> bool:
        module = str(getattr(obj, "__module__", ""))
        return self._builtins is not None and module.startswith(f"{self._builtins}.")

    def add(self, name: str, obj: T, *, builtin: bool = False, origin: str | None = None) -> None:
        """Add one entry; a second registration under the same name is an error."""
        if self._validate is not None:
            self._validate(obj)
        origin = origin or _origin_of(obj)
        existing = self._entries.get(name)
        if existing is not None:
            if existing.obj is obj:
                return
            raise DuplicateNameError(
                f"{self.kind} {name!r} registered twice: by {existing.origin} and by {origin}"
            )
        self._entries[name] = Entry(name, obj, origin, builtin)

    # -- discovery ----------------------------------------------------------------------------
    def _ensure_builtins(self) -> None:
        """Import every module of the built-in package: their decorators register the built-ins."""
        if self._builtins_loaded or self._builtins is None:
            return
        self._builtins_loaded = True
        package = importlib.import_module(self._builtins)
        for module in pkgutil.iter_modules(package.__path__, prefix=f"{self._builtins}."):
            importlib.import_module(module.name)

    def _ensure_plugins(self) -> None:
        self._ensure_builtins()
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        for ep in metadata.entry_points(group=self.group):
            self._load_entry_point(ep)

    def _load_entry_point(self, ep: metadata.EntryPoint) -> None:
        dist = getattr(ep, "dist", None)
        dist_name = getattr(dist, "name", None) if dist is not None else None
        # name the distribution: with two plugins under one name, users must know what to uninstall
        where = f"entry point {ep.name!r} ({ep.value}" + (f", from {dist_name})" if dist_name else ")")
        try:
            obj = ep.load()
            if self._validate is not None:
                self._validate(obj)
        except (Exception, SystemExit) as exc:  # a broken plugin must never break the CLI
            self.broken[ep.name] = exception_line(exc)
            return
        existing = self._entries.get(ep.name)
        if existing is not None:
            if existing.obj is obj:
                return
            if existing.builtin:
                warnings.warn(
                    f"plugin {self.kind} {ep.name!r} from {where} ignored: "
                    f"the built-in {existing.origin} has that name",
                    PluginWarning,
                    stacklevel=2,
                )
                return
            self.broken[ep.name] = (
                f"DuplicateNameError: {self.kind} {ep.name!r} also provided by {existing.origin}"
            )
            return
        self._entries[ep.name] = Entry(ep.name, obj, where, builtin=False)

    # -- lookup -------------------------------------------------------------------------------
    def names(self) -> list[str]:
        self._ensure_plugins()
        return sorted(self._entries)

    def entries(self) -> Iterator[Entry[T]]:
        self._ensure_plugins()
        for name in sorted(self._entries):
            yield self._entries[name]

    def __contains__(self, name: object) -> bool:
        self._ensure_plugins()
        return name in self._entries

    def get(self, name: str) -> T:
        """Object for ``name``, a ``file.py:Object`` path, or a ``module:Object`` spec."""
        self._ensure_builtins()
        if name in self._entries:
            return self._entries[name].obj
        if ":" in name:
            _check_trusted(self.kind, name)
            return load_object(name, self._validate)
        self._ensure_plugins()
        if name in self._entries:
            return self._entries[name].obj
        valid = ", ".join(self.names()) or "(none)"
        hint = f"unknown {self.kind} {name!r}; valid {self.kind}s: {valid}"
        if name in self.broken:
            hint += f" ({name!r} is a plugin that failed to load: {self.broken[name]})"
        raise UnknownNameError(hint)


def load_object(spec: str, validate: Callable[[object], None] | None = None) -> object:
    """Resolve ``path/to/file.py:Name`` or ``package.module:Name`` to the object it names."""
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise PluginLoadError(f"bad spec {spec!r}: expected 'file.py:Name' or 'module:Name'")
    try:
        if target.endswith(".py") or "/" in target or "\\" in target:
            path = Path(target).resolve()
            if not path.is_file():
                raise PluginLoadError(f"bad spec {spec!r}: no such file {str(path)!r}")
            module_name = f"lengthgen_local_{abs(hash(str(path))):x}"
            module = sys.modules.get(module_name)
            if module is None:
                file_spec = importlib.util.spec_from_file_location(module_name, path)
                if file_spec is None or file_spec.loader is None:
                    raise PluginLoadError(f"bad spec {spec!r}: cannot import {str(path)!r}")
                module = importlib.util.module_from_spec(file_spec)
                sys.modules[module_name] = module
                try:
                    file_spec.loader.exec_module(module)
                except BaseException:
                    # never leave a half-initialized module behind for the next lookup to find
                    sys.modules.pop(module_name, None)
                    raise
        else:
            module = importlib.import_module(target)
    except PluginLoadError:
        raise
    except (Exception, SystemExit) as exc:
        raise PluginLoadError(f"cannot load {spec!r}: {exception_line(exc)}") from exc
    try:
        obj = getattr(module, attr)
    except AttributeError:
        names = sorted(n for n, v in vars(module).items() if inspect.isclass(v))
        raise PluginLoadError(
            f"bad spec {spec!r}: no {attr!r} in {target!r}; classes there: {', '.join(names)}"
        ) from None
    if validate is not None:
        try:
            validate(obj)
        except TypeError as exc:
            raise PluginLoadError(f"cannot use {spec!r}: {exc}") from None
    return obj
