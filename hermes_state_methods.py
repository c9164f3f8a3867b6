"""The facade's method table: each public method named by one line (`Entry`/`Lookup`), built at first read.

Owns: `Entry` (one table line: the transaction kind, the module function, what a read answers
for an unknown key, which keywords are packed into a dict) and `Lookup` (a read by key, whose
answer for an unknown key is the empty value of its return type); the methods they generate (the
module function's signature without `conn`, its docstring, for help(), inspect and editors); the
lone-surrogate rule for reads; `same_arguments` (one parameter list for two methods); the first
use of what the table names (`deferred_imports`: a block of ordinary import statements whose
modules load at their first use, and `Pending`: a class attribute built at its first read), which
keep `import hermes_state` from importing and inspecting every module the table names; and the
async twins AsyncSessionDB is made of (`AsyncFacade`, `add_async_twins`).
Does not own: running a table method (`hermes_state_handle.Handle._run` turns a kind into its
transaction), what a module function does.
"""
from __future__ import annotations

import builtins
import copy
import functools
import importlib
import inspect
import itertools
import sys
import threading
import types
import typing
from contextlib import contextmanager
from typing import (TYPE_CHECKING, Any, AsyncIterator, Callable, Concatenate, Generic, Iterator, Literal, ParamSpec,
                    TypeVar)

from hermes_state_common import has_surrogate

P = ParamSpec("P")  # one per line: checkers take a type variable only from its own assignment
R = TypeVar("R")
Kind = Literal["read", "snapshot", "write", "transcript", "compression", "activity"]
KINDS = ("read", "snapshot", "write", "transcript", "compression", "activity")
READS = ("read", "snapshot")
# The modules' injected clock: a module's own tests pass it, a caller of the facade never does.
MODULE_ONLY = frozenset({"now"})
ASK = object()  # no answer declared for an unknown key: the module function answers itself


# --- first use: modules imported, and class attributes built, when they are first needed ---------------
# `import hermes_state` used to import every module the method table names and read ~150
# signatures; most programs use a handful of methods. A module is now imported at its first use
# and a table method built at its first read, by the same code, so what a caller sees is unchanged.

class Deferred:
    """A function of a sibling module that is not imported yet; calling it imports the module."""

    __slots__ = ("later", "name")

    def __init__(self, later: Later, name: str):
        self.later, self.name = later, name

    def resolve(self) -> Any:
        """Import the module (once) and return the attribute this names."""
        return getattr(self.later.load(), self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<{self.later.module_name}.{self.name}, imported at first use>"


class Later:
    """A sibling module bound to a name of a module's namespace, imported at its first use (see `deferred_imports`).

    Before the module is imported, an attribute read gives a `Deferred` reference to it (so a
    method table line can name a function without importing its module); once the module is
    imported, by anyone, a read gives the module's own attribute and binds the name to the module
    itself, so later reads cost what a module attribute costs. A constant is therefore read only
    where its module is imported already; Python's import lock makes the first import run once.
    """

    def __init__(self, namespace: dict[str, Any], alias: str, module_name: str):
        self.namespace, self.alias, self.module_name = namespace, alias, module_name

    def load(self) -> types.ModuleType:
        """Import the module (once) and bind the name to it; return it."""
        module = importlib.import_module(self.module_name)
        if self.namespace.get(self.alias) is self:
            self.namespace[self.alias] = module
        return module

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and inspect probe for dunder names: not module attributes
            raise AttributeError(name)
        return getattr(self.load(), name) if self.module_name in sys.modules else Deferred(self, name)

    def __repr__(self) -> str:
        return f"<module {self.module_name!r}, imported at first use>"


# The threads inside a `deferred_imports` block, each with its namespace; the import hook is
# installed while any is, so the blocks of two threads cannot undo each other's.
_DEFERRING: dict[int, dict[str, Any]] = {}
_HOOK = threading.Lock()
_ORIGINAL_IMPORT: list[Callable[..., Any]] = []  # what builtins.__import__ was when the hook went in


def _importing(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
    namespace = _DEFERRING.get(threading.get_ident())
    if namespace is not None and level == 0 and name.startswith("hermes_state_") and name not in sys.modules:
        return Later(namespace, "", name)
    return _ORIGINAL_IMPORT[0](name, globals, locals, fromlist, level)


@contextmanager
def deferred_imports(namespace: dict[str, Any]) -> Iterator[dict[str, tuple[str, str]]]:
    """Run a block of imports of library modules whose modules load at their first use; yield the lazy names.

    The block holds ordinary `import hermes_state_x as x` and `from hermes_state_x import y`
    statements, so type checkers and editors see plain imports ("go to definition" on a table
    line's `x.f` lands on the module function). At run time, in the importing thread, a library
    module not imported yet is bound as a `Later` instead, and a name from-imported from one is
    taken out of `namespace` and entered in the yielded dict ({name: (module, its name there)})
    when the block ends, for the module's `__getattr__` to import at its first read. A module
    imported already is bound as it is. Other threads' imports are not affected.
    """
    lazy: dict[str, tuple[str, str]] = {}
    thread = threading.get_ident()
    # builtins.__import__ is the documented hook of the import statement; it is ours only while a block runs.
    with _HOOK:
        if not _DEFERRING:
            _ORIGINAL_IMPORT[:] = [builtins.__import__]
            setattr(builtins, "__import__", _importing)
        outer, _DEFERRING[thread] = _DEFERRING.get(thread), namespace
    try:
        yield lazy
    finally:
        with _HOOK:
            if outer is None:
                del _DEFERRING[thread]
            else:
                _DEFERRING[thread] = outer
            if not _DEFERRING:
                setattr(builtins, "__import__", _ORIGINAL_IMPORT[0])
    for alias, value in list(namespace.items()):
        if isinstance(value, Later) and not value.alias:
            value.alias = alias  # its first use binds this name to the module itself
        elif isinstance(value, Deferred):
            del namespace[alias]
            lazy[alias] = (value.later.module_name, value.name)


def resolved(value: Any) -> Any:
    """Return what a `Deferred` names (importing its module), or `value` itself."""
    return value.resolve() if isinstance(value, Deferred) else value


_BUILDING = threading.Lock()  # one built value is kept per class attribute, whichever thread built first


class Pending:
    """A class attribute built at its first read (on the class or an instance), then replaced there by what was built.

    Subclasses say what `build()` returns: a plain function (or staticmethod), so from its first
    read on the attribute is exactly what a `def` would have made, and reads cost nothing extra.
    """

    _owner: type
    _name: str

    def __set_name__(self, owner: type, name: str) -> None:
        self._owner, self._name = owner, name

    def build(self) -> Any:
        """Return the attribute's value (a function or a staticmethod)."""
        raise NotImplementedError

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        built: Any = vars(self._owner).get(self._name)
        if built is self:
            made = self.build()  # outside the lock: it may import a module, which takes the import lock
            with _BUILDING:
                built = vars(self._owner).get(self._name)
                if built is self:
                    setattr(self._owner, self._name, made)
                    built = made
        return built.__get__(obj, owner)


class Static(Pending):
    """A table line for a plain function of a module imported at first use: a staticmethod once read."""

    def __init__(self, function: Deferred):
        self.function = function

    def build(self) -> Any:
        return staticmethod(self.function.resolve())


def static(function: Callable[P, R]) -> Callable[P, R]:
    """Return `staticmethod(function)`, or for a `Deferred` function one that imports its module at first read."""
    return Static(function) if isinstance(function, Deferred) else staticmethod(function)  # type: ignore[return-value]


def keywords_parameter(params: list[inspect.Parameter]) -> str | None:
    """Return the name of the parameter annotated `Keywords` (taken as keyword arguments), else None."""
    # Every library module postpones annotations, so each is the text written in the signature.
    marked = [p.name for p in params
              if isinstance(p.annotation, str) and p.annotation.split("|")[0].strip().rsplit(".")[-1] == "Keywords"]
    if len(marked) > 1:
        raise TypeError(f"only one parameter can take the keyword arguments, not {marked}")
    return marked[0] if marked else None


def _takes_txn(kind: str, function: Callable[..., Any], params: list[inspect.Parameter], unknown: Any) -> bool:
    """Refuse a function no entry can run; return whether it takes the open Transaction (`txn`)."""
    # A write that needs an after-commit step takes the open Transaction (`txn`) instead of `conn`.
    txn = bool(params) and params[0].name == "txn" and kind == "write"
    if kind not in KINDS or not params or not (params[0].name == "conn" or txn):
        raise TypeError(f"{function.__name__}: an entry runs a function of `conn` (a write: or `txn`) as one "
                        f"of {KINDS}")
    if kind in READS and unknown is ASK and params[1:] and params[1].name.endswith("_id"):
        raise TypeError(f"{function.__name__} reads by id: its entry must say what an unknown id answers "
                        f"(a Lookup reads it from the return type)")
    return txn


class Entry(Pending, Generic[P, R]):
    """One line of the method table: a public method running `function(conn, ...)` in a transaction of `kind`.

    `unknown` is what a read answers for a key no row can have: a value such as None or [] (a
    fresh copy each call) or an exception class to raise. A read whose first parameter is an id
    must declare it (a `Lookup` takes it from the return type). Text holding a lone surrogate, which SQLite can neither store nor look up,
    gets that answer without a query. The function's dict parameter annotated `Keywords` (or the
    one `pack` names) is taken by the public method as `**keywords` instead. A write function whose first parameter is `txn` gets the
    open Transaction, so it can leave a step (removing files) until after COMMIT. A `Deferred`
    function (of a module imported at first use) is imported, checked and made into the method at
    the method's first read; any other is checked at once.
    """

    def __init__(self, kind: Kind, function: Callable[Concatenate[Any, P], R], *, unknown: Any = ASK,
                 pack: str | None = None):
        self.kind, self.function, self.unknown, self.pack = kind, function, unknown, pack
        self.prepared = False
        if not isinstance(function, Deferred):  # a mistaken line is refused where it is written
            self.prepare()

    def prepare(self) -> None:
        """Read the module function's parameters (importing its module first, for a `Deferred` one) and check the line."""
        self.function, self.unknown = resolved(self.function), resolved(self.unknown)
        params = list(inspect.signature(self.function).parameters.values())
        self.txn = _takes_txn(self.kind, self.function, params, self.unknown)
        pack = keywords_parameter(params) if self.pack is None else self.pack
        self.pack = pack
        self.public = [p for p in params[1:] if p.name not in MODULE_ONLY and p.name != pack]
        if pack is not None:
            self.public.append(inspect.Parameter(pack, inspect.Parameter.VAR_KEYWORD, annotation="Any"))
        # The packed dict's own name is not a keyword: `filters=` is just one more packed key.
        self.names = {p.name for p in self.public if p.kind is not inspect.Parameter.VAR_KEYWORD}
        # Where a transcript write takes the caller's own compression lock: found once, not per call.
        self.holder_at = next((i for i, p in enumerate(self.public) if p.name == "compression_lock_holder"), None)
        self.prepared = True

    def build(self) -> Any:
        """Return the public method: a plain function, so help(), inspect and pickling see one."""
        if not self.prepared:
            self.prepare()
        entry, owner, name = self, self._owner, self._name

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return self._run(entry, args, kwargs)
        method.__name__, method.__qualname__, method.__module__ = name, f"{owner.__name__}.{name}", owner.__module__
        method.__doc__, method.__wrapped__ = self.function.__doc__, self.function  # type: ignore[attr-defined]
        own = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        method.__signature__ = inspect.signature(self.function).replace(  # type: ignore[attr-defined]
            parameters=[own, *self.public])
        method.entry = self  # type: ignore[attr-defined]
        return method

    def arguments(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Return the module function's (args, kwargs) for a public call; refuse the module-only keywords."""
        if kwargs and not MODULE_ONLY.isdisjoint(kwargs):
            raise TypeError(f"{self.function.__name__}() got an unexpected keyword argument "
                            f"{sorted(MODULE_ONLY & kwargs.keys())[0]!r}")
        if self.pack is None:
            return args, kwargs
        named = {k: v for k, v in kwargs.items() if k in self.names}
        return args, {**named, self.pack: {k: v for k, v in kwargs.items() if k not in self.names}}

    def key(self, args: tuple, kwargs: dict) -> Any:
        """Return the call's first argument (the session of a transcript write), positional or by name."""
        return args[0] if args else kwargs.get(self.public[0].name)

    def holder(self, args: tuple, kwargs: dict) -> Any:
        """Return the call's `compression_lock_holder` (the caller's own compression lock), or None."""
        at = self.holder_at
        if at is None:
            return None
        return args[at] if at < len(args) else kwargs.get("compression_lock_holder")

    def unstorable(self, args: tuple, kwargs: dict) -> str | None:
        """Return a read's text argument that holds a lone surrogate (no row can match it), else None."""
        if self.kind in READS and self.unknown is not ASK:
            for value in itertools.chain(args, kwargs.values()):
                if isinstance(value, str) and has_surrogate(value):
                    return value
        return None

    def answer_unknown(self, key: str) -> Any:
        """Return (or raise) what the entry declares for an unknown key."""
        if isinstance(self.unknown, type) and issubclass(self.unknown, BaseException):
            raise self.unknown(f"{key!r} not found")
        return copy.deepcopy(self.unknown)  # a fresh value each call: the caller may change it

    if TYPE_CHECKING:  # what type checkers and editors see: the module function without `conn`
        def __get__(self, obj: Any, owner: Any = None) -> Callable[P, R]: ...


def empty_answer(hint: Any) -> Any:
    """Return the empty value of a return type: None, [], 0, False or a tuple of those; ASK for any other type."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        return None  # an optional result: "not found"
    if hint is list or origin is list:
        return []
    if hint is bool or hint is int:
        return hint()  # False, 0
    if origin is tuple and args and Ellipsis not in args:
        parts = tuple(empty_answer(arg) for arg in args)
        return ASK if any(part is ASK for part in parts) else parts
    return ASK


class Lookup(Entry[P, R]):
    """A table line for a read by key: for a key no row can have, it answers the empty value of its return type.

    That is None for an optional result, [] for a list, 0 for a count, False for a yes/no and a
    tuple of those for a tuple, so the answer is read from the module function's annotation
    instead of written again beside it. A return type with no empty value is refused: such a
    read declares its answer with `Entry(..., unknown=...)`.
    """

    def __init__(self, kind: Literal["read", "snapshot"], function: Callable[Concatenate[Any, P], R]):
        super().__init__(kind, function)

    def prepare(self) -> None:
        self.function = resolved(self.function)
        answer = empty_answer(typing.get_type_hints(self.function).get("return")) if self.kind in READS else ASK
        if answer is ASK:
            raise TypeError(f"{self.function.__name__}: a lookup is a read whose return type has an empty value "
                            f"(None, [], 0, False); give this one an Entry with unknown=")
        self.unknown = answer
        super().prepare()


def same_arguments(template: Callable[P, Any]) -> Callable[[Callable[..., R]], Callable[P, R]]:
    """Give the decorated method `template`'s parameters, for help(), inspect and type checkers.

    For two public methods that take the same arguments: the parameters are written once, on
    `template`; the decorated method receives them as they are passed (named ones in its **keywords).
    """
    def adopt(method: Callable[..., R]) -> Callable[P, R]:
        shown = inspect.signature(template).replace(return_annotation=inspect.signature(method).return_annotation)
        method.__signature__ = shown  # type: ignore[attr-defined]
        return method
    return adopt


def entries(cls: type) -> dict[str, Entry]:
    """Return the method table of `cls`: {method name: its entry}, every method built."""
    return {name: member.entry for name in list(vars(cls)) if hasattr(member := getattr(cls, name), "entry")}


async def _to_thread(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    # asyncio is imported here, not at start-up (a fifth of `import hermes_state`): whoever awaits
    # this runs an event loop, so the module is loaded already and the import costs nothing.
    import asyncio
    return await asyncio.to_thread(func, *args, **kwargs)


def _twin(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    if not name.startswith("iter_"):
        @functools.wraps(method)  # keeps the name, docstring and signature for help() and editors
        async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await _to_thread(getattr(self.db, name), *args, **kwargs)
        return call

    @functools.wraps(method)
    async def stream(self: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        # Each item is read on a worker thread: the event loop never waits for the database.
        items, done = await _to_thread(getattr(self.db, name), *args, **kwargs), object()
        while (item := await _to_thread(next, items, done)) is not done:
            yield item
    return stream


class AsyncFacade:
    """The base of an async facade: wraps a handle `db`; its methods come from `add_async_twins`."""

    def __init__(self, db: Any):
        self.db = db

    def __getattr__(self, name: str) -> Any:
        # Plain attributes (db_path, read_only, closed...) read through; methods are the twins
        # made by add_async_twins, so a private or unknown method is an AttributeError.
        value = getattr(self.db, name)
        if callable(value):
            raise AttributeError(f"{type(self).__name__} has no coroutine {name!r}")
        return value

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self.db!r}>"

    async def close(self) -> None:
        """Close the wrapped handle (on a worker thread)."""
        await _to_thread(self.db.close)

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Twin(Pending):
    """An async facade's twin of one method of the sync class, made at its first read (see `add_async_twins`)."""

    def __init__(self, sync_cls: type, name: str):
        self.sync_cls, self.name = sync_cls, name

    def build(self) -> Any:
        return _twin(self.name, getattr(self.sync_cls, self.name))


def add_async_twins(sync_cls: type, async_cls: type, skip: set[str]) -> None:
    """Give `async_cls` a twin of every public method of `sync_cls` not in `skip` (calls go to `self.db`).

    A twin is a coroutine running the method on a worker thread; an `iter_*` method's twin is an
    async generator. Each keeps the method's name, signature and docstring; it is made at its
    first read, as the method it wraps is.
    """
    members = {name: member for cls in reversed(sync_cls.__mro__[:-1]) for name, member in vars(cls).items()}
    for name, member in members.items():  # the base's methods too (Handle's), the subclass's winning
        if not name.startswith("_") and name not in skip and (callable(member) or isinstance(member, Pending)):
            twin = Twin(sync_cls, name)
            twin.__set_name__(async_cls, name)
            setattr(async_cls, name, twin)
