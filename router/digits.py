"""Whole numbers written by someone else: a header, a query string, a cookie, a JSON key.

``str.isdigit`` says yes to '³' and '٣', which ``int`` refuses, and ``int`` refuses more than
4,300 digits: each of those was a 500 with a traceback somewhere. Every such number is read here.
"""

from __future__ import annotations


def whole_number(text: str | None, most: int) -> int | None:
    """``text`` as an int clamped to ``most`` when it is ASCII digits alone, else None."""
    if not text or not text.isascii() or not text.isdigit():
        return None
    digits = text.lstrip("0")
    return most if len(digits) > len(str(most)) else min(int(digits or "0"), most)
