"""Who may see and change the queue through walqueue-web, as pure checks.

The rules (docs/web.md, "Security"):

* The dashboard listens on a loopback address unless it is given both a
  certificate (TLS) and a password file; `check_listen` says which is
  missing. With a password file, every request needs HTTP Basic credentials
  of one of its `name:password` lines (compared in constant time); the name
  is who the write log names. Without one, who is the peer's address.
* Only POSTs write, and only with `--allow-writes`. A POST carries a CSRF
  token, `csrf_token(secret, who)`: an HMAC-SHA256 of who under a secret
  drawn when the process starts, so a page from another origin (which
  cannot read ours) cannot forge one, and a token dies with the process.
  A POST whose Origin header names another origin is refused as well.
* On loopback the Host header must name the address served (or
  localhost), so a hostile page cannot reach a loopback dashboard through
  DNS rebinding. Beyond loopback any Host is served (the machine has names
  of its own), and the passwords keep others out.
* Every page is sent with SECURITY_HEADERS: a Content-Security-Policy that
  allows only our own script and style files (no inline script, no
  eval), no framing, no referrer to other sites, no MIME sniffing.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass

CSRF_FIELD = "csrf"
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                           "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
                           "base-uri 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # so a form's POST carries its Origin (not "null")
    "Cache-Control": "no-store",
}
REALM = "walqueue-web"
MAX_PASSWORD_LINES = 1000


class SecurityError(ValueError):
    """A listening address, certificate or password file that cannot be used; the message says why."""


def new_secret() -> bytes:
    """The per-process key of the CSRF tokens."""
    return secrets.token_bytes(32)


def csrf_token(secret: bytes, who: str) -> str:
    return hmac.new(secret, b"csrf\0" + who.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


def csrf_valid(secret: bytes, who: str, token: str | None) -> bool:
    return token is not None and hmac.compare_digest(csrf_token(secret, who), token)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listen(host: str, *, certificate: str | None, password_file: str | None) -> None:
    """Raise SecurityError if `host` is not loopback and the certificate or the password file is
    missing (beyond this machine, the queue's data would cross the network in the clear, or to
    anyone)."""
    if is_loopback(host):
        return
    missing = [option for option, value in (("--certificate", certificate),
                                            ("--password-file", password_file)) if value is None]
    if missing:
        raise SecurityError(f"{host} is not a loopback address: serving the dashboard beyond this "
                            f"machine needs TLS and passwords, so give {' and '.join(missing)} too")


def read_passwords(path: str) -> dict[str, str]:
    """name -> password from a file of `name:password` lines (blank lines and # comments skipped).

    Raises SecurityError if the file is readable or writable by others than its owner, has no
    entry, or has a line that is not `name:password`.
    """
    try:
        info = os.stat(path)
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SecurityError(f"cannot read the password file {path}: {exc}") from None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecurityError(f"the password file {path} is open to its group or others "
                            f"(mode {stat.S_IMODE(info.st_mode):o}); chmod 600 {path}")
    passwords: dict[str, str] = {}
    for number, line in enumerate(lines[:MAX_PASSWORD_LINES + 1], start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, separator, password = line.partition(":")
        if not separator or not name or not password:
            raise SecurityError(f"{path}, line {number}: not name:password")
        passwords[name] = password
    if not passwords:
        raise SecurityError(f"the password file {path} has no name:password line")
    if len(lines) > MAX_PASSWORD_LINES:
        raise SecurityError(f"the password file {path} has more than {MAX_PASSWORD_LINES} lines")
    return passwords


def basic_user(authorization: str | None, passwords: Mapping[str, str]) -> str | None:
    """The name of HTTP Basic `authorization` if its password is that name's, else None."""
    if not authorization or not authorization.startswith("Basic "):
        return None
    try:
        decoded = base64.b64decode(authorization[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    name, _, password = decoded.partition(":")
    expected = passwords.get(name)
    # Compared even for an unknown name, so the time taken does not say which names exist.
    matches = hmac.compare_digest((expected or "\0" + password).encode(), password.encode())
    return name if expected is not None and matches else None


@dataclass(frozen=True)
class Origin:
    """What the dashboard is reached as: the scheme, host and port of the Host header it accepts."""

    scheme: str
    host: str
    port: int

    def hosts(self) -> frozenset[str]:
        """The Host header values accepted."""
        names = {self.host}
        if is_loopback(self.host):
            names |= {"localhost", "127.0.0.1", "[::1]", "::1"}
        if ":" in self.host and not self.host.startswith("["):
            names.add(f"[{self.host}]")
        return frozenset(f"{name}:{self.port}" for name in names) | frozenset(names)

    def host_allowed(self, host_header: str | None) -> bool:
        """On loopback, only our own names (DNS rebinding); beyond it, any: the operators reach
        it by the machine's names, and the passwords guard it there."""
        if not is_loopback(self.host):
            return True
        return host_header is not None and host_header.lower() in self.hosts()

    def origin_allowed(self, origin_header: str | None, host_header: str | None) -> bool:
        """A POST's Origin: absent (an older browser, a script), or the page's own."""
        if origin_header is None:
            return True
        return host_header is not None and origin_header.lower() == f"{self.scheme}://{host_header.lower()}"
