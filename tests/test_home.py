"""Tests for hermes_state_home (home, profiles, guard) and the hermes_state_pytest plugin.

Every test points HOME at a temporary directory, so the real ~/.hermes is never read or written.
"""
from __future__ import annotations

import asyncio
import os
import sys
import threading
from pathlib import Path

import pytest

import hermes_state_home as home_mod
import hermes_state_pytest
from hermes_state_errors import ProfileNotFoundError
from hermes_state_home import (
    _apply_profile_override,
    check_db_path_allowed,
    child_env,
    default_hermes_root,
    display_hermes_home,
    get_hermes_home,
    guard_bypassed,
    hermes_home_override,
    is_production_db,
    is_test_context,
    live_system_guard_bypass,
    profile_home,
    validate_profile_name,
)

# The nested-pytest test below needs `pytester`; a test module may request plugins this way.
pytest_plugins = ["pytester"]

# Every test here runs in a fake user home (the project fixture), with no HERMES_HOME set.
pytestmark = pytest.mark.usefixtures("fake_home")


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# ---------------------------------------------------------------------------------------------
# Resolution


def test_default_root_is_dot_hermes_under_home(fake_home: Path) -> None:
    assert default_hermes_root() == fake_home / ".hermes"
    assert get_hermes_home() == fake_home / ".hermes"
    assert not (fake_home / ".hermes").exists()  # resolving creates nothing


def test_default_root_follows_home_at_call_time(fake_home: Path, tmp_path: Path, monkeypatch) -> None:
    other = tmp_path / "other"
    monkeypatch.setenv("HOME", str(other))
    assert get_hermes_home() == other / ".hermes"


def test_windows_root_uses_localappdata(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path / "Local"))
    assert default_hermes_root() == tmp_path / "Local" / "hermes"


def test_env_beats_default_and_expands_user(fake_home: Path, monkeypatch) -> None:
    monkeypatch.setenv("HERMES_HOME", "~/elsewhere")
    assert get_hermes_home() == fake_home / "elsewhere"
    assert default_hermes_root() == fake_home / ".hermes"  # the root ignores HERMES_HOME


def test_empty_env_counts_as_unset(fake_home: Path, monkeypatch) -> None:
    monkeypatch.setenv("HERMES_HOME", "")
    assert get_hermes_home() == fake_home / ".hermes"


def test_override_beats_env_and_is_restored(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "env"))
    with hermes_home_override(tmp_path / "outer") as outer:
        assert outer == tmp_path / "outer"
        assert get_hermes_home() == tmp_path / "outer"
        with hermes_home_override(str(tmp_path / "inner")):
            assert get_hermes_home() == tmp_path / "inner"
        with hermes_home_override(None) as lifted:  # None lifts the outer override
            assert lifted == get_hermes_home() == tmp_path / "env"
        assert get_hermes_home() == tmp_path / "outer"
    assert get_hermes_home() == tmp_path / "env"


def test_override_does_not_leak_into_other_thread(tmp_path: Path, fake_home: Path) -> None:
    seen: list[Path] = []
    with hermes_home_override(tmp_path / "mine"):
        t = threading.Thread(target=lambda: seen.append(get_hermes_home()))
        t.start()
        t.join()
        assert get_hermes_home() == tmp_path / "mine"
    assert seen == [fake_home / ".hermes"]


def test_override_in_one_task_does_not_leak_into_another(tmp_path: Path, fake_home: Path) -> None:
    async def setter(ready: asyncio.Event, done: asyncio.Event) -> Path:
        with hermes_home_override(tmp_path / "task"):
            ready.set()
            await done.wait()
            return get_hermes_home()

    async def main() -> tuple[Path, Path]:
        ready, done = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(setter(ready, done))
        await ready.wait()
        other = get_hermes_home()
        done.set()
        return other, await task

    other, inside = asyncio.run(main())
    assert other == fake_home / ".hermes"
    assert inside == tmp_path / "task"


# ---------------------------------------------------------------------------------------------
# Profiles


@pytest.mark.parametrize("name", ["a/b", "a\\b", "..", ".", "", "x" * 65, "-x", ".hidden", "_x", "a b", None])
def test_invalid_profile_names_rejected(name) -> None:
    with pytest.raises(ValueError):
        validate_profile_name(name)
    with pytest.raises(ValueError):
        profile_home(name)


@pytest.mark.parametrize("name", ["coder", "a.b_c-1", "X", "9" * 64, "default"])
def test_valid_profile_names_accepted(name: str) -> None:
    assert validate_profile_name(name) == name


def test_profile_home_does_not_require_existence(fake_home: Path) -> None:
    assert profile_home("coder") == fake_home / ".hermes" / "profiles" / "coder"
    assert profile_home("default") == fake_home / ".hermes"
    assert not (fake_home / ".hermes").exists()


def test_profile_home_ignores_hermes_home(fake_home: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "env"))
    with hermes_home_override(tmp_path / "ctx"):
        assert profile_home("coder") == fake_home / ".hermes" / "profiles" / "coder"


@pytest.fixture
def coder(fake_home: Path) -> Path:
    d = fake_home / ".hermes" / "profiles" / "coder"
    d.mkdir(parents=True)
    return d


@pytest.mark.parametrize(
    "args",
    [["--profile", "coder"], ["-p", "coder"], ["--profile=coder"]],
    ids=["long", "short", "equals"],
)
def test_apply_profile_flag_forms(coder: Path, args: list[str]) -> None:
    argv = ["hermes-state", *args, "sessions", "list"]
    original = argv  # edited in place, not replaced
    assert _apply_profile_override(argv) == coder
    assert original == ["hermes-state", "sessions", "list"]
    assert os.environ["HERMES_HOME"] == str(coder)
    assert get_hermes_home() == coder


def test_apply_profile_last_leading_flag_wins_and_command_flags_stay(fake_home: Path, coder: Path) -> None:
    (fake_home / ".hermes" / "profiles" / "writer").mkdir()
    argv = ["hermes", "-p", "writer", "--profile=coder", "sessions", "--profile=writer", "list", "--", "-p", "x"]
    assert _apply_profile_override(argv) == coder
    assert argv == ["hermes", "sessions", "--profile=writer", "list", "--", "-p", "x"]


@pytest.mark.parametrize("argv", [
    ["prog", "sessions", "search", "-p"],
    ["prog", "sessions", "search", "-p", "coder"],
    ["prog", "--json", "sessions", "--profile=coder"],
    ["prog", "--", "-p", "coder"],
])
def test_apply_profile_ignores_flags_after_the_command(coder: Path, argv: list[str]) -> None:
    before = list(argv)
    assert _apply_profile_override(argv) is None
    assert argv == before
    assert "HERMES_HOME" not in os.environ


@pytest.mark.parametrize("args", [["--db", "x.db"], ["--db=x.db"], ["--json", "--db", "x.db"]])
def test_apply_profile_seen_after_other_leading_options(coder: Path, args: list[str]) -> None:
    argv = ["prog", *args, "-p", "coder", "sessions"]
    assert _apply_profile_override(argv) == coder
    assert argv == ["prog", *args, "sessions"]
    assert os.environ["HERMES_HOME"] == str(coder)


def test_apply_profile_defaults_to_sys_argv(coder: Path, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["hermes", "--profile", "coder", "doctor"])
    assert _apply_profile_override() == coder
    assert sys.argv == ["hermes", "doctor"]


def test_apply_profile_explicit_beats_existing_env(coder: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "somewhere"))
    assert _apply_profile_override(["hermes", "-p", "coder"]) == coder
    assert os.environ["HERMES_HOME"] == str(coder)


def test_apply_profile_default_name_maps_to_root(fake_home: Path) -> None:
    argv = ["hermes", "--profile", "default"]
    assert _apply_profile_override(argv) == fake_home / ".hermes"
    assert argv == ["hermes"]
    assert os.environ["HERMES_HOME"] == str(fake_home / ".hermes")


def test_apply_profile_missing_profile_raises_and_touches_nothing(fake_home: Path, tmp_path: Path) -> None:
    (fake_home / ".hermes" / "profiles").mkdir(parents=True)
    before = tree(tmp_path)
    argv = ["hermes", "--profile", "ghost", "sessions"]
    with pytest.raises(ProfileNotFoundError) as info:
        _apply_profile_override(argv)
    message = str(info.value)
    assert "ghost" in message
    assert str(fake_home / ".hermes" / "profiles" / "ghost") in message
    assert tree(tmp_path) == before
    assert argv == ["hermes", "--profile", "ghost", "sessions"]
    assert "HERMES_HOME" not in os.environ


def test_apply_profile_missing_root_raises_and_creates_nothing(fake_home: Path) -> None:
    with pytest.raises(ProfileNotFoundError):
        _apply_profile_override(["hermes", "-p", "coder"])
    assert tree(fake_home) == []


@pytest.mark.parametrize("argv", [["hermes", "--profile"], ["hermes", "--db", "x.db", "-p"]])
def test_apply_profile_missing_value(argv: list[str]) -> None:
    with pytest.raises(ValueError):
        _apply_profile_override(argv)
    assert "HERMES_HOME" not in os.environ


def test_apply_profile_invalid_name(fake_home: Path) -> None:
    with pytest.raises(ValueError):
        _apply_profile_override(["hermes", "--profile=../etc"])
    assert tree(fake_home) == []


def test_apply_profile_without_flag_keeps_existing_env(coder: Path, tmp_path: Path, monkeypatch) -> None:
    (coder.parent.parent / "active_profile").write_text("coder\n")
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "chosen"))
    argv = ["hermes", "list"]
    assert _apply_profile_override(argv) is None
    assert os.environ["HERMES_HOME"] == str(tmp_path / "chosen")
    assert argv == ["hermes", "list"]


def test_apply_profile_uses_active_profile(coder: Path) -> None:
    (coder.parent.parent / "active_profile").write_text("coder\n")
    assert _apply_profile_override(["hermes"]) == coder
    assert os.environ["HERMES_HOME"] == str(coder)


@pytest.mark.parametrize("content", ["default", "ghost", "../x", "", None, b"\xff\xfe"])
def test_apply_profile_ignores_unusable_active_profile(fake_home: Path, coder: Path, content) -> None:
    marker = fake_home / ".hermes" / "active_profile"
    if isinstance(content, bytes):
        marker.write_bytes(content)
    elif content is not None:
        marker.write_text(content)
    assert _apply_profile_override(["hermes"]) is None
    assert "HERMES_HOME" not in os.environ


# ---------------------------------------------------------------------------------------------
# Child environment and display


def test_child_env_sets_resolved_home(tmp_path: Path, fake_home: Path) -> None:
    env = child_env({"PATH": "/bin"})
    assert env == {"PATH": "/bin", "HERMES_HOME": str(fake_home / ".hermes")}
    with hermes_home_override(tmp_path / "ctx"):
        assert child_env({"HERMES_HOME": "/wrong"})["HERMES_HOME"] == str(tmp_path / "ctx")


def test_child_env_copies_os_environ_without_mutating(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SOME_VAR", "1")
    base = {"A": "b"}
    with hermes_home_override(tmp_path / "ctx"):
        env = child_env()
        child_env(base)
    assert env["SOME_VAR"] == "1"
    assert env["HERMES_HOME"] == str(tmp_path / "ctx")
    assert "HERMES_HOME" not in os.environ
    assert base == {"A": "b"}


def test_child_env_makes_relative_home_absolute(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HERMES_HOME", "rel")
    assert child_env({})["HERMES_HOME"] == str(tmp_path / "rel")


def test_display_hermes_home(fake_home: Path, tmp_path: Path, monkeypatch) -> None:
    assert display_hermes_home() == "~/.hermes"
    monkeypatch.setenv("HERMES_HOME", str(fake_home / ".hermes" / "profiles" / "coder"))
    assert display_hermes_home() == "~/.hermes/profiles/coder"
    assert display_hermes_home(fake_home) == "~"
    outside = tmp_path / "elsewhere"
    assert display_hermes_home(outside) == str(outside)
    # A sibling sharing the prefix is not under the home.
    assert display_hermes_home(str(fake_home) + "x") == str(fake_home) + "x"


# ---------------------------------------------------------------------------------------------
# Guard


def test_is_test_context_here() -> None:
    assert is_test_context()


def test_is_test_context_from_process_tree(monkeypatch) -> None:
    # Without the env markers, only the /proc walk remains; this process runs pytest.
    for name in home_mod.TEST_CONTEXT_ENVS:
        monkeypatch.delenv(name, raising=False)
    assert os.path.exists("/proc/self/cmdline"), "this test needs Linux /proc"
    assert is_test_context()


def _fake_proc(root: Path, procs: dict[int, tuple[int, list[str]]]) -> str:
    for pid, (ppid, argv) in procs.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        (d / "stat").write_text(f"{pid} (weird ) name) S {ppid} 1 1 0\n")
    return str(root)


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["/usr/bin/python3", "-m", "pytest", "-q"], True),
        (["/venv/bin/python", "/venv/bin/pytest", "tests"], True),
        (["py.test"], True),
        (["C:\\Py\\Scripts\\pytest.exe"], True),
        (["python3", "-mpytest"], True),
        (["python3", "app.py", "--pytest-like"], False),
        (["pytest-benchmark-report"], False),
    ],
)
def test_ancestor_walk(tmp_path: Path, argv: list[str], expected: bool) -> None:
    proc = _fake_proc(
        tmp_path / "proc",
        {1: (0, ["/sbin/init"]), 50: (1, argv), 100: (50, ["python", "worker.py"])},
    )
    assert home_mod.ancestor_runs_pytest(100, proc) is expected


def test_ancestor_walk_survives_garbage(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _fake_proc(proc, {10: (11, ["a"]), 11: (10, ["b"])})  # a cycle
    assert home_mod.ancestor_runs_pytest(10, str(proc)) is False
    (proc / "12").mkdir()
    (proc / "12" / "cmdline").write_bytes(b"x\0")
    (proc / "12" / "stat").write_text("garbage")
    assert home_mod.ancestor_runs_pytest(12, str(proc)) is False
    assert home_mod.ancestor_runs_pytest(999, str(proc)) is False  # no such process


def test_ancestor_walk_is_bounded(tmp_path: Path) -> None:
    chain = {pid: (pid - 1, ["sh"]) for pid in range(2, 200)}
    chain[1] = (0, ["python", "-m", "pytest"])
    proc = _fake_proc(tmp_path / "proc", chain)
    assert home_mod.ancestor_runs_pytest(199, proc) is False  # gave up after 64 steps
    assert home_mod.ancestor_runs_pytest(40, proc) is True


def test_is_production_db(fake_home: Path, tmp_path: Path, monkeypatch) -> None:
    root = fake_home / ".hermes"
    assert is_production_db(root / "state.db")
    assert is_production_db(str(root / "other.db"))
    assert is_production_db(root / "profiles" / "coder" / "state.db")
    assert is_production_db("~/.hermes/state.db")
    assert not is_production_db(root / "profiles" / "state.db")
    assert not is_production_db(root / "profiles" / "coder" / "sub" / "state.db")
    assert not is_production_db(root / "backups" / "state.db")
    assert not is_production_db(tmp_path / "state.db")
    assert not is_production_db(":memory:")
    # HERMES_HOME does not move the real root: a temporary home is not production...
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "tmp_home"))
    assert not is_production_db(tmp_path / "tmp_home" / "state.db")
    # ...and the real root stays production even while HERMES_HOME points elsewhere.
    assert is_production_db(root / "state.db")
    assert tree(fake_home) == []  # nothing created


def test_is_production_db_sees_through_symlinks(fake_home: Path, tmp_path: Path, monkeypatch) -> None:
    root = fake_home / ".hermes"
    (root / "profiles" / "coder").mkdir(parents=True)
    link_dir = tmp_path / "link"
    link_dir.symlink_to(root / "profiles" / "coder")
    assert is_production_db(link_dir / "state.db")
    (tmp_path / "db_link").symlink_to(root / "state.db")
    assert is_production_db(tmp_path / "db_link")
    monkeypatch.chdir(root)
    assert is_production_db("state.db")


def test_check_db_path_allowed_refuses_production(fake_home: Path) -> None:
    path = fake_home / ".hermes" / "state.db"
    with pytest.raises(RuntimeError) as info:
        check_db_path_allowed(path)
    message = str(info.value)
    assert str(path) in message
    assert str(fake_home / ".hermes") in message
    assert "HERMES_STATE_DB_GUARD_BYPASS=1" in message
    assert "@pytest.mark.live_system_guard_bypass" in message
    assert "HERMES_HOME" in message
    with pytest.raises(RuntimeError):
        check_db_path_allowed(fake_home / ".hermes" / "profiles" / "coder" / "state.db")
    assert tree(fake_home) == []


def test_check_db_path_allowed_passes_temporary_paths(tmp_path: Path) -> None:
    assert is_test_context()  # the guard is armed, so passing means the paths were judged safe
    before = tree(tmp_path)
    for path in (tmp_path / "state.db", tmp_path / "hermes" / "profiles" / "coder" / "state.db"):
        assert not is_production_db(path)
        assert check_db_path_allowed(path) is None
    assert tree(tmp_path) == before


def test_check_db_path_allowed_env_bypass(fake_home: Path, monkeypatch) -> None:
    monkeypatch.setenv("HERMES_STATE_DB_GUARD_BYPASS", "1")
    assert guard_bypassed()
    check_db_path_allowed(fake_home / ".hermes" / "state.db")
    monkeypatch.setenv("HERMES_STATE_DB_GUARD_BYPASS", "true")  # only "1" counts
    assert not guard_bypassed()


def test_check_db_path_allowed_in_process_bypass(fake_home: Path) -> None:
    path = fake_home / ".hermes" / "state.db"
    assert not guard_bypassed()
    with live_system_guard_bypass():
        with live_system_guard_bypass():
            check_db_path_allowed(path)
        check_db_path_allowed(path)  # still inside the outer bypass
    assert not guard_bypassed()
    with pytest.raises(RuntimeError):
        check_db_path_allowed(path)


def test_in_process_bypass_covers_threads_started_by_the_test(fake_home: Path) -> None:
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            check_db_path_allowed(fake_home / ".hermes" / "state.db")
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread
            errors.append(exc)

    with live_system_guard_bypass():
        t = threading.Thread(target=worker)
        t.start()
        t.join()
    assert errors == []


def test_guard_outside_test_context_allows(fake_home: Path, monkeypatch) -> None:
    for name in home_mod.TEST_CONTEXT_ENVS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(home_mod, "ancestor_runs_pytest", lambda *a, **k: False)
    assert not is_test_context()
    check_db_path_allowed(fake_home / ".hermes" / "state.db")


# ---------------------------------------------------------------------------------------------
# pytest plugin


def _plugin_loaded(config: pytest.Config) -> bool:
    return any(p is hermes_state_pytest for p in config.pluginmanager.get_plugins())


@pytest.mark.live_system_guard_bypass
def test_marker_bypasses_guard_in_process(fake_home: Path, request: pytest.FixtureRequest) -> None:
    # Loaded once: by its pytest11 entry point when installed, by the conftest's pytest_plugins otherwise.
    assert _plugin_loaded(request.config)
    assert guard_bypassed()
    check_db_path_allowed(fake_home / ".hermes" / "state.db")


_NESTED_TESTS = """
import os
import threading
from pathlib import Path

import pytest

from hermes_state_home import check_db_path_allowed, get_hermes_home, guard_bypassed


@pytest.fixture
def prod(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("HERMES_STATE_DB_GUARD_BYPASS", raising=False)
    return tmp_path / ".hermes" / "state.db"


@pytest.fixture
def opened_in_setup(prod):
    check_db_path_allowed(prod)  # setup is covered by the marker too
    return prod


@pytest.mark.live_system_guard_bypass
def test_marked(opened_in_setup):
    assert guard_bypassed()
    check_db_path_allowed(opened_in_setup)


def test_unmarked(prod):
    assert not guard_bypassed()
    with pytest.raises(RuntimeError):
        check_db_path_allowed(prod)


def test_home_fixture(hermes_home):
    assert os.environ["HERMES_HOME"] == str(hermes_home)
    assert os.environ["HERMES_TEST_ISOLATION"] == "1"
    assert hermes_home.is_dir() and get_hermes_home() == hermes_home
    seen = []
    t = threading.Thread(target=lambda: seen.append(get_hermes_home()))
    t.start(); t.join()
    assert seen == [hermes_home]  # env still points there for other threads


def test_home_fixture_undone():
    # Runs after test_home_fixture: env and override are back to the outer run's values.
    assert os.environ["HERMES_HOME"] == "/nonexistent-outer-home"
    assert "HERMES_TEST_ISOLATION" not in os.environ
    assert get_hermes_home() == Path("/nonexistent-outer-home")
"""


def test_plugin_in_nested_run(pytester: pytest.Pytester, monkeypatch) -> None:
    # Autoload is off so an installed entry point cannot register the same module a second time
    # under another name next to `-p`; the plugin is loaded explicitly instead.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("HERMES_HOME", "/nonexistent-outer-home")
    monkeypatch.delenv("HERMES_TEST_ISOLATION", raising=False)
    pytester.makepyfile(test_nested=_NESTED_TESTS)
    result = pytester.runpytest_inprocess("-p", "hermes_state_pytest", "-p", "no:cacheprovider",
                                          "--strict-markers")
    result.assert_outcomes(passed=4)
    assert not guard_bypassed()
    assert os.environ["HERMES_HOME"] == "/nonexistent-outer-home"


def test_session_db_fixture_in_nested_run(pytester: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(
        test_db="""
        def test_db(session_db, hermes_home):
            assert (hermes_home / "state.db").exists()
        """
    )
    result = pytester.runpytest_inprocess("-p", "hermes_state_pytest", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_a_faked_home_does_not_hide_the_real_root(fake_home: Path, tmp_path: Path, monkeypatch) -> None:
    # A test sets HOME=tmp_path while the shell exports HERMES_HOME at the real root: the guard
    # finds the real root from the account (password database) and from HOME as it was at import.
    import pwd

    account_root = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".hermes"
    monkeypatch.setenv("HERMES_HOME", str(account_root))
    assert is_production_db(account_root / "state.db")
    assert is_production_db(account_root / "profiles" / "coder" / "state.db")
    with pytest.raises(RuntimeError, match="production database"):
        check_db_path_allowed(account_root / "state.db")
    started_with = tmp_path / "original-home"
    monkeypatch.setattr(home_mod, "HOME_AT_IMPORT", str(started_with))
    assert is_production_db(started_with / ".hermes" / "state.db")
    with pytest.raises(RuntimeError, match=str(started_with / ".hermes")):
        check_db_path_allowed(started_with / ".hermes" / "state.db")
    assert not is_production_db(tmp_path / "elsewhere" / "state.db")
    assert not (started_with).exists()  # nothing created
