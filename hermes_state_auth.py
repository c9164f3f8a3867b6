"""Who may read the web pages: the password file, its hashes, checking a login, and the guard in front.

Owns: the password file (`web-passwords` in the root of the Hermes home, shared by its profiles:
one `name:hash` line per user, mode 0600, refused when other users may read it), `hermes-state
passwd` which writes it (one at a time, under a lock on a sidecar file), hashing (scrypt with a
random salt and its parameters on each line; PBKDF2-SHA256 where this Python has no scrypt), checking an HTTP basic login in constant time (an
unknown name costs the same hash as a known one), the limit on failed logins per client address and
per name (429 with Retry-After), and `AuthGuard`, the ASGI middleware that answers 401 without a
valid login and hands the user on as Datasette's actor `basic:<name>` (hermes_state_web reads it).
Does not own: which Host a request may name, or starting the server (hermes_state_serve).
No password is kept in plain text, printed or logged: the file holds hashes, and a login already
checked is remembered only as an HMAC under a key this process draws at start.
Nothing here touches SQLite.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import collections
import contextlib
import dataclasses
import getpass
import hashlib
import hmac
import ipaddress
import math
import os
import re
import secrets
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable, Iterator

from hermes_state_errors import HermesStateError
from hermes_state_home import display_hermes_home, get_hermes_home

PASSWORD_FILE_NAME = "web-passwords"
# Where AuthGuard puts the checked user in the ASGI scope; only middleware can set scope keys,
# so a request cannot claim an actor by itself.
ACTOR_SCOPE_KEY = "hermes_state.actor"
REALM = "hermes-state"
# Failed logins allowed per client address and per name within the window, before 429.
MAX_FAILURES = 10
WINDOW_S = 900.0
MIN_PASSWORD_CHARS = 8
# scrypt's cost: 16 MiB of memory and about 0.1 s per check on this project's machines.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2 ** 14, 8, 1
PBKDF2_ITERATIONS = 600_000
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
_NAME_RULE = "1-64 letters, digits, '.', '_', '@' or '-', starting with a letter or digit"


# --- hashes --------------------------------------------------------------------------------------

def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@dataclasses.dataclass(frozen=True)
class Hash:
    """One stored password hash: the scheme, its cost parameters, the salt and the derived key."""

    scheme: str
    params: tuple[int, ...]
    salt: bytes
    key: bytes

    @classmethod
    def parse(cls, text: str) -> "Hash":
        """Read `scrypt$N$r$p$salt$key` or `pbkdf2_sha256$iterations$salt$key`; ValueError when malformed."""
        scheme, *fields = text.split("$")
        counts = {"scrypt": 3, "pbkdf2_sha256": 1}
        if scheme not in counts or len(fields) != counts[scheme] + 2:
            raise ValueError("not a hash this program writes")
        params = tuple(int(f) for f in fields[:-2])
        try:
            salt, key = (base64.b64decode(f, validate=True) for f in fields[-2:])
        except binascii.Error:
            raise ValueError("salt or key is not base64") from None
        # Bounds keep a hand-edited line from making every check take minutes or gigabytes.
        if scheme == "scrypt":
            n, r, p = params
            sane = 2 ** 10 <= n <= 2 ** 20 and n & (n - 1) == 0 and 1 <= r <= 32 and 1 <= p <= 16
        else:
            sane = 10_000 <= params[0] <= 10_000_000
        if not sane or len(salt) < 8 or len(key) < 16:
            raise ValueError("its parameters are out of range")
        return cls(scheme, params, salt, key)

    def __str__(self) -> str:
        return "$".join([self.scheme, *map(str, self.params), _b64(self.salt), _b64(self.key)])

    def derive(self, password: str) -> bytes:
        """Return the key `password` gives under this hash's scheme, salt and parameters."""
        secret = password.encode("utf-8")
        if self.scheme == "scrypt":
            n, r, p = self.params
            return hashlib.scrypt(secret, salt=self.salt, n=n, r=r, p=p, dklen=len(self.key),
                                  maxmem=129 * n * r * p + (1 << 20))
        return hashlib.pbkdf2_hmac("sha256", secret, self.salt, self.params[0], dklen=len(self.key))

    def matches(self, password: str) -> bool:
        """Say whether `password` is the one this hash was made from (constant time in the comparison)."""
        return hmac.compare_digest(self.derive(password), self.key)


def hash_password(password: str) -> Hash:
    """Hash `password` with a fresh random salt: scrypt, or PBKDF2-SHA256 where scrypt is missing."""
    salt = secrets.token_bytes(16)
    if hasattr(hashlib, "scrypt"):  # absent when Python's OpenSSL lacks it (LibreSSL, old builds)
        blank = Hash("scrypt", (SCRYPT_N, SCRYPT_R, SCRYPT_P), salt, bytes(32))
    else:
        blank = Hash("pbkdf2_sha256", (PBKDF2_ITERATIONS,), salt, bytes(32))
    return dataclasses.replace(blank, key=blank.derive(password))


# --- the password file ---------------------------------------------------------------------------

def default_password_file() -> Path:
    """Return `web-passwords` in the root of the Hermes home (a profile's home is <root>/profiles/<name>)."""
    home = get_hermes_home()
    if home.parent.name == "profiles":
        home = home.parent.parent
    return home / PASSWORD_FILE_NAME


def validate_name(name: str) -> str:
    """Return `name` when it can be a login name, else raise HermesStateError."""
    if not _NAME_RE.fullmatch(name):
        raise HermesStateError(f"invalid user name {name!r}: use {_NAME_RULE}")
    return name


def _loose(mode: int) -> bool:
    # Windows has no group and other bits (its modes say 0666): there the ACLs decide, unchecked.
    return os.name == "posix" and bool(mode & 0o077)


class PasswordFileError(HermesStateError):
    """The password file cannot be used; `brief` names the file and the problem in a few words (no advice, no path)."""

    def __init__(self, message: str, brief: str) -> None:
        super().__init__(message)
        self.brief = brief


def _no_file(path: Path) -> PasswordFileError:
    return PasswordFileError(f"no password file {display_hermes_home(path)}: create a user with "
                             "`hermes-state passwd NAME`", f"{path.name} does not exist")


def _decoded(path: Path, raw: bytes) -> str:
    """Return the password file's bytes as text; a byte that is not UTF-8 is a PasswordFileError naming its line."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        what = f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} on line {line})"
        raise PasswordFileError(f"{display_hermes_home(path)} {what}: delete or retype line {line} in an editor, "
                                "then run `hermes-state passwd NAME` again", f"{path.name} {what}") from None


def read_password_file(path: Path) -> dict[str, Hash]:
    """Return the users and hashes in `path`; raise PasswordFileError when it is missing, open to others or malformed."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise _no_file(path) from None
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(fd).st_mode  # of the file opened, not of whatever the path names a moment later
        if _loose(mode):
            raise PasswordFileError(f"{display_hermes_home(path)} may be read by other users (mode "
                                    f"{mode & 0o777:04o}): run `chmod 600 {path}` and start again",
                                    f"{path.name} may be read by other users")
        text = _decoded(path, handle.read())
    users: dict[str, Hash] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        name, _, stored = line.partition(":")
        try:
            users[validate_name(name)] = Hash.parse(stored.strip())
        except (ValueError, HermesStateError) as exc:
            raise PasswordFileError(f"{display_hermes_home(path)} line {number} is not `name:hash` ({exc}): "
                                    "write it again with `hermes-state passwd NAME`",
                                    f"{path.name} line {number} is not `name:hash`") from None
    return users


@contextlib.contextmanager
def _only_writer(path: Path) -> Iterator[None]:
    """Hold the password file's write lock: one `passwd` at a time reads, changes and replaces the file.

    The lock is on a sidecar file (`.web-passwords.lock`, mode 0600, kept), since the file itself
    is replaced by a rename on every write. POSIX: flock(2), waited for as long as it takes (a
    holder only reads and writes a small file; the hash is made before). Windows: the first byte
    of the sidecar, locked with msvcrt, which tries for about 10 s and then fails with an OSError.
    """
    fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        if sys.platform == "win32":
            import msvcrt
            msvcrt.locking(fd, msvcrt.LK_LOCK, 1)
            try:
                yield
            finally:
                msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        else:
            import fcntl
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield  # closing the descriptor below lets the lock go
    finally:
        os.close(fd)


def _sync_directory(directory: Path) -> None:
    # The rename is durable only once the directory itself is on disk (POSIX; Windows has no such call).
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_password_file(path: Path, name: str, stored: Hash | None) -> bool:
    """Set (or, with None, remove) `name`'s line in `path`, replacing the file whole, mode 0600.

    Returns whether the old file could be read by other users. Other lines, comments included,
    are kept as they were. The whole read, change and replace runs under the file's write lock,
    so two `passwd` at once both count; the new file is written beside the old one, synced and
    renamed over it. A file that is not UTF-8 text is a PasswordFileError, and is left as it is.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with _only_writer(path):
        try:
            raw = path.read_bytes()
            was_loose = _loose(path.stat().st_mode)
        except FileNotFoundError:
            raw, was_loose = b"", False
        old = _decoded(path, raw).splitlines()
        lines = [line for line in old if line.partition(":")[0] != name or line.startswith("#")]
        if stored is None and len(lines) == len(old):
            raise HermesStateError(f"no user {name!r} in {display_hermes_home(path)}")
        if stored is not None:
            lines.append(f"{name}:{stored}")
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        # Created 0600 from the start (O_EXCL: never through a file someone else put there).
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write("".join(f"{line}\n" for line in lines))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        _sync_directory(path.parent)
    return was_loose


def _read_new_password(name: str) -> str:
    if not sys.stdin.isatty():  # a script: one line on stdin, no prompt
        line = sys.stdin.readline()
        if not line:
            raise HermesStateError("no password on stdin (give it as one line)")
        password = line.rstrip("\r\n")
    else:
        password = getpass.getpass(f"Password for {name}: ")
        if getpass.getpass("Again: ") != password:
            raise HermesStateError("the two passwords differ; nothing was written")
    if len(password) < MIN_PASSWORD_CHARS:
        raise HermesStateError(f"a password needs at least {MIN_PASSWORD_CHARS} characters; nothing was written")
    return password


def cmd_passwd(args: argparse.Namespace) -> int:
    """Set a user's password for `serve` (asked twice on a terminal, else one line on stdin), or --delete the user."""
    name = validate_name(args.user)
    path = Path(args.password_file).expanduser() if args.password_file else default_password_file()
    was_loose = write_password_file(path, name, None if args.delete else hash_password(_read_new_password(name)))
    done = f"Removed {name} from" if args.delete else f"Saved the password of {name} in"
    print(f"{done} {display_hermes_home(path)} (mode 0600); a running serve reads it on its next request",
          flush=True)
    if was_loose:
        print("note: the old file could be read by other users: its hashes may have been copied", file=sys.stderr)
    return 0


class Logins:
    """The users of a password file, read again whenever the file changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stamp: tuple[int, ...] | None = None
        self.users: dict[str, Hash] = {}
        self.current()
        if not self.users:
            raise HermesStateError(f"{display_hermes_home(path)} holds no user: create one with "
                                   "`hermes-state passwd NAME`")

    def current(self) -> dict[str, Hash]:
        """Return the users, reading the file again when its size, time, inode or mode changed."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise _no_file(self.path) from None
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino, st.st_mode)
        if stamp != self.stamp:
            self.users, self.stamp = read_password_file(self.path), stamp
        return self.users


def logins_for(host_is_loopback: bool, password_file: str | None, no_auth: bool) -> Logins | None:
    """Return the logins `serve` must check, or None when it serves without them.

    Off loopback a password is required unless `no_auth`; on loopback only when a file is named.
    A missing or empty file is a one-line HermesStateError saying how to create a user.
    """
    if no_auth or (host_is_loopback and password_file is None):
        return None
    path = Path(password_file).expanduser() if password_file else default_password_file()
    try:
        return Logins(path)
    except HermesStateError as exc:
        raise HermesStateError(f"serving beyond this machine needs a password: {exc} (or pass --no-auth "
                               "to serve without one)") from None


# --- failed logins -------------------------------------------------------------------------------

class FailureLimit:
    """Failed logins per key (an address, a name) in a sliding window, and how long a key must wait.

    Addresses sit in a table of the `max_keys` most recently failing ones: a client with more
    addresses than that already escapes a per-address count by moving on. Names sit in
    `name_buckets` buckets chosen by a keyed hash (a secret drawn at start) and are never evicted:
    no flood of other names or addresses can reset a name's failures, only time takes them back.
    Two names may share a bucket, and then their failures count together (a name can be locked
    out by someone who knows it anyway). Each key keeps only its last `max_failures` times.
    """

    def __init__(self, max_failures: int = MAX_FAILURES, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic, max_keys: int = 4096, name_buckets: int = 4096) -> None:
        self.max_failures, self.window_s, self.clock, self.max_keys = max_failures, window_s, clock, max_keys
        self.name_buckets = name_buckets
        self.failures: collections.OrderedDict[str, collections.deque[float]] = collections.OrderedDict()
        self.names: dict[int, collections.deque[float]] = {}
        self._bucket_key = secrets.token_bytes(16)

    def _slot(self, key: str) -> tuple[dict[Any, collections.deque[float]], Any]:
        # A name's failures live in its bucket; any other key's in the table of addresses.
        if key.startswith("name:"):
            digest = hmac.digest(self._bucket_key, key.encode("utf-8", "surrogatepass"), "sha256")
            return self.names, int.from_bytes(digest[:8], "big") % self.name_buckets
        return self.failures, key

    def _recent(self, key: str, now: float) -> collections.deque[float]:
        table, slot = self._slot(key)
        found = table.get(slot)
        if found is None:
            return collections.deque()
        while found and found[0] <= now - self.window_s:
            found.popleft()
        if not found:
            del table[slot]
        return found

    def wait_s(self, keys: Iterable[str]) -> float:
        """Return the seconds until every key may try again (0 when none has used up its failures)."""
        now = self.clock()
        waits = [recent[-self.max_failures] + self.window_s - now for recent in (self._recent(k, now) for k in keys)
                 if len(recent) >= self.max_failures]
        return max(waits, default=0.0)

    def charge(self, keys: Iterable[str]) -> float:
        """Count a failure for each key now (before the check, so parallel guesses are counted too); return its time."""
        now = self.clock()
        for key in keys:
            table, slot = self._slot(key)
            table.setdefault(slot, collections.deque(maxlen=self.max_failures)).append(now)
            if table is self.failures:
                self.failures.move_to_end(slot)
        while len(self.failures) > self.max_keys:  # a flood of addresses forgets the oldest of them
            self.failures.popitem(last=False)
        return now

    def refund(self, keys: Iterable[str], when: float) -> None:
        """Take back the failure `charge` counted at `when` (the login was right)."""
        for key in keys:
            table, slot = self._slot(key)
            recent = table.get(slot)
            if recent is not None and when in recent:
                recent.remove(when)


def client_key(scope: dict[str, Any]) -> str:
    """Return the rate-limit key of a request's client: its address, or its /64 for IPv6."""
    client = scope.get("client") or ("unknown", 0)
    try:
        address = ipaddress.ip_address(client[0])
    except ValueError:
        return f"address:{client[0]}"
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:  # an IPv4 client of a dual-stack socket
            return f"address:{address.ipv4_mapped}"
        return f"address:{ipaddress.ip_network(f'{address}/64', strict=False)}"  # one host often owns a /64
    return f"address:{address}"


# --- the guard -----------------------------------------------------------------------------------

def basic_credentials(value: bytes) -> tuple[str, str] | None:
    """Return (name, password) from an `Authorization: Basic ...` value, or None when it holds none."""
    scheme, _, encoded = value.strip().partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        name, colon, password = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (name, password) if colon else None


Refusal = tuple[int, list[tuple[bytes, bytes]], str]


class AuthGuard:
    """ASGI middleware: 401 without a valid HTTP basic login, 429 after too many failed ones."""

    def __init__(self, app: Callable[..., Awaitable[Any]], logins: Logins, limit: FailureLimit | None = None):
        self.app, self.logins, self.limit = app, logins, limit or FailureLimit()
        # An unknown name is checked against this, so it costs the same time as a known one.
        self.decoy = hash_password(secrets.token_urlsafe(16))
        self.key = secrets.token_bytes(32)
        self.checked: dict[bytes, str] = {}  # HMAC of an Authorization value already checked -> its user
        self.checked_stamp = logins.stamp
        self.problem = ""  # the last reason the file could not be used, said once on the terminal

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Pass a request on with its user as actor, or answer it with 401, 429 or 503."""
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)  # lifespan events carry no request
        outcome = await self.check(scope)
        if isinstance(outcome, str):
            return await self.app({**scope, ACTOR_SCOPE_KEY: {"id": f"basic:{outcome}"}}, receive, send)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        status, headers, text = outcome
        body = f"{text}\n".encode()
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"), *headers]})
        await send({"type": "http.response.body", "body": body})

    async def check(self, scope: dict[str, Any]) -> str | Refusal:
        """Return the user a request logs in as, or the refusal to answer it with."""
        challenge = [(b"www-authenticate", f'Basic realm="{REALM}", charset="UTF-8"'.encode())]
        value = next((v for k, v in scope.get("headers", []) if k.lower() == b"authorization"), b"")
        credentials = basic_credentials(value)
        if credentials is None:
            return 401, challenge, "Unauthorized: log in with a user made by `hermes-state passwd`"
        try:
            users = self.logins.current()
        except (OSError, HermesStateError) as exc:
            if str(exc) != self.problem:
                self.problem = str(exc)
                print(f"hermes-state serve: every request is refused: {exc}", file=sys.stderr, flush=True)
            # The client learns which file and what is wrong, in a few words; paths and advice stay on the terminal.
            brief = exc.brief if isinstance(exc, PasswordFileError) else f"{self.logins.path.name} cannot be read"
            return 503, [], f"Service Unavailable: the server's password file cannot be used: {brief} (see its terminal)"
        self.problem = ""
        if self.checked_stamp != self.logins.stamp:  # the file changed: a password may have too
            self.checked, self.checked_stamp = {}, self.logins.stamp
        digest = hmac.digest(self.key, value, "sha256")
        if digest in self.checked:
            return self.checked[digest]
        name, password = credentials
        keys = [client_key(scope), f"name:{name}"]
        wait = self.limit.wait_s(keys)
        if wait > 0:
            return 429, [(b"retry-after", str(math.ceil(wait)).encode())], \
                "Too Many Requests: too many failed logins; try again later"
        when = self.limit.charge(keys)
        known = users.get(name)
        # The hash runs on a worker thread: about 0.1 s that would otherwise stop every other request.
        right = await asyncio.to_thread((known or self.decoy).matches, password)
        if not right or known is None:
            # Said on the server's terminal: who tried, from where; never the password.
            client = (scope.get("client") or ("an unknown address",))[0]
            print(f"hermes-state serve: failed login as {name!r} from {client}", file=sys.stderr, flush=True)
            return 401, challenge, "Unauthorized: wrong name or password"
        self.limit.refund(keys, when)
        if len(self.checked) >= 256:
            self.checked.clear()
        self.checked[digest] = name
        return name
