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
            # A driver reads an unescaped "@" as the password's end and quotes the rest as the
            # host: "failed to resolve host 'RETPW99@127.0.0.1'" for the password SEC@RETPW99.
            for piece in secret.split("@")[1:]:
                if len(piece) >= _PIECE:
                    text = text.replace(piece, "***")
    return mask_url(text)


#: The shortest piece of a password around an "@" taken out of a message: a shorter one is as
#: likely to be any other word's letters, and tells little of the password.
_PIECE = 4
