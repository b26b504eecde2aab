"""Unique ids for requests and decisions, cheaply.

A random 64-bit prefix per process and a counter: unique across replicas (the prefix) and within
one (the counter), without a system call per id — uuid4 reads the OS's random source each time,
which showed up in profiles of the request path.
"""

from __future__ import annotations

import itertools
import secrets


class IdMaker:
    def __init__(self) -> None:
        self._prefix = secrets.token_hex(8)
        self._counter = itertools.count(1)

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._counter):016x}"
