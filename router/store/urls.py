"""Store URLs in messages and logs: never with their password."""

from __future__ import annotations

import re
from urllib.parse import unquote

# Greedy up to the last "@": an unescaped "@" in a password must not leave its tail visible.
_URL_PASSWORD = re.compile(r"(://[^:@/?#\s]*):(.*)@")
_PARAM_PASSWORD = re.compile(r"(?i)(password\s*=\s*)([^&\s]*)")


def mask_url(url: str) -> str:
    """The URL with any password replaced by ``***``, fit for messages and logs."""
    return _PARAM_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1:***@", url))


def redact(text: str, url: str) -> str:
    """``text`` (say, a driver's error message) with the URL's password removed wherever it appears."""
    secrets = [m.group(2) for pattern in (_URL_PASSWORD, _PARAM_PASSWORD) for m in pattern.finditer(url)]
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***").replace(unquote(secret), "***")
    return mask_url(text)
