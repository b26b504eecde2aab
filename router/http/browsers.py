"""What a browser may reach of an open router (no key needed): its own pages, never another site's.

A key is what keeps a web page out of a closed router. An open one is for a laptop, and its user's
browser is the way in, twice over:

* **another site's page** makes the browser call the router: a ``text/plain`` POST needs no CORS
  preflight and was served on the operator's provider keys. The browser names the page's site in
  ``Origin``, so a page that is not this machine's (nor the router's own) is refused;
* **DNS rebinding**: a site that rebinds its name to 127.0.0.1 calls the router *same-origin*, so
  it reads the replies too, and its GETs carry no ``Origin`` at all (the dashboard, the task
  ledger, the policy were its to read). What it cannot change is the ``Host`` its browser sends,
  its own name; so only ``localhost``, an IP address (rebinding needs a name; another site's page
  calling the router by its address sends its ``Origin``, refused as above), or a host the operator names (``ROUTER_ALLOWED_HOSTS``:
  a LAN name, ``*.lan``), is answered.

Agents, SDKs and scripts call the address they were given and send no ``Origin``: they are served
as before.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import orjson

#: Characters a ``Host`` header never holds (a URL's other parts, credentials, a path).
_NOT_IN_A_HOST = frozenset("/?#@\\ \t")
#: A ``Host`` quoted back longer than this is cut: it is the client's text.
_QUOTED = 100
#: Characters no allowed host's name or pattern holds: JSON's, a URL's other parts, blanks.
_NOT_IN_A_PATTERN = _NOT_IN_A_HOST | frozenset("\"'{},")


def _hostname(netloc: str) -> str | None:
    """The lower-cased name or address of ``host[:port]`` (brackets off an IPv6 literal, a trailing
    dot off a name), or None for something that is not one."""
    if not netloc or any(c in _NOT_IN_A_HOST for c in netloc):
        return None
    try:
        name = urlsplit(f"//{netloc}").hostname
    except ValueError:  # an unclosed bracket
        return None
    return name.rstrip(".") if name else None


def _loopback(name: str) -> bool:
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _address(name: str) -> bool:
    """An IP address, not a name: no site can rebind it (the router reached by its LAN address, a
    container's published port by IP); another site's page calling it sends its ``Origin``."""
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def allowed_hosts(given: str | Iterable[str]) -> tuple[str, ...]:
    """The operator's list, from ``a.lan, *.corp.example``, a JSON list (``["a.lan", "*.lan"]``,
    how pydantic-settings reads a list from the environment) or a list: lower-cased, blanks
    dropped. Read comma by comma, a JSON list allowed '["a.lan"' and so nothing; an entry that
    cannot be a host's name or pattern is a ``ValueError`` naming it."""
    names: Iterable[object] = given.split(",") if isinstance(given, str) else given
    if isinstance(given, str) and given.lstrip().startswith("["):
        try:
            names = orjson.loads(given)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"not a JSON list of host names ({exc})") from None
    if isinstance(names, str | bytes | Mapping) or not isinstance(names, Iterable):
        raise ValueError('host names are needed, comma-separated or as a JSON list: ["devbox.lan", "*.lan"]')
    hosts = []
    for name in names:
        if not isinstance(name, str) or any(c in _NOT_IN_A_PATTERN for c in name.strip()):
            raise ValueError(f"{str(name)[:_QUOTED]!r} is not a host name, '*.' and a name, nor '*'")
        if name.strip():
            hosts.append(name.strip().lower().rstrip("."))
    return tuple(hosts)


@dataclass(frozen=True, slots=True)
class Browsers:
    """``allowed``: the hosts answered besides this machine's: names, ``*.suffix`` for a name's
    subdomains, ``*`` for any host (behind a proxy that checks it)."""

    allowed: tuple[str, ...] = ()

    def host_allowed(self, host: str) -> bool:
        name = _hostname(host)
        if name is None:
            return False
        return (
            _loopback(name)
            or _address(name)
            or any(
                pattern == "*" or name == pattern or (pattern.startswith("*.") and name.endswith(pattern[1:]))
                for pattern in self.allowed
            )
        )

    def refusal(self, headers: Mapping[str, str]) -> str | None:
        """Why an open router refuses this request, or None to serve it."""
        host = headers.get("host")
        # No Host at all is HTTP/1.0 from a script: a browser always sends one.
        if host is not None and not self.host_allowed(host):
            shown = host if len(host) <= _QUOTED else host[:_QUOTED] + "…"
            return (
                f"host {shown!r} is refused in open mode: a web site that points its name at this "
                "machine could read and spend through this router. Call it as localhost or by its address, "
                "name the host in ROUTER_ALLOWED_HOSTS (--allowed-hosts), or set ROUTER_MASTER_KEY"
            )
        origin = headers.get("origin")
        if origin is None or self._own_page(origin, host):
            return None
        return (
            "a request from a web page is refused in open mode: any site its browser visits could spend "
            "through this router; set ROUTER_MASTER_KEY (or create a virtual key) to serve browsers' callers"
        )

    @staticmethod
    def _own_page(origin: str, host: str | None) -> bool:
        """A page of this machine (a loopback name or address, any port), or of the router's own
        origin (its host:port the request's ``Host``, which is allowed by now): the dashboard reached
        by a LAN name posts its forms with that name."""
        try:
            parts = urlsplit(origin)
        except ValueError:
            return False
        name = _hostname(parts.netloc)
        if name is None:  # "null" (a sandboxed frame, a file), or no URL at all
            return False
        return _loopback(name) or (host is not None and parts.netloc.lower() == host.lower())
