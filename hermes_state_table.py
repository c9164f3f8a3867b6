"""The facade's machinery: the method table, and the handle the table's methods run on.

Owns: `Entry` (one table line: the transaction kind, the module function, what a read answers
for an unknown key, which keywords are packed into a dict) and `Lookup` (a read by key, whose
answer for an unknown key is the empty value of its return type), the methods it generates (the
module function's signature without `conn`, its docstring, for help(), inspect and editors),
the lone-surrogate rule for reads, `same_arguments` (one parameter list for two methods);
`Handle`, the base of SessionDB: opening and closing a handle, the shared-handle registry, the
timing knobs, and `_run`, the one place that turns a kind into its transaction; and
`AsyncFacade` with `add_async_twins` (the coroutine and async-generator twins AsyncSessionDB is
made of); `later` (a sibling module imported at its first use) and `Pending` (a class attribute
built at its first read), which keep `import hermes_state` from importing and inspecting every
module the table names.
Does not own: what a module function does, the upgrade an open runs (hermes_state_upgrade),
BEGIN/COMMIT themselves (hermes_state_writer).

Transaction contract: a write kind is one `Writer.transaction()` (BEGIN IMMEDIATE) with the
patience the kind names; a transcript write first checks, inside it, that compression neither
closed the session nor holds it (the transcript guard of hermes_state_messages), and waits once
if another holder does; reads run under the read lock, "snapshot" in one read transaction.
"""
from __future__ import annotations

import copy
import functools
import importlib
import inspect
import itertools
import os
import sqlite3
import sys
import threading
import time
import types
import typing
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import (TYPE_CHECKING, Any, AsyncIterator, Callable, Concatenate, Generic, Iterator, Literal, ParamSpec, Self,
                    TypeVar)

import hermes_state_common as common
from hermes_state_common import (COMPRESSION_WAIT_S, FTS_OPTIMIZE_EVERY_N_WRITES, FTS_REBUILD_CHUNK_ROWS,
                                 SCHEMA_VERSION, has_surrogate)
from hermes_state_errors import (TRANSLATABLE, HermesStateError, ReadOnlyError, SessionPersistenceError,
                                 StateDbIncompatibleError, StoreUnavailableError, describe_init_failure, raise_typed,
                                 set_last_init_error, typed_errors)
from hermes_state_home import check_db_path_allowed, get_hermes_home
from hermes_state_writer import RetryPolicy, RowConnection, SharedHandles, Transaction, Writer, note_wal_reset_bug

if TYPE_CHECKING:
    import hermes_state_compression as compression
    import hermes_state_fts as fts
    import hermes_state_lockowners as lockowners
    import hermes_state_messages as messages
    import hermes_state_repair as repairs
    import hermes_state_schema as schema
    import hermes_state_upgrade as upgrade

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
    """A sibling module bound to a name of a module's namespace, imported at its first use.

    Before the module is imported, an attribute read gives a `Deferred` reference to it (so a
    method table line can name a function without importing its module); once the module is
    imported, by anyone, a read gives the module's own attribute and binds the name to the module
    itself, so later reads cost what a module attribute costs. A constant is therefore read only
    where its module is imported already; Python's import lock makes the first import run once.
    """

    def __init__(self, namespace: dict[str, Any], alias: str, module_name: str):
        self._namespace, self._alias, self.module_name = namespace, alias, module_name

    def load(self) -> types.ModuleType:
        """Import the module (once) and bind the name to it; return it."""
        module = importlib.import_module(self.module_name)
        if self._namespace.get(self._alias) is self:
            self._namespace[self._alias] = module
        return module

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and inspect probe for dunder names: not module attributes
            raise AttributeError(name)
        return getattr(self.load(), name) if self.module_name in sys.modules else Deferred(self, name)

    def __repr__(self) -> str:
        return f"<module {self.module_name!r}, imported at first use>"


def later(namespace: dict[str, Any], **modules: str) -> None:
    """Bind each alias of `namespace` to its module (alias=module name), imported at its first use (a `Later`)."""
    for alias, name in modules.items():
        namespace[alias] = sys.modules.get(name) or Later(namespace, alias, name)


def resolved(value: Any) -> Any:
    """Return what a `Deferred` names (importing its module), or `value` itself."""
    return value.resolve() if isinstance(value, Deferred) else value


def deferred(module_name: str, name: str) -> Any:
    """Return `name` of a module no namespace binds: as a `Later` attribute read gives it (see there)."""
    return getattr(Later({}, "", module_name), name)


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


def resolve_path(db_path: str | os.PathLike | None, home: Path) -> Path:
    """Return the absolute path a handle opens: `home`/state.db by default, ":memory:" as it is."""
    if db_path is None:
        return home / "state.db"
    if str(db_path) == ":memory:":
        return Path(":memory:")
    return Path(db_path).expanduser().absolute()


# What a handle needs only once it opens, writes or closes: imported then, not with the facade.
later(globals(), compression="hermes_state_compression", fts="hermes_state_fts", lockowners="hermes_state_lockowners",
      messages="hermes_state_messages", repairs="hermes_state_repair", schema="hermes_state_schema",
      upgrade="hermes_state_upgrade")
SHARED = SharedHandles()  # the process-wide handles SessionDB.shared() hands out
# The repair an open may try once per path: the paths tried so far, and the repair itself.
Repair = tuple[set[str], Callable[..., dict[str, Any]] | None]


# The timing knobs: each public name, and the name hermes-agent's code and tests use for it (the
# same words in capitals after an underscore). Setting either, on the class or on one handle, sets
# both; every call reads them afresh.
KNOBS = {name: "_" + name.upper() for name in (
    "write_patience_s", "transcript_write_patience_s", "activity_write_patience_s", "read_busy_timeout_s",
    "write_retry_min_s", "write_retry_max_s", "write_retry_slow_min_s", "write_retry_slow_max_s",
    "checkpoint_every_n_writes", "optimize_every_n_writes", "compression_wait_s",
    "fts_rebuild_chunk_rows", "fts_rebuild_in_background")}
# hermes-agent's name of each knob and the public twin it stands for, as SessionDB.HERMES_AGENT_ALIASES
# shows them (read-only): agent code keeps its names, new code and the tests use the public ones.
HERMES_AGENT_ALIASES = MappingProxyType({agents: public for public, agents in KNOBS.items()})
TWINS = {**KNOBS, **HERMES_AGENT_ALIASES}


def _seconds(name: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__} {common.shown(value)}")
    if not 0 <= value < float("inf"):
        raise ValueError(f"{name} must be a finite number of seconds, 0 or more, not {value!r}")
    return value


def _cadence(name: str, value: Any) -> Any:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"{name} must be a whole number of writes (0 or None: never), not "
                        f"{type(value).__name__} {common.shown(value)}")
    if value is not None and value < 0:
        raise ValueError(f"{name} must be 0 or more (0 or None: never), not {value}")
    return value


def _rows(name: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise (ValueError if isinstance(value, int) and not isinstance(value, bool) else TypeError)(
            f"{name} must be a whole number of rows, 1 or more, not {common.shown(value)}")
    return value


def _bytes(name: str, value: Any) -> Any:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise (ValueError if isinstance(value, int) and not isinstance(value, bool) else TypeError)(
            f"{name} must be a whole number of bytes, 0 or more (None: never), not {common.shown(value)}")
    return value


def _flag(name: str, value: Any) -> Any:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {type(value).__name__} {common.shown(value)}")
    return value


# What each knob accepts, checked when it is set (on the class or one handle): a bad value is refused
# there, with its name, instead of failing every later write, perhaps after that write's COMMIT.
KNOB_RULES: dict[str, Callable[[str, Any], Any]] = {
    **{name: _seconds for name in KNOBS if name.endswith("_s")},
    "checkpoint_every_n_writes": _cadence, "optimize_every_n_writes": _cadence,
    "fts_rebuild_chunk_rows": _rows, "fts_rebuild_in_background": _flag, "checkpoint_in_background": _flag,
    "upgrade_in_background_bytes": _bytes}


def check_knob(name: str, value: Any) -> Any:
    """Return `value` if the knob `name` (public or hermes-agent's name) accepts it; else raise TypeError or ValueError."""
    rule = KNOB_RULES.get(HERMES_AGENT_ALIASES.get(name, name))
    return value if rule is None else rule(name, value)


class Knobs(type):
    """Keeps each knob's two names equal on a class: setting or deleting one does the same to the other."""

    def __setattr__(cls, name: str, value: Any) -> None:
        super().__setattr__(name, check_knob(name, value))
        if name in TWINS:
            super().__setattr__(TWINS[name], value)

    def __delattr__(cls, name: str) -> None:  # a monkeypatch undoing a class-level setting
        super().__delattr__(name)
        if TWINS.get(name) in vars(cls):
            super().__delattr__(TWINS[name])


class Handle(metaclass=Knobs):
    """The base of SessionDB: one open handle, its transactions, and `_run` for the method table."""

    # Timing policy (see docs/architecture.md, "Timing knobs"), read at call time so an
    # application or a test can tune it on the class or on one instance.
    write_patience_s = _WRITE_PATIENCE_S = common.WRITE_PATIENCE_S  # a write's whole wait for the lock
    transcript_write_patience_s = _TRANSCRIPT_WRITE_PATIENCE_S = common.TRANSCRIPT_WRITE_PATIENCE_S
    activity_write_patience_s = _ACTIVITY_WRITE_PATIENCE_S = common.ACTIVITY_WRITE_PATIENCE_S
    read_busy_timeout_s = _READ_BUSY_TIMEOUT_S = common.READ_BUSY_TIMEOUT_S  # a read-only open's busy wait
    # The jittered sleeps between BEGIN attempts: short ones first, then the slow band.
    write_retry_min_s = _WRITE_RETRY_MIN_S = common.WRITE_RETRY_MIN_S
    write_retry_max_s = _WRITE_RETRY_MAX_S = common.WRITE_RETRY_MAX_S
    write_retry_slow_min_s = _WRITE_RETRY_SLOW_MIN_S = common.WRITE_RETRY_SLOW_MIN_S
    write_retry_slow_max_s = _WRITE_RETRY_SLOW_MAX_S = common.WRITE_RETRY_SLOW_MAX_S
    checkpoint_every_n_writes = _CHECKPOINT_EVERY_N_WRITES = common.CHECKPOINT_EVERY_N_WRITES
    # Whether that checkpoint runs on a thread of the handle's own (a write then never waits for
    # its disk syncs) or inside the write that makes it due.
    checkpoint_in_background = True
    # Writes between whole-index FTS optimizes, run after COMMIT in a write of their own (0: never).
    optimize_every_n_writes = _OPTIMIZE_EVERY_N_WRITES = FTS_OPTIMIZE_EVERY_N_WRITES
    # Transcript writes wait this long for another holder's compression.
    compression_wait_s = _COMPRESSION_WAIT_S = COMPRESSION_WAIT_S
    # Rows per FTS rebuild transaction; whether open leaves a rebuild to a background thread.
    fts_rebuild_chunk_rows = _FTS_REBUILD_CHUNK_ROWS = FTS_REBUILD_CHUNK_ROWS
    fts_rebuild_in_background = _FTS_REBUILD_IN_BACKGROUND = True
    # A writable open of an older file at least this large (log included) returns at once: the
    # copy taken first and the upgrade run on a thread, reads meanwhile read the file as it is,
    # and writes wait until it is upgraded. None: every upgrade runs inside the open.
    upgrade_in_background_bytes: int | None = common.UPGRADE_IN_BACKGROUND_BYTES
    # {hermes-agent's name: the public name it is an alias of}; setting either sets both.
    HERMES_AGENT_ALIASES = HERMES_AGENT_ALIASES
    _shared_key: str | None = None  # set on handles handed out by shared()
    _fts: upgrade.FtsRebuild | None = None  # the background index rebuild this open started, if any
    _move_in: upgrade.MoveIn | None = None  # the background copy and upgrade of an older file, if any
    # The patience of each kind of table write that does not wait the default write_patience_s.
    _PATIENCE = {"activity": "activity_write_patience_s", "compression": "transcript_write_patience_s"}
    _built_policy: tuple[tuple[float, ...], RetryPolicy] | None = None  # (the knobs it was built from, it)
    db_path: Path
    profile_home: Path
    read_only: bool
    schema_version: int | None
    upgrade_backup: Path | None
    mode_changes: list[str]

    def __setattr__(self, name: str, value: Any) -> None:  # one handle's knob: both names, as on the class
        object.__setattr__(self, name, check_knob(name, value))
        if name in TWINS:
            object.__setattr__(self, TWINS[name], value)

    def __delattr__(self, name: str) -> None:
        object.__delattr__(self, name)
        if TWINS.get(name) in vars(self):
            object.__delattr__(self, TWINS[name])

    def __init__(self, db_path: str | os.PathLike | None = None, *, read_only: bool = False,
                 backup_before_upgrade: bool = True, force: bool = False, repair: Repair | None = None):
        # Absolute, so a later chdir or HERMES_HOME change cannot move this handle.
        self.profile_home = get_hermes_home().absolute()
        self.db_path = resolve_path(db_path, self.profile_home)
        self.read_only, self._backup_before_upgrade = read_only, backup_before_upgrade
        self._closed, self._fts = False, None
        check_db_path_allowed(self.db_path)  # before any directory, file or pragma
        # A writable file gets a second connection for reads (opened on first read); read-only
        # handles and in-memory databases (a second connection would be another database) do not.
        separate_reads = not read_only and str(self.db_path) != ":memory:"
        # force: add the store's tables even to another program's database. upgrade_backup: the copy
        # written before this handle upgraded the file; mode_changes: files this open tightened to 0600.
        attempted, repair_file = repair or (set(), None)
        later_bytes = self.upgrade_in_background_bytes if separate_reads else None
        try:
            opened = repairs.open_repairing(lambda: upgrade.open_connection(
                self.db_path, read_only=read_only, read_busy_s=self.read_busy_timeout_s,
                patience_s=self.write_patience_s, policy=self._policy(), backup=backup_before_upgrade, force=force,
                on_give_up=self._log_lock_holders, later_bytes=later_bytes),
                self.db_path, attempted, None if read_only else repair_file)
            conn, self.schema_version = opened.conn, opened.schema_version
            self.upgrade_backup, self.mode_changes = opened.upgrade_backup, opened.mode_changes
            migrated = threading.Event() if opened.upgrade_later else None
            # The opener names the path, not the handle: the checkpoint thread keeps it, and must
            # not keep a dropped handle alive.
            self._writer = Writer(conn, on_give_up=self._log_lock_holders, open_reader=(
                functools.partial(upgrade.connect_reader, self.db_path, migrated)) if separate_reads else None)
            self._writer.after_commit.append(self._upkeep)
            if separate_reads:
                note_wal_reset_bug(self.db_path)
            if migrated is None:
                self._open_fts()
            else:
                self._move_in = upgrade.MoveIn(self._writer, self.db_path, self.write_patience_s, self._policy(),
                                               backup=backup_before_upgrade, migrated=migrated,
                                               finish=self._moved_in, on_give_up=self._log_lock_holders)
                self._move_in.thread.start()
        except Exception as exc:  # kept for a caller that reports the failure later (a slash command)
            set_last_init_error(describe_init_failure(exc))
            raise

    # --- lifecycle -----------------------------------------------------------------------------------

    def _open_fts(self) -> None:
        writable = not self.read_only and (self.schema_version or 0) <= SCHEMA_VERSION
        try:
            with typed_errors(self.db_path, reading=True):  # a damaged index page -> StateDbCorruptError
                self._fts = upgrade.open_fts(self._writer, self.db_path, self.write_patience_s, self._policy(),
                                             writable=writable, chunk_rows=self.fts_rebuild_chunk_rows,
                                             background=self.fts_rebuild_in_background)
        except BaseException:
            self._writer.close(checkpoint=False)
            raise

    def _moved_in(self, version: int, copy: Path | None) -> None:
        # On the upgrade's thread, holding the writer's locks, once the file has the current layout.
        self.schema_version, self.upgrade_backup = version, copy
        if self._move_in is not None and self._move_in.stop.is_set():
            return  # a handle closing starts no index work
        try:
            self._open_fts()  # closes the writer when it fails: say why to the calls refused from now on
        except BaseException as exc:
            self._writer.closed_reason = (f"{self.db_path} was upgraded, but its full-text indexes could not be "
                                          f"opened ({exc}); open it again")
            raise

    @property
    def upgrading(self) -> bool:
        """True while this open's copy and upgrade of an older file run in the background (writes wait for them)."""
        return self._move_in is not None and not self._move_in.done.is_set()

    def _wait_moved_in(self, move_in: upgrade.MoveIn, patience_s: float) -> float:
        # A write made while the file is moved in waits for it, as the open itself would have, but no
        # longer than its own patience: a bookkeeping write must never stall a turn for a whole copy.
        # While it waits, the copy stops giving way to this process's reads between its steps.
        waited = 0.0
        if not move_in.done.is_set():
            started = time.monotonic()
            with move_in.write_waiting():
                finished = move_in.done.wait(max(0.0, patience_s))
            waited = time.monotonic() - started
            if not finished:
                raise SessionPersistenceError(
                    f"{self.db_path} is being copied and upgraded in the background (an older file moved in); "
                    f"this write waited its {patience_s:.1f}s and was not made. Retry once `upgrading` is false.",
                    code="session_persistence_failed:locked")
        self._refuse_if_closed()
        if move_in.error is not None and not move_in.migrated.is_set():
            raise StoreUnavailableError(
                f"{self.db_path} could not be upgraded ({move_in.error}); it was left as it was and this write "
                "was not made. Open it again to retry the upgrade.") from move_in.error
        return waited

    @property
    def _fts_worker(self) -> Any:  # the background rebuild thread, or None (the FTS tests join it)
        return self._fts.thread if self._fts is not None else None

    def wait_for_fts_rebuild(self, timeout_s: float | None = None) -> bool:
        """Wait up to `timeout_s` (None: until it ends) for this open's background work; True once none runs.

        That is the copy and upgrade of an older file, then the index rebuild. True at once when the
        open started none; work that close() stopped counts as ended.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if self._move_in is not None:
            self._move_in.thread.join(timeout_s)
            if self._move_in.thread.is_alive():
                return False
        thread = self._fts_worker
        if thread is not None:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return thread is None or not thread.is_alive()

    def close(self) -> None:
        """Checkpoint (PASSIVE) and close; twice is harmless. A `shared()` handle gives back one use, like `release()`."""
        if self._shared_key is None or SHARED.release(self._shared_key, self):
            self._close_now()

    def _close_now(self) -> None:
        if self._closed:
            return
        move_in = self._move_in
        if move_in is not None:
            move_in.stop.set()  # a copy under way ends at its next step, and no upgrade follows it
            if move_in.migrating.is_set():
                move_in.thread.join()  # the upgrade itself is not stopped halfway: close once it is done
        if self._fts is not None:
            self._fts.stop()
        # The rows this handle queued, for other programs (a file not upgraded has no queue).
        if not self.read_only and not self._writer.closed and (move_in is None or move_in.migrated.is_set()):
            fts.flush_queue(self._writer, self._policy())
        self._closed = True
        self._writer.close(checkpoint=not self.read_only)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def shared(cls, db_path: str | os.PathLike | None = None) -> Self:
        """Return the process-wide handle for a path, counting one more user of it."""
        path = resolve_path(db_path, get_hermes_home().absolute())
        key = os.path.realpath(path)

        def open_handle() -> Handle:
            handle = cls(path)
            handle._shared_key = key
            return handle
        return SHARED.take(key, open_handle, lambda handle: handle.closed)

    def release(self) -> None:
        """Give back one use of a shared handle; the last release closes it."""
        self.close()

    @property
    def closed(self) -> bool:
        """True once this handle is closed (for a shared handle: once its last user released it; in a forked child: always)."""
        return self._closed or self._writer.closed

    @property
    def in_transaction(self) -> bool:
        """True while this handle holds a transaction open (a write, or a read snapshot)."""
        return not self._closed and self._writer.in_transaction()

    @property
    def write_count(self) -> int:
        """How many write transactions this handle has committed: the count the upkeep cadences follow."""
        return self._writer.writes

    @contextmanager
    def tracer(self, callback: Callable[[str], None] | None = None) -> Iterator[list[str]]:
        """Record every SQL statement this handle runs inside the block (and pass each to `callback`).

        Yields the list the statements are appended to; meant for tests and debugging.
        """
        with self._writer.tracing(callback) as statements:
            yield statements

    @property
    def _conn(self) -> Any:
        """The handle's connection, rows readable by column name (for tests and agent code that peek)."""
        return RowConnection(self._writer.conn)

    # --- the transactions -------------------------------------------------------------------------------

    def transaction(self, *, patience_s: float | None = None) -> AbstractContextManager[Transaction]:
        """Open one BEGIN IMMEDIATE write transaction for a `with` block; it gets `txn.conn`, `txn.after_commit(fn)`.

        Commits when the block ends, rolls back on any exception (KeyboardInterrupt too). The
        handle's own methods called inside join it. Callbacks run after COMMIT, in order.
        """
        self._check_writable(patience_s)  # refused at the call, before any SQL, like every write
        return self._transaction(patience_s)

    @contextmanager
    def _transaction(self, patience_s: float | None) -> Iterator[Transaction]:
        with self._write(patience_s):
            yield Transaction(self._writer)

    def _policy(self) -> RetryPolicy:
        # The knobs are read at each write (callers tune them on the class or the handle); the
        # policy is built again only when one of them changed.
        knobs = (self.write_retry_min_s, self.write_retry_max_s, self.write_retry_slow_min_s, self.write_retry_slow_max_s)
        if self._built_policy is None or self._built_policy[0] != knobs:
            self._built_policy = (knobs, RetryPolicy(*knobs))
        return self._built_policy[1]

    def _log_lock_holders(self, patience_s: float) -> None:
        lockowners.log_write_lock_holders(self.db_path, patience_s)

    def _upkeep(self, conn: sqlite3.Connection, writes: int) -> None:
        every = self.checkpoint_every_n_writes  # 0 or None: never (SQLite's own automatic checkpoint remains)
        if every and writes % every == 0:
            self._writer.checkpoint(background=self.checkpoint_in_background)
        # The cadences are checked here, so the usual write never enters the FTS module.
        if writes % fts.MERGE_EVERY_N_WRITES == 0:  # a bounded FTS merge every 1,000 writes
            fts.upkeep(conn, writes)
        every = self.optimize_every_n_writes
        if every and writes % every == 0 and fts.optimize_due(writes, every):
            # After the lock is let go, in its own transaction; by name, so a caller's replacement runs.
            self._writer.defer(lambda: fts.optimize_quietly(lambda: getattr(self, "optimize_fts")()))

    def _refuse_if_closed(self) -> None:
        if self._closed or self._writer.closed:  # the writer alone is closed in a forked child
            raise HermesStateError(self._writer.closed_reason or f"SessionDB for {self.db_path} is closed")

    def _check_writable(self, patience_s: float | None = None) -> float:
        # Returns how long the write waited for a move-in: that much of its patience is spent.
        self._refuse_if_closed()
        if self.read_only:
            raise ReadOnlyError(f"{self.db_path} was opened read-only; open it without read_only to write")
        waited = 0.0
        if self._move_in is not None:
            waited = self._wait_moved_in(self._move_in, self.write_patience_s if patience_s is None else patience_s)
        if self.schema_version is not None and self.schema_version > SCHEMA_VERSION:
            raise StateDbIncompatibleError(
                f"{self.db_path} has schema version {self.schema_version}, newer than this library's "
                f"{SCHEMA_VERSION}; writes are refused so nothing is downgraded. Upgrade hermes-state.")
        return waited

    @contextmanager
    def _write(self, patience_s: float | None = None, *, checked: bool = False) -> Iterator[sqlite3.Connection]:
        patience = self.write_patience_s if patience_s is None else patience_s
        if not checked:  # a transcript write checked already, before its session id
            patience = max(0.0, patience - self._check_writable(patience))
        # Not `with typed_errors(...)`: a successful write runs no code of the errors module.
        try:
            with self._writer.transaction(patience, self._policy()) as conn:
                yield conn
        except TRANSLATABLE as exc:
            raise_typed(exc, self.db_path)

    def _transcript_write(self, session_id: str, body: Callable[[sqlite3.Connection], Any],
                          holder: str | None = None) -> Any:
        self._check_writable(self.transcript_write_patience_s)
        # The guard and the retry sit beside the message rows; compression's code runs only when
        # another holder is compressing the session (the wait, holding no lock). `holder` is the
        # caller's own compression lock, which lets its writes through.
        return messages.write_transcript(
            lambda: self._write(self.transcript_write_patience_s, checked=True), session_id, body,
            lambda: compression.wait_for_compression(self._read, session_id, holder=holder,
                                                     timeout_s=self.compression_wait_s), holder)

    @contextmanager
    def _read(self, snapshot: bool = False) -> Iterator[sqlite3.Connection]:
        self._refuse_if_closed()
        try:
            with self._writer.reading(snapshot) as conn:
                yield conn
        except TRANSLATABLE as exc:
            raise_typed(exc, self.db_path, reading=True)

    def _run(self, entry: Entry, args: tuple, kwargs: dict) -> Any:
        # Every table method comes through here: the one place that maps a kind to its transaction.
        if entry.kind in READS and (key := entry.unstorable(args, kwargs)) is not None:
            return entry.answer_unknown(key)
        if kwargs or entry.pack is not None:  # positional arguments pass as they are
            args, kwargs = entry.arguments(args, kwargs)
        if entry.kind in READS:
            with self._read(snapshot=entry.kind == "snapshot") as conn:
                # sqlite3's own UTF-8 decoding, the lenient one only if a value needs it: the
                # lenient decoder is a Python call per text value, a third of a large listing's time.
                return schema.read_strict_text(conn, lambda: entry.function(conn, *args, **kwargs))
        if entry.kind == "transcript":
            return self._transcript_write(entry.key(args, kwargs), lambda conn: entry.function(conn, *args, **kwargs),
                                          entry.holder(args, kwargs))
        patience = getattr(self, self._PATIENCE[entry.kind]) if entry.kind in self._PATIENCE else None
        with self._write(patience) as conn:
            return entry.function(Transaction(self._writer) if entry.txn else conn, *args, **kwargs)


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
