"""Going back to an earlier policy revision (`router rollback`, and the guard's own)."""

from __future__ import annotations

import fcntl

from router.errors import ConfigError
from router.policy.revisions import Archive


def rollback(
    archive: Archive, to: str | None, reason: str, at: float, expect: str | None = None
) -> tuple[str, str] | None:
    """Put back revision ``to`` (default: the latest applied before the one in force that was not
    itself rolled back); the one in force is marked rolled back. Returns (from, to).

    The revision in force is the one most recently applied by any router sharing the archive:
    a policy file that was refused never became one. With ``expect``, nothing happens (None)
    unless ``expect`` is still in force: of several replicas judging the same revision, one
    rolls it back, and the others do not roll back what it put back."""
    if not archive.policy_path.is_file():
        raise ConfigError(f"{archive.policy_path}: cannot read policy file: No such file or directory")
    if not archive.history():  # said before the lock's directory is made: a typo leaves nothing
        raise ConfigError(
            f"{archive.policy_path}: no policy revision has been applied yet (archive {archive.dir})"
        )
    archive.dir.mkdir(parents=True, exist_ok=True)
    with open(archive.dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        history = archive.history()
        if not history:
            raise ConfigError(
                f"{archive.policy_path}: no policy revision has been applied yet (archive {archive.dir})"
            )
        current = str(history[0]["revision"])
        if expect is not None and current != expect:
            return None
        if to is None:
            earlier = archive.previous(current, skip_rolled_back=True)
            if not earlier:
                raise ConfigError(f"{archive.policy_path}: no earlier revision to roll back to")
            to = str(earlier[0]["revision"])
        if to == current:
            raise ConfigError(f"{archive.policy_path}: revision {to} is already in force")
        archive.restore(to)
        archive.mark_rolled_back(current, at, reason, to)
        archive.mark_applied(to, at)
        return current, to
