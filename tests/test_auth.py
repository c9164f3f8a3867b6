"""A password before the store leaves loopback: the file, its hashes, `passwd`, the guard, rate limits."""
from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import http.client
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

import hermes_state_auth as auth
from hermes_state import SessionDB
from hermes_state_errors import HermesStateError
from hermes_state_home import hermes_home_override

PASSWORD = "correct horse battery"


def _serve(*argv: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HERMES_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "hermes_state_cli", "serve", *argv], capture_output=True,
                          text=True, env=env, timeout=60)


def _passwd(home: Path, name: str, password: str, *extra: str) -> subprocess.CompletedProcess:
    # stdin is a pipe, not a terminal: the password is one line of it, with no prompt.
    env = {**os.environ, "HERMES_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "hermes_state_cli", "passwd", name, *extra], input=password + "\n",
                          capture_output=True, text=True, env=env, timeout=60)


@contextlib.contextmanager
def _running(home: Path, log: Path, *argv: str) -> Iterator[tuple[int, str]]:
    """Run a real `serve ... --port 0`; yield (port, what it printed) once it accepts connections."""
    env = {**os.environ, "HERMES_HOME": str(home)}
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "hermes_state_cli", "serve", "--port", "0", *argv],
                                   stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and process.poll() is None:
            found = re.search(r"http://[^:/]+:(\d+)/", log.read_text())
            if found:
                with contextlib.suppress(OSError):
                    socket.create_connection(("127.0.0.1", int(found.group(1))), timeout=1).close()
                    break
            time.sleep(0.1)
        else:
            pytest.fail(f"serve did not start: {log.read_text()}")
        yield int(found.group(1)), log.read_text()
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(10)


def _get(port: int, path: str, login: tuple[str, str] | None = None, host: str = "127.0.0.1",
         source: str = "127.0.0.1") -> tuple[int, dict[str, str], str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    headers = {"Host": host}
    if login is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(login).encode()).decode()
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read().decode()
    finally:
        conn.close()


@pytest.fixture
def users(private_store) -> Path:
    """The store's home with users alice and bob (same password), made by `hermes-state passwd`."""
    for name in ("alice", "bob"):
        done = _passwd(private_store, name, PASSWORD)
        assert done.returncode == 0, done.stderr
    return private_store


# --- hashes and the file -------------------------------------------------------------------------

def test_a_hash_has_a_fresh_salt_and_checks_the_password_it_was_made_from():
    first, second = auth.hash_password(PASSWORD), auth.hash_password(PASSWORD)
    assert first.scheme == "scrypt" and first.salt != second.salt and first.key != second.key
    assert first.matches(PASSWORD) and not first.matches(PASSWORD + "!") and not first.matches("")
    again = auth.Hash.parse(str(first))
    assert again == first and again.params == (auth.SCRYPT_N, auth.SCRYPT_R, auth.SCRYPT_P)


def test_without_scrypt_the_hash_is_pbkdf2_and_still_checks(monkeypatch):
    monkeypatch.delattr(hashlib, "scrypt")
    made = auth.hash_password(PASSWORD)
    assert str(made).startswith(f"pbkdf2_sha256${auth.PBKDF2_ITERATIONS}$")
    assert auth.Hash.parse(str(made)).matches(PASSWORD) and not made.matches("wrong password")


@pytest.mark.parametrize("text", ["", "plain", "md5$x$y", "scrypt$16384$8$1$c2FsdHNhbHQ=", "scrypt$16385$8$1$c2FsdHNhbHQ=$"
                                  + "A" * 44, "scrypt$" + str(2 ** 30) + "$8$1$c2FsdHNhbHQ=$" + "A" * 44,
                                  "pbkdf2_sha256$1$c2FsdHNhbHQ=$" + "A" * 44, "scrypt$16384$8$1$not base64$xx"])
def test_a_malformed_or_absurdly_costly_hash_is_refused(text):
    with pytest.raises(ValueError):
        auth.Hash.parse(text)


def test_passwd_writes_a_0600_file_of_hashes_and_never_the_password(private_store):
    done = _passwd(private_store, "alice", PASSWORD)
    assert done.returncode == 0, done.stderr
    path = private_store / "web-passwords"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert PASSWORD.encode() not in path.read_bytes() and PASSWORD not in done.stdout + done.stderr
    assert "alice" in done.stdout and "web-passwords" in done.stdout
    (line,) = path.read_text().splitlines()
    assert line.startswith("alice:scrypt$16384$8$1$")
    assert auth.read_password_file(path)["alice"].matches(PASSWORD)
    # A second user is added; a new password replaces the old line; --delete removes it.
    assert _passwd(private_store, "bob", "another secret").returncode == 0
    assert _passwd(private_store, "alice", "a new password").returncode == 0
    users = auth.read_password_file(path)
    assert sorted(users) == ["alice", "bob"] and users["alice"].matches("a new password")
    assert not users["alice"].matches(PASSWORD) and users["bob"].matches("another secret")
    assert _passwd(private_store, "bob", "", "--delete").returncode == 0
    assert sorted(auth.read_password_file(path)) == ["alice"]
    missing = _passwd(private_store, "bob", "", "--delete")
    assert missing.returncode == 1 and "no user 'bob'" in missing.stderr


def test_passwd_refuses_bad_names_short_passwords_and_a_db(private_store):
    for name in ("", "a:b", "-x", "a b", "x" * 65):
        done = _passwd(private_store, name, PASSWORD)
        assert done.returncode in (1, 2) and "Traceback" not in done.stderr, name
    short = _passwd(private_store, "alice", "short")
    assert short.returncode == 1 and "at least 8 characters" in short.stderr
    env = {**os.environ, "HERMES_HOME": str(private_store)}
    db = subprocess.run([sys.executable, "-m", "hermes_state_cli", "--db", "x.db", "passwd", "alice"], input=PASSWORD,
                        capture_output=True, text=True, env=env, timeout=60)
    assert db.returncode == 2 and "--db does not apply" in db.stderr
    assert not (private_store / "web-passwords").exists()


def test_a_file_others_can_read_is_refused_and_passwd_closes_it(private_store):
    assert _passwd(private_store, "alice", PASSWORD).returncode == 0
    path = private_store / "web-passwords"
    path.chmod(0o644)
    with pytest.raises(HermesStateError, match=r"mode 0644.*chmod 600"):
        auth.read_password_file(path)
    out = _serve("--host", "0.0.0.0", home=private_store)
    assert out.returncode == 1 and out.stdout == "" and "chmod 600" in out.stderr and "Traceback" not in out.stderr
    again = _passwd(private_store, "alice", PASSWORD)
    assert again.returncode == 0 and "could be read by other users" in again.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_the_file_is_in_the_root_of_the_home_for_every_profile(tmp_path, monkeypatch):
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "profiles" / "coder"))
    with hermes_home_override(None):
        assert auth.default_password_file() == tmp_path / "web-passwords"
        monkeypatch.setenv("HERMES_HOME", str(tmp_path))
        assert auth.default_password_file() == tmp_path / "web-passwords"


def test_a_malformed_line_names_its_number(tmp_path):
    path = tmp_path / "pw"
    path.write_text(f"# users\nalice:{auth.hash_password(PASSWORD)}\nbob:nope\n")
    path.chmod(0o600)
    with pytest.raises(HermesStateError, match="line 3"):
        auth.read_password_file(path)


# --- writers at once, and bytes that are not UTF-8 ----------------------------------------------

def _passwd_started(home: Path, name: str, password: str) -> subprocess.Popen:
    env = {**os.environ, "HERMES_HOME": str(home)}
    process = subprocess.Popen([sys.executable, "-m", "hermes_state_cli", "passwd", name], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert process.stdin is not None
    process.stdin.write(password + "\n")
    process.stdin.flush()  # the process starts hashing now; communicate() closes stdin later
    return process


@pytest.mark.slow
def test_passwd_runs_at_once_lose_no_user_and_no_new_password(private_store):
    assert _passwd(private_store, "alice", "the old password").returncode == 0
    others = [f"user{n:02}" for n in range(11)]
    runs = [_passwd_started(private_store, "alice", "the new password")] + [_passwd_started(private_store, name, f"{name} secret")
                                                                    for name in others]
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0 and "Saved the password of" in out, err
    path = private_store / "web-passwords"
    users = auth.read_password_file(path)
    assert sorted(users) == sorted(["alice", *others])
    assert users["alice"].matches("the new password") and not users["alice"].matches("the old password")
    assert all(users[name].matches(f"{name} secret") for name in others)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in private_store.iterdir() if "web-passwords" in p.name) == [".web-passwords.lock",
                                                                                    "web-passwords"]


def _write_at_once(path: str, name: str, password: str, start) -> None:
    # The hash first, then every process writes at the same moment: the widest race there is.
    made = auth.hash_password(password)
    start.wait()
    auth.write_password_file(Path(path), name, made)


@pytest.mark.slow
def test_writers_released_together_keep_every_user_and_one_line_each(tmp_path):
    import multiprocessing
    path = tmp_path / "pw"
    spawn = multiprocessing.get_context("spawn")  # a fresh interpreter each, as separate `passwd` runs are
    writes = [(f"u{n}", f"password {n}") for n in range(8)] + [("alice", f"alice password {n}") for n in range(4)]
    start = spawn.Barrier(len(writes))
    workers = [spawn.Process(target=_write_at_once, args=(str(path), name, password, start))
               for name, password in writes]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    lines = path.read_text().splitlines()
    assert sorted(line.partition(":")[0] for line in lines) == sorted(["alice", *(f"u{n}" for n in range(8))])
    users = auth.read_password_file(path)
    assert all(users[f"u{n}"].matches(f"password {n}") for n in range(8))
    # One of alice's four writes was the last, and it is the one that counts.
    assert sum(users["alice"].matches(f"alice password {n}") for n in range(4)) == 1


def _not_utf8(path: Path) -> bytes:
    data = f"alice:{auth.hash_password(PASSWORD)}\n".encode() + b"ren\xe9e:x\n"
    path.write_bytes(data)
    path.chmod(0o600)
    return data


def test_a_byte_that_is_not_utf8_is_a_typed_error_naming_the_file_and_its_line(tmp_path):
    path = tmp_path / "web-passwords"
    data = _not_utf8(path)
    with pytest.raises(auth.PasswordFileError, match=r"web-passwords is not UTF-8 text \(byte 0xe9 on line 2\)"):
        auth.read_password_file(path)
    with pytest.raises(auth.PasswordFileError, match="web-passwords is not UTF-8 text"):
        auth.write_password_file(path, "bob", auth.hash_password(PASSWORD))
    assert path.read_bytes() == data  # nothing written


def test_passwd_and_serve_say_in_one_line_which_file_is_not_utf8(private_store):
    path = private_store / "web-passwords"
    data = _not_utf8(path)
    for done in (_passwd(private_store, "bob", PASSWORD), _serve("--host", "0.0.0.0", home=private_store)):
        assert done.returncode == 1 and done.stdout == ""
        (line,) = done.stderr.splitlines()
        assert line.startswith("hermes-state: ") and "web-passwords is not UTF-8 text (byte 0xe9 on line 2)" in line
        assert "codec" not in line and "Traceback" not in line
    assert path.read_bytes() == data


def test_a_running_guard_answers_503_when_the_file_stops_being_utf8(logins, capsys):
    guard = auth.AuthGuard(_unreached, logins)
    assert _ask(guard, _basic("alice", PASSWORD))[0] == 200
    _not_utf8(logins.path)
    sent: list[dict] = []

    async def send(message):
        sent.append(message)
    asyncio.run(guard({"type": "http", "method": "GET", "path": "/", "client": ("192.0.2.1", 1),
                       "headers": [(b"authorization", _basic("alice", PASSWORD).encode())]}, None, send))
    start, body = sent
    assert start["status"] == 503
    assert body["body"].decode() == ("Service Unavailable: the server's password file cannot be used: pw is not "
                                     "UTF-8 text (byte 0xe9 on line 2) (see its terminal)\n")
    (said,) = capsys.readouterr().err.splitlines()
    assert "every request is refused" in said and f"{logins.path.name} is not UTF-8 text" in said


# --- failed logins -------------------------------------------------------------------------------

def test_failures_lock_a_key_for_the_rest_of_the_window():
    now = [1000.0]
    limit = auth.FailureLimit(max_failures=3, window_s=60, clock=lambda: now[0])
    for _ in range(2):
        limit.charge(["address:a", "name:x"])
        now[0] += 10
    assert limit.wait_s(["address:a"]) == 0
    when = limit.charge(["address:a", "name:x"])
    assert limit.wait_s(["address:b", "name:x"]) == pytest.approx(40)  # the first failure leaves at 1060
    assert limit.wait_s(["address:b", "name:y"]) == 0
    limit.refund(["address:a", "name:x"], when)  # that one was the right password after all
    assert limit.wait_s(["address:a"]) == 0
    limit.charge(["address:a"])
    now[0] += 41
    assert limit.wait_s(["address:a"]) == 0 and len(limit.failures["address:a"]) == 2


def test_the_limit_forgets_the_oldest_addresses_past_its_size():
    limit = auth.FailureLimit(max_failures=1, window_s=60, clock=lambda: 0.0, max_keys=3)
    for address in "abcd":
        limit.charge([f"address:{address}"])
    assert list(limit.failures) == ["address:b", "address:c", "address:d"]


def test_address_churn_never_resets_a_names_failures():
    # A client owning many /64s fails once from each, each time with a name of its own: far more
    # keys than the address table keeps. The name it guessed before stays locked all the same.
    now = [1000.0]
    limit = auth.FailureLimit(max_failures=3, window_s=900, clock=lambda: now[0], max_keys=16)
    for n in range(3):
        limit.charge([f"address:2001:db8:0:{n}::/64", "name:alice"])
    assert limit.wait_s(["name:alice"]) == pytest.approx(900)
    for n in range(5000):
        now[0] = 1000.0 + (n + 1) / 100
        limit.charge([f"address:2001:db8:1:{n:x}::/64", f"name:x{n}"])
    # Until alice's own failures leave the window at least (a name sharing her bucket adds, never takes).
    assert limit.wait_s(["address:2001:db8:ffff::/64", "name:alice"]) >= 900 - 50 - 1e-6
    assert len(limit.failures) <= 16  # memory stays bounded on both sides
    assert len(limit.names) <= limit.name_buckets


def test_the_names_table_is_bounded_without_evicting_anyone():
    limit = auth.FailureLimit(max_failures=2, window_s=60, clock=lambda: 0.0, name_buckets=8)
    for n in range(1000):
        limit.charge([f"name:n{n}"])
    assert len(limit.names) <= 8 and all(len(recent) <= 2 for recent in limit.names.values())
    assert all(limit.wait_s([f"name:n{n}"]) == 60 for n in range(1000))  # a full bucket locks; none is forgotten


def test_clients_are_counted_by_address_and_ipv6_by_its_64():
    assert auth.client_key({"client": ("192.0.2.7", 5000)}) == "address:192.0.2.7"
    assert auth.client_key({"client": ("2001:db8::1", 1)}) == auth.client_key({"client": ("2001:db8::ffff", 2)})
    assert auth.client_key({"client": ("2001:db8:0:1::1", 1)}) != auth.client_key({"client": ("2001:db8::1", 1)})
    assert auth.client_key({"client": ("::ffff:192.0.2.7", 1)}) == "address:192.0.2.7"
    assert auth.client_key({}) == "address:unknown"


def test_basic_credentials_are_read_only_from_a_well_formed_header():
    def header(text: bytes) -> bytes:
        return b"Basic " + base64.b64encode(text)
    assert auth.basic_credentials(header(b"alice:pa:ss")) == ("alice", "pa:ss")
    assert auth.basic_credentials(header("renée:mot de passé".encode())) == ("renée", "mot de passé")
    assert auth.basic_credentials(b"bAsIc " + base64.b64encode(b"a:b")) == ("a", "b")
    for bad in (b"", b"Bearer xyz", header(b"no colon"), b"Basic !!!", header(b"\xff:x")):
        assert auth.basic_credentials(bad) is None, bad


# --- the guard, driven directly ------------------------------------------------------------------

def _ask(guard: auth.AuthGuard, authorization: str | None, client: str = "192.0.2.1") -> tuple[int, dict, dict]:
    sent: list[dict] = []
    seen: dict = {}

    async def app(scope, receive, send):
        seen.update(scope)
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message):
        sent.append(message)
    headers = [] if authorization is None else [(b"authorization", authorization.encode())]
    guard.app = app
    asyncio.run(guard({"type": "http", "method": "GET", "path": "/", "headers": headers,
                       "client": (client, 1234)}, None, send))
    return sent[0]["status"], dict(sent[0]["headers"]), seen


async def _unreached(scope, receive, send) -> None:
    raise AssertionError("the guard passed on a request it was meant to answer itself")


def _basic(name: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()


@pytest.fixture
def logins(tmp_path) -> auth.Logins:
    path = tmp_path / "pw"
    auth.write_password_file(path, "alice", auth.hash_password(PASSWORD))
    return auth.Logins(path)


def test_an_unknown_name_costs_one_hash_like_a_known_one(logins, monkeypatch):
    guard = auth.AuthGuard(_unreached, logins)
    checked: list[auth.Hash] = []
    real = auth.Hash.matches

    def spy(self, password):
        checked.append(self)
        return real(self, password)
    monkeypatch.setattr(auth.Hash, "matches", spy)
    assert _ask(guard, _basic("mallory", PASSWORD))[0] == 401
    assert _ask(guard, _basic("alice", "wrong password"))[0] == 401
    assert checked == [guard.decoy, logins.users["alice"]]
    status, _, scope = _ask(guard, _basic("alice", PASSWORD))
    assert status == 200 and scope[auth.ACTOR_SCOPE_KEY] == {"id": "basic:alice"}
    # A login already checked is not hashed again, until the file changes.
    assert _ask(guard, _basic("alice", PASSWORD))[0] == 200 and len(checked) == 3
    assert all(PASSWORD.encode() not in key for key in guard.checked)


def test_a_failed_login_is_said_on_the_terminal_with_name_and_address_never_the_password(logins, capsys):
    guard = auth.AuthGuard(_unreached, logins)
    assert _ask(guard, _basic("alice", "wrong \x1b[2J password"))[0] == 401
    assert _ask(guard, _basic("\x1b[31mmallory", PASSWORD))[0] == 401
    assert _ask(guard, _basic("alice", PASSWORD))[0] == 200
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 2 and all(line.startswith("hermes-state serve: failed login as ") for line in said)
    assert "'alice'" in said[0] and "\x1b" not in "".join(said)  # a name cannot drive the terminal
    assert not any("wrong" in line or PASSWORD in line for line in said)


def test_the_guard_reads_the_file_again_and_refuses_all_when_it_goes_wrong(logins, capsys):
    guard = auth.AuthGuard(_unreached, logins)
    assert _ask(guard, _basic("alice", PASSWORD))[0] == 200
    auth.write_password_file(logins.path, "alice", auth.hash_password("a new password"))
    assert _ask(guard, _basic("alice", PASSWORD))[0] == 401  # the remembered login is forgotten
    assert _ask(guard, _basic("alice", "a new password"))[0] == 200
    logins.path.chmod(0o640)
    status, headers, _ = _ask(guard, _basic("alice", "a new password"))
    assert status == 503 and "chmod 600" in capsys.readouterr().err
    logins.path.unlink()
    assert _ask(guard, _basic("alice", "a new password"))[0] == 503


def test_no_user_in_the_file_refuses_to_start(tmp_path):
    path = tmp_path / "pw"
    auth.write_password_file(path, "alice", auth.hash_password(PASSWORD))
    auth.write_password_file(path, "alice", None)
    with pytest.raises(HermesStateError, match="holds no user.*hermes-state passwd NAME"):
        auth.Logins(path)


# --- a real server ---------------------------------------------------------------------------------

def test_off_loopback_the_pages_need_a_login(users, tmp_path):
    with _running(users, tmp_path / "serve.log", "--host", "0.0.0.0") as (port, announced):
        assert "login as a user of" in announced and "NO AUTHENTICATION" not in announced
        status, headers, body = _get(port, "/-/hermes/state/session/s1")
        assert status == 401 and headers["www-authenticate"] == 'Basic realm="hermes-state", charset="UTF-8"'
        assert "private words" not in body
        assert _get(port, "/-/hermes/state/session/s1", ("alice", "wrong password"))[0] == 401
        assert _get(port, "/-/hermes/state/session/s1", ("mallory", PASSWORD))[0] == 401
        status, _, body = _get(port, "/-/hermes/state/session/s1", ("alice", PASSWORD))
        assert status == 200 and "private words" in body
        # The same login opens every page the server has: the sessions, Datasette's own tables.
        for path in ("/-/hermes/state", "/state/messages.json", "/-/hermes/state/search?q=private"):
            status, _, body = _get(port, path, ("bob", PASSWORD))
            assert status == 200 and "private" in body, path
        actor = json.loads(_get(port, "/-/actor.json", ("alice", PASSWORD))[2])
        assert actor == {"actor": {"id": "basic:alice"}}
        # A user added while it runs can log in at once; a foreign Host is still refused first.
        assert _passwd(users, "carol", "carol's password").returncode == 0
        assert _get(port, "/-/hermes/state", ("carol", "carol's password"))[0] == 200
        assert _get(port, "/-/hermes/state", ("alice", PASSWORD), host="attacker.example")[0] == 403


@pytest.mark.slow
def test_failed_logins_get_429_per_address_and_per_name(users, tmp_path):
    with _running(users, tmp_path / "serve.log", "--host", "0.0.0.0") as (port, _):
        for _ in range(auth.MAX_FAILURES):
            assert _get(port, "/-/hermes/state", ("alice", "wrong password"))[0] == 401
        status, headers, body = _get(port, "/-/hermes/state", ("alice", PASSWORD))  # right, but too late
        assert status == 429 and 0 < int(headers["retry-after"]) <= auth.WINDOW_S and "private" not in body
        assert _get(port, "/-/hermes/state", ("bob", PASSWORD))[0] == 429  # this address is locked out
        # From another address: alice's name is locked out, bob is not.
        assert _get(port, "/-/hermes/state", ("alice", PASSWORD), source="127.0.0.2")[0] == 429
        assert _get(port, "/-/hermes/state", ("bob", PASSWORD), source="127.0.0.2")[0] == 200


@pytest.mark.slow
def test_allow_host_replaces_the_names_the_guard_accepts(users, tmp_path):
    with _running(users, tmp_path / "serve.log", "--host", "0.0.0.0", "--allow-host", "Box.LAN:8001",
                  "--allow-host", "hermes.example") as (port, announced):
        assert f"http://box.lan:{port}/-/hermes/state" in announced
        assert _get(port, "/-/hermes/state", ("alice", PASSWORD))[0] == 403  # Host 127.0.0.1 is not listed
        assert _get(port, "/-/hermes/state", host="box.lan")[0] == 401
        assert _get(port, "/-/hermes/state", ("alice", PASSWORD), host=f"hermes.example:{port}")[0] == 200


@pytest.mark.slow
def test_a_password_file_on_loopback_asks_for_a_login_too(users, tmp_path):
    with _running(users, tmp_path / "serve.log", "--password-file", str(users / "web-passwords")) as (port, _):
        assert _get(port, "/-/hermes/state")[0] == 401
        assert _get(port, "/-/hermes/state", ("alice", PASSWORD))[0] == 200


def test_off_loopback_without_users_it_refuses_to_start(private_store):
    out = _serve("--host", "0.0.0.0", home=private_store)
    assert out.returncode == 1 and out.stdout == "" and "Traceback" not in out.stderr
    (line,) = out.stderr.splitlines()
    assert "needs a password" in line and "hermes-state passwd NAME" in line and "--no-auth" in line


@pytest.mark.slow
def test_no_auth_starts_with_a_warning_on_every_start(private_store, tmp_path):
    for run in range(2):
        with _running(private_store, tmp_path / f"serve{run}.log", "--host", "0.0.0.0", "--no-auth") as (port, printed):
            warning = next(line for line in printed.splitlines() if "WARNING" in line)
            assert "0.0.0.0" in warning and "NO AUTHENTICATION" in warning and "every conversation" in warning
            assert _get(port, "/-/hermes/state/session/s1")[0] == 200


@pytest.mark.slow
def test_every_profile_off_loopback_opens_with_the_same_login(users, tmp_path):
    # A second profile beside the default one: its pages take the login of the root's password file.
    with SessionDB(users / "profiles" / "coder" / "state.db") as db:
        db.create_session("c1", "telegram")
        db.append_message("c1", "user", "coder's secret")
    with _running(users, tmp_path / "serve.log", "--all-profiles", "--host", "0.0.0.0") as (port, announced):
        assert f":{port}/-/hermes " in announced and "login as a user of" in announced
        for path in ("/-/hermes", "/-/hermes/coder/session/c1", "/-/hermes/all.json"):
            status, _, body = _get(port, path)
            assert status == 401 and "secret" not in body and "private" not in body, path
            assert _get(port, path, ("alice", "wrong password"))[0] == 401, path
        status, _, body = _get(port, "/-/hermes/default/session/s1", ("alice", PASSWORD))
        assert status == 200 and "private words" in body
        status, _, body = _get(port, "/-/hermes/coder/session/c1", ("alice", PASSWORD))
        assert status == 200 and "secret" in body
        listed = json.loads(_get(port, "/-/hermes/all.json", ("bob", PASSWORD))[2])
        assert {(s["profile"], s["id"]) for s in listed["sessions"]} == {("default", "s1"), ("coder", "c1")}
        assert listed["errors"] == []
