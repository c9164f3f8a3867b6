"""The facade's method table: how one line turns a module function into a public method.

Owns: `Entry` (one table line: the transaction kind, the module function, what a read answers
for an unknown key, which keywords are packed into a dict), the methods it generates (the
module function's signature without `conn`, its docstring, for help(), inspect and editors),
the lone-surrogate rule for reads, and `AsyncFacade` with `add_async_twins` (the coroutine and
async-generator twins AsyncSessionDB is made of).
Does not own: what a kind means as a transaction; the class the entries sit in does that in its
`_run(entry, args, kwargs)`, the only method a generated one calls.

Transaction contract: none here; this module never touches a connection.
"""
from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import itertools
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Concatenate, Generic, Literal, ParamSpec, TypeVar

from hermes_state_common import has_surrogate

P = ParamSpec("P")  # one per line: checkers take a type variable only from its own assignment
R = TypeVar("R")
Kind = Literal["read", "snapshot", "write", "transcript", "compression", "activity"]
KINDS = ("read", "snapshot", "write", "transcript", "compression", "activity")
READS = ("read", "snapshot")
# The modules' injected clock: a module's own tests pass it, a caller of the facade never does.
MODULE_ONLY = frozenset({"now"})
ASK = object()  # no answer declared for an unknown key: the module function answers itself


class Entry(Generic[P, R]):
    """One line of the method table: a public method running `function(conn, ...)` in a transaction of `kind`.

    `unknown` is what a read answers for a key no row can have: a value such as None or [] (a
    fresh copy each call) or an exception class to raise. A read whose first parameter is an id
    must declare it. Text holding a lone surrogate, which SQLite can neither store nor look up,
    gets that answer without a query. `pack` names the function's dict parameter that the public
    method takes as `**keywords` instead.
    """

    def __init__(self, kind: Kind, function: Callable[Concatenate[Any, P], R], *, unknown: Any = ASK,
                 pack: str | None = None):
        params = list(inspect.signature(function).parameters.values())
        if kind not in KINDS or not params or params[0].name != "conn":
            raise TypeError(f"{function.__name__}: an entry runs a function of `conn` as one of {KINDS}")
        if kind in READS and unknown is ASK and params[1:] and params[1].name.endswith("_id"):
            raise TypeError(f"{function.__name__} reads by id: its entry must say what an unknown id answers")
        self.kind, self.function, self.unknown, self.pack = kind, function, unknown, pack
        self.public = [p for p in params[1:] if p.name not in MODULE_ONLY and p.name != pack]
        if pack is not None:
            self.public.append(inspect.Parameter(pack, inspect.Parameter.VAR_KEYWORD, annotation="Any"))
        self.names = {p.name for p in self.public}

    def __set_name__(self, owner: type, name: str) -> None:
        entry = self

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return self._run(entry, args, kwargs)
        method.__name__, method.__qualname__, method.__module__ = name, f"{owner.__name__}.{name}", owner.__module__
        method.__doc__, method.__wrapped__ = self.function.__doc__, self.function  # type: ignore[attr-defined]
        own = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        method.__signature__ = inspect.signature(self.function).replace(  # type: ignore[attr-defined]
            parameters=[own, *self.public])
        method.entry = self  # type: ignore[attr-defined]
        setattr(owner, name, method)  # a plain function from here on: help(), inspect and pickling see one

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


def entries(cls: type) -> dict[str, Entry]:
    """Return the method table of `cls`: {method name: its entry}."""
    return {name: member.entry for name, member in vars(cls).items() if hasattr(member, "entry")}


def _twin(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    if not name.startswith("iter_"):
        @functools.wraps(method)  # keeps the name, docstring and signature for help() and editors
        async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(getattr(self.db, name), *args, **kwargs)
        return call

    @functools.wraps(method)
    async def stream(self: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        # Each item is read on a worker thread: the event loop never waits for the database.
        items, done = await asyncio.to_thread(getattr(self.db, name), *args, **kwargs), object()
        while (item := await asyncio.to_thread(next, items, done)) is not done:
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

    async def close(self) -> None:
        """Close the wrapped handle (on a worker thread)."""
        await asyncio.to_thread(self.db.close)

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def add_async_twins(sync_cls: type, async_cls: type, skip: set[str]) -> None:
    """Give `async_cls` a twin of every public method of `sync_cls` not in `skip` (calls go to `self.db`).

    A twin is a coroutine running the method on a worker thread; an `iter_*` method's twin is an
    async generator. Each keeps the method's name, signature and docstring.
    """
    for name, member in list(vars(sync_cls).items()):
        if not name.startswith("_") and name not in skip and callable(member):
            setattr(async_cls, name, _twin(name, member))
