"""`hermes-state serve`: Datasette on a loopback port, read-only, answering only its own host name.

Owns: checking the address and port before anything starts (a port in use or out of range is
a one-line error, and port 0 picks a free port whose real number is printed), the warning when
an explicit `--host` reaches other machines, and the guard in front of Datasette: a request
whose Host header is not the name or address the server was started on is refused with 403
(a web page the user visits cannot read the store through DNS rebinding), and anything but a
plain GET or HEAD must come from the server's own page (its Origin header). Off loopback a
password is required (`--no-auth` serves without one, under a loud warning), and `--allow-host`
replaces the names the guard accepts.
Does not own: the pages (hermes_state_web), opening the database (hermes_state_commands) or the
logins (hermes_state_auth).
With `--all-profiles` it serves every profile of the root instead of one file (the plugin opens them).
Nothing here writes to the database.
"""
from __future__ import annotations

import argparse
import ipaddress
import socket
import sys
from pathlib import Path
from typing import Any, Awaitable, Callable
from urllib.parse import quote, urlsplit

import hermes_state_auth as auth
from hermes_state_commands import open_db
from hermes_state_errors import HermesStateError
from hermes_state_home import display_hermes_home, profiles_root

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_SAFE_METHODS = frozenset({"GET", "HEAD"})


def port_number(text: str) -> int:
    """Parse a TCP port: 1-65535, or 0 for any free port."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0-65535 (0 picks a free one), not {value}")
    return value


def is_loopback(host: str) -> bool:
    """Say whether `host` (a name or an address) only reaches this machine."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(host: str) -> frozenset[str]:
    """Return the host names a request may carry for a server bound to `host` (lower case, no port)."""
    names = set(LOOPBACK_NAMES)
    try:
        wildcard = ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        wildcard = False
    if wildcard:  # every interface: this machine's own names and addresses
        names.add(socket.gethostname().lower())
        names.add(socket.getfqdn().lower())
    else:
        names.add(host.strip("[]").lower())
    return frozenset(names)


def _host_name(value: str) -> str:
    # "example.org:8001" -> "example.org"; "[::1]:8001" -> "::1".
    parsed = urlsplit(f"//{value}")
    try:
        return (parsed.hostname or "").lower()
    except ValueError:
        return ""


class HostGuard:
    """ASGI middleware: 403 for a foreign Host, and for a non-GET request from another origin."""

    def __init__(self, app: Callable[..., Awaitable[Any]], hosts: frozenset[str], port: int):
        self.app, self.hosts, self.port = app, hosts, port

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Pass a request on, or answer it with 403 when it may come from another site."""
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)  # lifespan events carry no request
        problem = self.problem(scope)
        if problem is None:
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = f"Forbidden: {problem}\n".encode()
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    def problem(self, scope: dict[str, Any]) -> str | None:
        """Return why a request is refused, or None when it may go on."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = _host_name(headers.get("host", ""))
        if host not in self.hosts:
            return f"this server answers only {', '.join(sorted(self.hosts))}, not Host {headers.get('host')!r}"
        if scope["type"] == "http" and scope.get("method", "GET").upper() in _SAFE_METHODS:
            return None
        origin = headers.get("origin")
        if origin is None:
            return "a request that is not a plain GET must carry the Origin of this server's pages"
        parsed = urlsplit(origin)
        try:
            port = parsed.port or {"http": 80, "https": 443}.get(parsed.scheme)
        except ValueError:
            port = None
        # The server speaks plain HTTP, so its own pages have an http:// origin on its port.
        if parsed.scheme != "http" or _host_name(parsed.netloc) not in self.hosts or port != self.port:
            return f"Origin {origin!r} is not this server"
        return None


def host_name(text: str) -> str:
    """Parse an `--allow-host` value: a host name or address, lower case, without a port."""
    name = _host_name(text)
    if not name:
        raise argparse.ArgumentTypeError(f"not a host name: {text!r}")
    return name


def warning_for(host: str) -> str | None:
    """Return the warning to print before serving on `host` without a password, or None for a loopback address."""
    if is_loopback(host):
        return None
    return (f"WARNING: serving on {host} with NO AUTHENTICATION (--no-auth): anyone who can connect to this "
            "port can read every conversation in the store")


def bind(host: str, port: int) -> socket.socket:
    """Return a listening socket on (host, port), or raise HermesStateError saying why not."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise HermesStateError(f"cannot serve on {host}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        reason = "it is in use (pick another with --port, or 0 for any free one)" \
            if exc.errno in (98, 48, 10048) else (exc.strerror or str(exc))
        raise HermesStateError(f"cannot serve on {host} port {port}: {reason}") from None
    sock.set_inheritable(True)
    return sock


STOP_GRACE_S = 1  # how long a stop (Ctrl-C, SIGTERM) waits for open connections to finish


def page_urls(host: str, port: int, page: str, allow_host: list[str] | None = None) -> list[str]:
    """Return the page's URL a browser here can open, then (bound to every interface) the one for other machines."""
    if allow_host:
        names = [allow_host[0]]
    else:
        try:
            wildcard = ipaddress.ip_address(host.strip("[]")).is_unspecified
        except ValueError:
            wildcard = False
        # 0.0.0.0 and :: are where the server listens, not addresses a browser can open.
        names = ["localhost", socket.getfqdn().lower()] if wildcard else [host]
    return [f"http://{f'[{n}]' if ':' in n else n}:{port}{page}" for n in dict.fromkeys(names)]


def request_log_config() -> dict[str, Any]:
    """Return uvicorn's logging set-up with only its request lines (INFO) and its warnings, on stderr."""
    handler = {"class": "logging.StreamHandler", "stream": "ext://sys.stderr", "formatter": "plain"}
    return {"version": 1, "disable_existing_loggers": False,
            "formatters": {"plain": {"format": "%(asctime)s %(message)s", "datefmt": "%Y-%m-%d %H:%M:%S"}},
            "handlers": {"stderr": handler},
            "loggers": {"uvicorn.error": {"handlers": ["stderr"], "level": "WARNING", "propagate": False},
                        "uvicorn.access": {"handlers": ["stderr"], "level": "INFO", "propagate": False}}}


def unreadable_profiles(root: Path) -> list[tuple[str, str]]:
    """Return (name, why) of each profile under `root` whose store a read-only open cannot read."""
    from hermes_state import SessionDB
    from hermes_state_home import profile_homes
    found = []
    for name, home in profile_homes(root):
        path = home / "state.db"
        if not path.exists():
            continue  # a profile without a store yet has nothing to show, and nothing wrong
        try:
            with SessionDB(path, read_only=True):
                pass
        except HermesStateError as exc:
            found.append((name, str(exc).split(". ")[0]))
    return found


def _one_store(datasette: Any, args: argparse.Namespace) -> tuple[Any, str, str]:
    # A read-only open first: a missing file is an error (never created), an unknown schema is named.
    with open_db(args) as db:
        path = str(db.db_path)
    # Datasette opens a mutable file with mode=ro and sees each committed write. --immutable
    # would tell SQLite the file never changes while the agent keeps writing it: never used.
    ds = datasette([path])
    name = next(n for n, d in ds.databases.items() if d.path == path)
    return ds, display_hermes_home(Path(path)), f"/-/hermes/{quote(name, safe='')}"


def _every_profile(datasette: Any, args: argparse.Namespace) -> tuple[Any, str, str]:
    # Each profile's store is opened by the plugin, which serves those that open and says why the others do not.
    if args.db:
        raise HermesStateError("--all-profiles serves every profile of the root; it takes no --db")
    root = profiles_root()
    if not root.is_dir():
        raise HermesStateError(f"{root} does not exist: there is no profile to serve")
    for name, why in unreadable_profiles(root):
        print(f"hermes-state serve: profile {name!r} cannot be read and is shown as unavailable: {why}",
              file=sys.stderr, flush=True)
    ds = datasette([], metadata={"plugins": {"hermes-state": {"profiles_root": str(root)}}})
    return ds, f"every profile of {display_hermes_home(root)}", "/-/hermes"


def cmd_serve(args: argparse.Namespace) -> int:
    """Browse the database in Datasette on 127.0.0.1, read-only (needs the [web] extra)."""
    try:
        import uvicorn
        from datasette.app import Datasette
    except ImportError:
        raise HermesStateError("hermes-state serve needs Datasette: pip install 'hermes-state[web]'") from None
    choose = _every_profile if getattr(args, "all_profiles", False) else _one_store
    ds, what, page = choose(Datasette, args)
    logins = auth.logins_for(is_loopback(args.host), args.password_file, args.no_auth)
    warning = warning_for(args.host) if logins is None else None
    if warning:  # on every start, before anything listens
        print(warning, file=sys.stderr, flush=True)
    sock = bind(args.host, args.port)
    port = sock.getsockname()[1]
    login = "" if logins is None else f", login as a user of {display_hermes_home(logins.path)}"
    urls = page_urls(args.host, port, page, args.allow_host)
    print(f"Serving {what} read-only at {urls[0]} (Ctrl-C stops{login})", flush=True)
    if len(urls) > 1:
        print(f"From other machines: {urls[1]}", flush=True)
    app = ds.app() if logins is None else auth.AuthGuard(ds.app(), logins)
    app = HostGuard(app, frozenset(args.allow_host) if args.allow_host else allowed_hosts(args.host), port)
    # One line per request on stderr (method, path, status; never a header, so never a password),
    # uvicorn's own start-up lines left out; a stop waits at most a second for open connections.
    config = uvicorn.Config(app, log_config=request_log_config(), log_level=None, lifespan="on", workers=1,
                            timeout_graceful_shutdown=STOP_GRACE_S)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
    return 0
