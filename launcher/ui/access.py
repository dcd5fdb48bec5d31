"""Who may use the ``ui``: only whoever holds the secret it made at start, from a page it served itself.

- The secret comes in the printed URL (``?token=``) once, and is exchanged for a cookie the browser sends back only
  to this server and only from its own pages (HttpOnly, SameSite=Strict); every other request gets 403.
- The Host header must name the address it listens on, or localhost: a page of another site whose name was made to
  resolve to 127.0.0.1 (DNS rebinding) sends its own name, and is refused.
- No CORS header is ever sent, so another site's script cannot read an answer; and what changes a run (a POST)
  also needs the secret in a header, which a cross-site form cannot set.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from dataclasses import dataclass, field

COOKIE_PREFIX = "launcher_ui_"  # and the port: browsers send a host's cookies to all its ports, so each server
# has its own name, and two servers do not overwrite each other's
HEADER = "X-Launcher-Token"
TOKEN_PARAMETER = "token"
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("0.0.0.0", "::", "")


def new_secret() -> str:
    return secrets.token_urlsafe(32)


@dataclass
class Access:
    """The rules for a server listening on ``host``:``port`` (the port once bound) with ``secret``."""
    host: str
    port: int = 0
    secret: str = field(default_factory=new_secret)

    @property
    def cookie(self) -> str:
        return f"{COOKIE_PREFIX}{self.port}"

    def holds_secret(self, offered: str | None) -> bool:
        return offered is not None and hmac.compare_digest(offered.encode(), self.secret.encode())

    def host_allowed(self, header: str | None) -> bool:
        """Whether a Host header names this server: its own address or localhost, with its port; listening on every
        address, any address literal (a rebinding needs a name to point elsewhere)."""
        if not header:
            return False
        name, _, port = header.rpartition(":") if not header.endswith("]") else (header, "", "")
        if port != str(self.port):
            return False
        name = name.removeprefix("[").removesuffix("]").lower()
        if name in LOCAL_NAMES or name == self.host.lower().strip("[]"):
            return True
        return self.host in WILDCARDS and _is_address(name)

    def url(self) -> str:
        """The address to open, with the secret: what ``launcher ui`` prints."""
        shown = "127.0.0.1" if self.host in WILDCARDS else (f"[{self.host}]" if ":" in self.host else self.host)
        return f"http://{shown}:{self.port}/?{TOKEN_PARAMETER}={self.secret}"


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
