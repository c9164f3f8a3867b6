"""`hermes-state serve`: one-line errors, the real port, and a guard against other sites' pages."""
from __future__ import annotations

import asyncio
import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hermes_state_serve as serve
from hermes_state import SessionDB


def _serve(*argv: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HERMES_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "hermes_state_cli", "serve", *argv], capture_output=True,
                          text=True, env=env, timeout=60)


# --- errors and the port -----------------------------------------------------------------------

def test_a_port_out_of_range_is_a_one_line_usage_error(private_store):
    for port in ("99999", "-1", "http"):
        out = _serve("--port", port, home=private_store)
        assert out.returncode == 2 and "Traceback" not in out.stderr and "--port" in out.stderr, port
        assert "Serving" not in out.stdout


def test_a_port_in_use_is_one_line_and_nothing_is_announced(private_store):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = _serve("--port", str(port), home=private_store)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr == f"hermes-state: cannot serve on 127.0.0.1 port {port}: it is in use " \
                         "(pick another with --port, or 0 for any free one)\n"


def test_another_interface_without_auth_warns_that_the_store_has_no_authentication(private_store):
    with socket.socket() as taken:  # the port is taken, so nothing is ever exposed
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        out = _serve("--host", "0.0.0.0", "--no-auth", "--port", str(taken.getsockname()[1]), home=private_store)
    assert out.returncode == 1
    warning, error = out.stderr.splitlines()
    assert "0.0.0.0" in warning and "NO AUTHENTICATION" in warning and "in use" in error
    assert serve.warning_for("127.0.0.1") is None and serve.warning_for("localhost") is None
    assert serve.warning_for("::1") is None and serve.warning_for("127.0.0.2") is None
    assert "NO AUTHENTICATION" in serve.warning_for("192.168.1.20")


@pytest.fixture
def server(private_store, tmp_path):
    """A real `serve --port 0`; yields (port, announced line)."""
    log = tmp_path / "serve.log"
    env = {**os.environ, "HERMES_HOME": str(private_store)}
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "hermes_state_cli", "serve", "--port", "0"], stdout=out,
                                   stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and process.poll() is None:
            found = re.search(r"http://127\.0\.0\.1:(\d+)/", log.read_text())
            if found:
                port = int(found.group(1))
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    pass
            time.sleep(0.1)
        else:
            pytest.fail(f"serve did not start: {log.read_text()}")
        yield port, log.read_text()
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(10)


def _request(port: int, path: str, method: str = "GET", headers: dict[str, str] | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        conn.close()


def test_port_zero_announces_the_real_port_and_foreign_hosts_get_403(server):
    port, announced = server
    assert port != 0 and f"http://127.0.0.1:{port}/-/hermes/state" in announced
    status, body = _request(port, "/-/hermes/state/session/s1")
    assert status == 200 and "private words" in body
    for host in ("localhost", f"localhost:{port}", f"127.0.0.1:{port}"):
        assert _request(port, "/state.json", headers={"Host": host})[0] == 200, host
    for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.attacker.example", ""):
        status, body = _request(port, "/state.json?sql=select+content+from+messages", headers={"Host": host})
        assert status == 403 and "private words" not in body, host
    # Not a plain GET: the page that sends it must be this server's own.
    assert _request(port, "/-/messages", "POST")[0] == 403
    assert _request(port, "/-/messages", "POST", {"Origin": "http://attacker.example"})[0] == 403
    assert _request(port, "/-/messages", "POST", {"Origin": f"http://127.0.0.1:{port + 1}"})[0] == 403
    assert _request(port, "/-/messages", "POST", {"Origin": f"http://127.0.0.1:{port}"})[0] != 403


# --- the guard itself ----------------------------------------------------------------------------

def _through_guard(guard: serve.HostGuard, scope: dict) -> int:
    sent: list[dict] = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request"}
    guard.app = app
    asyncio.run(guard(scope, receive, send))
    return sent[0]["status"]


def _scope(method: str = "GET", **headers: str) -> dict:
    return {"type": "http", "method": method, "path": "/", "headers": [
        (k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]}


def test_the_guard_allows_the_bound_names_only():
    guard = serve.HostGuard(None, serve.allowed_hosts("127.0.0.1"), 8001)
    assert _through_guard(guard, _scope(host="127.0.0.1:8001")) == 200
    assert _through_guard(guard, _scope(host="[::1]:8001")) == 200
    assert _through_guard(guard, _scope(host="LOCALHOST")) == 200
    assert _through_guard(guard, _scope(host="evil.example:8001")) == 403
    assert _through_guard(guard, _scope()) == 403  # no Host at all
    assert _through_guard(guard, _scope("HEAD", host="localhost")) == 200
    assert _through_guard(guard, _scope("POST", host="localhost", origin="http://localhost:8001")) == 200
    assert _through_guard(guard, _scope("POST", host="localhost", origin="null")) == 403
    assert _through_guard(guard, _scope("PUT", host="localhost", origin="https://localhost:8001")) == 403
    assert _through_guard(guard, _scope("DELETE", host="localhost")) == 403
    named = serve.HostGuard(None, serve.allowed_hosts("192.168.1.20"), 80)
    assert _through_guard(named, _scope(host="192.168.1.20")) == 200
    assert _through_guard(named, _scope("POST", host="192.168.1.20", origin="http://192.168.1.20")) == 200
    assert _through_guard(named, _scope(host="evil.example")) == 403


def test_lifespan_events_pass_through_the_guard():
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])
    asyncio.run(serve.HostGuard(app, frozenset(), 1)({"type": "lifespan"}, None, None))
    assert seen == ["lifespan"]


# --- what a running server says ------------------------------------------------------------------

def _start(home: Path, log: Path, *argv: str) -> tuple[subprocess.Popen, int]:
    env = {**os.environ, "HERMES_HOME": str(home)}
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "hermes_state_cli", "serve", "--port", "0", *argv],
                                   stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        found = re.search(r"http://(?:127\.0\.0\.1|localhost):(\d+)/", log.read_text())
        if found:
            try:
                socket.create_connection(("127.0.0.1", int(found.group(1))), timeout=1).close()
                return process, int(found.group(1))
            except OSError:
                pass
        time.sleep(0.1)
    os.killpg(process.pid, signal.SIGKILL)
    pytest.fail(f"serve did not start: {log.read_text()}")


@pytest.mark.slow
def test_each_request_is_one_line_and_a_stop_mid_request_ends_the_server(private_store, tmp_path):
    log = tmp_path / "serve.log"
    process, port = _start(private_store, log)
    try:
        assert _request(port, "/-/hermes/state?q=x")[0] in (200, 302)
        assert _request(port, "/nope")[0] == 404
        # A client that sent half a request: a stop does not wait on it.
        half = socket.create_connection(("127.0.0.1", port))
        half.sendall(b"GET /-/hermes HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        time.sleep(0.2)
        os.killpg(process.pid, signal.SIGTERM)
        assert process.wait(10) is not None
        half.close()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    lines = log.read_text().splitlines()
    requests = [line for line in lines if "HTTP/1.1" in line]
    assert any('"GET /-/hermes/state?q=x HTTP/1.1"' in line for line in requests)
    assert any('"GET /nope HTTP/1.1" 404' in line for line in requests)
    assert not any("Uvicorn running" in line or "Started server process" in line for line in lines)


def test_a_server_on_every_interface_announces_urls_a_browser_can_open():
    urls = serve.page_urls("0.0.0.0", 8001, "/-/hermes/state")
    name = socket.getfqdn().lower()
    assert urls == ["http://localhost:8001/-/hermes/state"] + ([] if name == "localhost" else
                                                               [f"http://{name}:8001/-/hermes/state"])
    assert serve.page_urls("::", 8001, "/x")[0] == "http://localhost:8001/x"
    assert serve.page_urls("127.0.0.1", 8001, "/x") == ["http://127.0.0.1:8001/x"]
    assert serve.page_urls("::1", 8001, "/x") == ["http://[::1]:8001/x"]
    assert serve.page_urls("0.0.0.0", 8001, "/x", ["box.lan"]) == ["http://box.lan:8001/x"]


def test_every_profile_says_at_start_up_which_profiles_it_cannot_read(tmp_path):
    root = tmp_path / "root"
    for home in (root, root / "profiles" / "coder", root / "profiles" / "broken"):
        home.mkdir(parents=True, exist_ok=True)
        with SessionDB(home / "state.db") as db:
            db.create_session("s1", "cli")
    (root / "profiles" / "broken" / "state.db").write_bytes(b"SQLite format 3\x00" + b"\x00" * 84)
    (root / "profiles" / "empty").mkdir()  # a profile with no store yet: nothing wrong with it
    assert [name for name, _ in serve.unreadable_profiles(root)] == ["broken"]
    log = tmp_path / "serve.log"
    process, port = _start(root, log, "--all-profiles")
    try:
        said = [line for line in log.read_text().splitlines() if "cannot be read" in line]
        assert len(said) == 1 and "profile 'broken' cannot be read" in said[0]
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(10)
