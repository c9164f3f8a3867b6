"""Where Hermes keeps its state: the home directory, named profiles and the test isolation guard.

Owns: resolving the home (`get_hermes_home`: context override, then `HERMES_HOME`, then the platform
default), profile names and directories, the CLI's `_apply_profile_override`, the environment handed to
child processes, and the guard that stops a test process from opening a production database.

Does not own: opening anything. Nothing here creates a directory or opens a database; the one write is
`os.environ["HERMES_HOME"]` in `_apply_profile_override`. Every answer is computed at call time from the
environment and the file system, so tests may change `HOME`/`HERMES_HOME` freely (hermes-agent's
`DEFAULT_DB_PATH` too: computed when read, unless a caller assigned it). The one thing kept from
import time is `HOME` as it was then: the guard still knows the real root when a test fakes `HOME`.

Transaction contract: none; this module never touches SQLite.
"""
from __future__ import annotations

import contextvars
import os
import re
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, MutableSequence

from hermes_state_errors import ProfileNotFoundError

DEFAULT_PROFILE = "default"
ACTIVE_PROFILE_FILE = "active_profile"
GUARD_BYPASS_ENV = "HERMES_STATE_DB_GUARD_BYPASS"
TEST_CONTEXT_ENVS = ("PYTEST_CURRENT_TEST", "PYTEST_VERSION", "HERMES_TEST_ISOLATION")

_PROFILE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# pytest launched as a script: pytest, py.test, pytest-3, pytest3.11, pytest.exe ...
_PYTEST_SCRIPT_RE = re.compile(r"py\.?test(-?[0-9][0-9.]*)?(\.exe)?")
_MAX_ANCESTORS = 64

_home_override: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "hermes_home_override", default=None
)
# The in-process bypass is a process-wide counter rather than a ContextVar: the marker covers a whole
# test, and a test may reach the database from threads it starts (executors do not copy contexts).
_bypass_lock = threading.Lock()
_bypass_depth = 0
# The user's home as the process started with it: a test that sets HOME=tmp_path must not make
# the guard forget where the production root is.
HOME_AT_IMPORT = os.environ.get("HOME")


# ------------------------------------------------------------------------------------------------
# Home and profiles

def default_hermes_root() -> Path:
    """Return the platform default root, ignoring `HERMES_HOME` and any override."""
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA")
        if local:
            return Path(local) / "hermes"
        import platformdirs  # imported lazily: only Windows needs it, and only without LOCALAPPDATA

        return Path(platformdirs.user_data_dir("hermes", appauthor=False, roaming=False))
    return Path(os.path.expanduser("~")) / ".hermes"


def get_hermes_home() -> Path:
    """Return the Hermes home: context override, then env `HERMES_HOME`, then the platform default."""
    override = _home_override.get()
    if override is not None:
        return override
    env = os.environ.get("HERMES_HOME")
    if env:
        return Path(env).expanduser()
    return default_hermes_root()


@contextmanager
def hermes_home_override(path: str | os.PathLike[str] | None) -> Iterator[Path]:
    """Resolve the home to `path` for the current context only (not other threads or tasks).

    `None` lifts any outer override for the block, so resolution falls back to env and default.
    """
    home = None if path is None else Path(path).expanduser()
    token = _home_override.set(home)
    try:
        yield get_hermes_home()
    finally:
        _home_override.reset(token)


def validate_profile_name(name: str) -> str:
    """Return `name` unchanged if it is a valid profile name, else raise ValueError."""
    if not isinstance(name, str) or not _PROFILE_NAME_RE.fullmatch(name) or name in (".", ".."):
        raise ValueError(
            f"invalid profile name {name!r}: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def profile_home(name: str) -> Path:
    """Return the directory of profile `name` (which need not exist); "default" is the default root."""
    validate_profile_name(name)
    root = default_hermes_root()
    return root if name == DEFAULT_PROFILE else root / "profiles" / name


def profiles_root() -> Path:
    """Return the root whose profiles there are: `HERMES_HOME`'s (its root when it is a profile), else the default."""
    home = get_hermes_home()
    # A profile's home is <root>/profiles/<name>: its root is two levels up.
    return home.parent.parent if home.parent.name == "profiles" else home


def profile_homes(root: str | os.PathLike[str]) -> list[tuple[str, Path]]:
    """Return (name, home) of "default" (the root itself) and of each named profile under `root`, by name.

    A directory under `profiles/` whose name is not a valid profile name is not a profile.
    Nothing is created or opened; a missing root or `profiles/` gives only the default.
    """
    base = Path(root).expanduser()
    homes = [(DEFAULT_PROFILE, base)]
    try:
        entries = sorted((p.name, p) for p in (base / "profiles").iterdir() if p.is_dir())
    except OSError:  # no profiles directory (yet), or one that cannot be listed
        return homes
    return homes + [(name, path) for name, path in entries
                    if _PROFILE_NAME_RE.fullmatch(name) and name != DEFAULT_PROFILE]


# Leading options of the hermes-state command that take their value as the next token.
_VALUE_OPTIONS = frozenset({"--db"})


def _pop_profile_flag(argv: MutableSequence[str]) -> tuple[str | None, list[int]]:
    """Find `--profile NAME`, `-p NAME` or `--profile=NAME`; return the name and argv indexes to drop.

    Only the leading options count: the scan stops at `--` and at the first token that is not
    an option (a word not starting with '-' that is not the value of `--profile`, `-p` or
    `--db`), so a subcommand's own `-p` (`sessions search -p`) is left to the subcommand.
    """
    name: str | None = None
    drop: list[int] = []
    i = 1  # argv[0] is the program
    while i < len(argv):
        arg = argv[i]
        if arg == "--" or not arg.startswith("-"):  # the command starts here; the rest is its own
            break
        if arg in _VALUE_OPTIONS:
            i += 2  # its value may not start with '-' and is not the command
            continue
        if arg in ("--profile", "-p"):
            if i + 1 >= len(argv):
                raise ValueError(f"{arg} needs a profile name")
            name, drop = argv[i + 1], drop + [i, i + 1]  # the last flag wins, as with argparse
            i += 2
            continue
        if arg.startswith("--profile="):
            name, drop = arg.split("=", 1)[1], drop + [i]
        i += 1
    return name, drop


def _active_profile_home(root: Path) -> Path | None:
    """Return the home of the profile named in `<root>/active_profile`, if valid and existing."""
    try:
        name = (root / ACTIVE_PROFILE_FILE).read_text(encoding="utf-8").strip()
        validate_profile_name(name)
    except (OSError, UnicodeError, ValueError):
        return None
    if name == DEFAULT_PROFILE:
        return None
    home = root / "profiles" / name
    return home if home.is_dir() else None


def _apply_profile_override(argv: MutableSequence[str] | None = None) -> Path | None:
    """Select the profile from argv (edited in place) or the active profile; export it as `HERMES_HOME`.

    The flag is honoured only among the leading options, before the command (see _pop_profile_flag).

    Returns the directory written to `HERMES_HOME`, or None when nothing was changed. An explicit
    profile that does not exist raises ProfileNotFoundError before anything is read or written.
    """
    if argv is None:
        argv = sys.argv
    name, drop = _pop_profile_flag(argv)
    home: Path | None  # the named profile's home, else the active profile's (None: there is none)
    if name is not None:
        home = profile_home(name)
        # The default root may not exist yet on a fresh install; a named profile must.
        if name != DEFAULT_PROFILE and not home.is_dir():
            raise ProfileNotFoundError(
                f"profile {name!r} does not exist (no directory {home}); create it first or pick "
                "another profile"
            )
        for i in reversed(drop):
            del argv[i]
    elif os.environ.get("HERMES_HOME"):
        return None  # a profile-specific home chosen by whoever started us wins
    else:
        home = _active_profile_home(default_hermes_root())
        if home is None:
            return None
    os.environ["HERMES_HOME"] = str(home)
    return home


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return an environment for a subprocess with `HERMES_HOME` set to the resolved home."""
    env = dict(os.environ if base is None else base)
    # Absolute, so a child that changes directory still lands in the same home.
    env["HERMES_HOME"] = os.path.abspath(get_hermes_home())
    return env


CONFIG_FILE = "config.yaml"


def config_section(section: str) -> dict[str, Any]:
    """Return one section of the home's config.yaml as a dict; {} when it is missing or cannot be read.

    hermes-agent keeps its settings in that file. Reading YAML needs PyYAML, which hermes-agent's
    own installation has; without it every section is empty and the defaults apply.
    """
    try:
        import yaml  # type: ignore[import-untyped]
        with open(get_hermes_home() / CONFIG_FILE, encoding="utf-8") as handle:
            settings = yaml.safe_load(handle)
        found = settings[section]
    except Exception:  # no PyYAML, no file, unreadable YAML, no such section: nothing configured
        return {}
    return found if isinstance(found, dict) else {}


def config_count(section: str, key: str, default: int) -> int:
    """Return `section.key` of the home's config.yaml as a count of 0 or more, else `default`.

    A value hermes-agent would not take (missing, negative, not a number) gives `default`, as it does.
    """
    try:
        value = int(config_section(section)[key])
    except Exception:  # no such setting or not a number: the default
        return default
    return value if value >= 0 else default


def display_hermes_home(path: str | os.PathLike[str] | None = None) -> str:
    """Return the home (or `path`) for people to read, as `~/...` when under the user's home."""
    target = os.path.abspath(os.path.expanduser(get_hermes_home() if path is None else path))
    user = os.path.expanduser("~")
    if user and user != "~" and os.path.dirname(user) != user:  # "/" as home would say nothing
        try:
            rel = os.path.relpath(target, user)
        except ValueError:  # another drive on Windows
            return target
        if rel == os.curdir:
            return "~"
        if rel != os.pardir and not rel.startswith(os.pardir + os.sep):
            return os.path.join("~", rel)
    return target


# ------------------------------------------------------------------------------------------------
# Test isolation guard

def _cmdline_runs_pytest(args: list[str]) -> bool:
    """Tell whether a process argv runs pytest (as a script or with `-m pytest`)."""
    for i, arg in enumerate(args):
        # Split on both separators: a Windows-style path may show up in a Linux cmdline (Wine, WSL).
        if _PYTEST_SCRIPT_RE.fullmatch(re.split(r"[\\/]", arg)[-1].lower()):
            return True
        if arg == "-m" and i + 1 < len(args) and args[i + 1] in ("pytest", "py.test"):
            return True
        if arg in ("-mpytest", "-mpy.test"):
            return True
    return False


def ancestor_runs_pytest(pid: int | None = None, proc_root: str = "/proc") -> bool:
    """Walk this process and its ancestors in /proc; True if one runs pytest. Never raises."""
    pid = os.getpid() if pid is None else pid
    seen: set[int] = set()
    for _ in range(_MAX_ANCESTORS):
        if pid <= 0 or pid in seen:
            return False
        seen.add(pid)
        try:
            with open(os.path.join(proc_root, str(pid), "cmdline"), "rb") as f:
                raw = f.read()
            args = raw.decode("utf-8", "replace").split("\0")
            if _cmdline_runs_pytest([a for a in args if a]):
                return True
            if pid == 1:
                return False
            with open(os.path.join(proc_root, str(pid), "stat"), "rb") as f:
                stat = f.read().decode("utf-8", "replace")
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so cut at the last ")".
            pid = int(stat.rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def is_test_context() -> bool:
    """Tell whether this process runs under a test (pytest env vars, or a pytest ancestor on Linux)."""
    if any(os.environ.get(name) for name in TEST_CONTEXT_ENVS):
        return True
    return sys.platform.startswith("linux") and ancestor_runs_pytest()


def _norm(path: str) -> str:
    return os.path.normcase(os.path.normpath(path))


def real_hermes_roots() -> list[Path]:
    """Return every directory that may be the production root: from `HOME` now, `HOME` at import, the account.

    A faked `HOME` (common in tests) moves only the first; the account's home comes from the
    password database. Never from `HERMES_HOME`.
    """
    roots = [default_hermes_root()]
    if sys.platform != "win32":
        homes = [HOME_AT_IMPORT]
        try:
            import pwd  # POSIX only

            homes.append(pwd.getpwuid(os.getuid()).pw_dir)
        except (ImportError, KeyError, OSError):  # an account without a passwd entry (some containers)
            pass
        roots += [Path(h) / ".hermes" for h in homes if h and os.path.isabs(h)]
    return list(dict.fromkeys(roots))


def is_production_db(path: str | os.PathLike[str]) -> bool:
    """Tell whether `path` is a file directly in a real Hermes root or in one of its profiles.

    The real roots come from the user's home directory (see `real_hermes_roots`), never from
    `HERMES_HOME`. Symlinks in the path, the root or the file itself are seen through. Nothing
    is created or opened.
    """
    return _production_root(path) is not None


def _production_root(path: str | os.PathLike[str]) -> Path | None:
    raw = os.fspath(path)
    if raw in ("", ":memory:") or raw.startswith("file:"):
        return None
    lexical = os.path.abspath(os.path.expanduser(raw))
    parent, leaf = os.path.split(lexical)
    candidates = {_norm(lexical), _norm(os.path.join(os.path.realpath(parent), leaf)),
                  _norm(os.path.realpath(lexical))}
    for real in real_hermes_roots():
        root = os.path.abspath(real)
        roots = {_norm(root), _norm(os.path.realpath(root))}
        profiles = os.path.join(root, "profiles")
        profile_parents = {_norm(profiles), _norm(os.path.realpath(profiles))}
        for candidate in candidates:
            directory = os.path.dirname(candidate)
            if directory in roots or os.path.dirname(directory) in profile_parents:
                return real
    return None


@contextmanager
def live_system_guard_bypass() -> Iterator[None]:
    """Let this process open production databases while the block runs (tests only)."""
    global _bypass_depth
    with _bypass_lock:
        _bypass_depth += 1
    try:
        yield
    finally:
        with _bypass_lock:
            _bypass_depth -= 1


def guard_bypassed() -> bool:
    """Tell whether the guard is off: env `HERMES_STATE_DB_GUARD_BYPASS=1` or an active in-process bypass."""
    return os.environ.get(GUARD_BYPASS_ENV) == "1" or _bypass_depth > 0


def check_db_path_allowed(path: str | os.PathLike[str]) -> None:
    """Raise RuntimeError if a test process is about to open a production database; else do nothing."""
    # The path test is cheap and almost always False, so the /proc walk rarely runs.
    root = _production_root(path)
    if root is None or not is_test_context() or guard_bypassed():
        return
    raise RuntimeError(
        f"refusing to open the production database {os.fspath(path)} from a test: it lies in the real "
        f"Hermes root {root}. Point HERMES_HOME at a temporary directory (the "
        "`hermes_home` fixture does) or pass a temporary database path. If a test truly must touch "
        "the live database, mark it @pytest.mark.live_system_guard_bypass (in-process) or set "
        f"{GUARD_BYPASS_ENV}=1 in the environment of a child process."
    )


# --- hermes-agent's DEFAULT_DB_PATH ------------------------------------------------------------------

class DefaultPath:
    """Where `SessionDB()` opens: get_hermes_home() / "state.db" as resolved at each call, or the path a caller pinned."""

    def __init__(self) -> None:
        self.pinned: Path | None = None

    def current(self) -> Path:
        """Return the pinned path, else get_hermes_home() / "state.db" now."""
        return self.pinned or get_hermes_home() / "state.db"

    def pin(self, value: str | os.PathLike[str] | None) -> None:
        """Pin `value` (None unpins); the path the home resolves to now pins nothing, so restoring the old value unpins."""
        path = None if value is None else Path(value)
        self.pinned = None if path == get_hermes_home() / "state.db" else path


DEFAULT_PATH = DefaultPath()
