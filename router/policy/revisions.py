"""Policy revisions: what is applied, what was before it, what was refused.

A revision is a short content hash of the policy file's bytes (which pin the learned artifact by
its SHA-256, so the artifact is part of it) and of the control arm's policy file, if any. Every
revision that a router applies is archived next to the policy file, in
``.revisions/<policy stem>/<revision>/`` (the YAML, the artifact, the control policy, and a
``meta.json``), so that ``router rollback`` and the guard can put an earlier one back
(``router.rollout.rollback``). Replicas
sharing the policy file share the archive, and so the history.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from router.errors import ConfigError

log = logging.getLogger("router.policy")

#: How many earlier revisions ``GET /v1/policy`` lists.
PREVIOUS_SHOWN = 10


def revision_of(parts: Sequence[bytes]) -> str:
    """12 hex digits of SHA-256 over the files that make a policy (policy file first)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "big"))  # framed: no two splits of the same bytes collide
        h.update(p)
    return h.hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class PolicyFiles:
    """The bytes a revision is made of, and where each file lives (absolute paths)."""

    policy_path: Path
    policy: bytes
    artifact_path: Path | None = None
    artifact: bytes | None = None
    control_path: Path | None = None
    control: bytes | None = None

    @property
    def revision(self) -> str:
        return revision_of([self.policy, self.control or b""])


@dataclass(frozen=True, slots=True)
class Rejected:
    at: float
    error: str

    def as_dict(self) -> dict[str, Any]:
        return {"at": self.at, "error": self.error}


def _atomic_write(path: Path, data: bytes) -> None:
    # A watching router reads the old file or the new one, never half of one. The temporary file
    # is the writer's own: named by the process id, replicas in one process (or each its container's
    # pid 1 on a shared volume) wrote one, and a revision's meta could be cut or lost.
    path.parent.mkdir(parents=True, exist_ok=True)
    # (Not mkstemp: its 0600 would be the policy file's mode after a rollback.)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


#: What a revision looks like (``revision_of``): nothing else names a folder of the archive.
REVISION_NAME = re.compile(r"[0-9a-f]{12}")


class Archive:
    """Revisions kept on disk: ``<dir>/<revision>/{policy.yaml, artifact, control.yaml, meta.json}``."""

    def __init__(self, policy_path: Path, directory: Path | None = None) -> None:
        self.policy_path = policy_path.resolve()
        self.dir = directory or self.policy_path.parent / ".revisions" / self.policy_path.stem

    def _meta_path(self, revision: str) -> Path:
        return self.dir / revision / "meta.json"

    def meta(self, revision: str) -> dict[str, Any] | None:
        try:
            data = orjson.loads(self._meta_path(revision).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        return data if isinstance(data, dict) else None

    def _write_meta(self, revision: str, meta: dict[str, Any]) -> None:
        _atomic_write(self._meta_path(revision), orjson.dumps(meta, option=orjson.OPT_INDENT_2))

    def keep(self, files: PolicyFiles, name: str, applied_at: float) -> None:
        """Archive the files of a revision now applied (once), and note when it was applied."""
        rev = files.revision
        where = self.dir / rev
        meta = self.meta(rev)
        latest = self.history()[:1]
        try:
            if meta is None:
                _atomic_write(where / "policy.yaml", files.policy)
                if files.artifact is not None:
                    _atomic_write(where / "artifact", files.artifact)
                if files.control is not None:
                    _atomic_write(where / "control.yaml", files.control)
                meta = {
                    "revision": rev,
                    "name": name,
                    "artifact": str(files.artifact_path) if files.artifact_path else None,
                    "control": str(files.control_path) if files.control_path else None,
                }
            if (
                meta.get("since") is None
                or meta.get("rolled_back")
                or (latest and latest[0]["revision"] != rev)
            ):
                # Applied anew (first time, again after a rollback, or put back by hand after
                # another revision): its guard starts counting. Another replica applying the
                # revision in force (or this one restarting) is not a new start.
                meta["since"] = applied_at
            meta.update(applied_at=applied_at, rolled_back=None)
            self._write_meta(rev, meta)
        except OSError as exc:
            log.warning(
                "policy revision %s not archived (a rollback to it will not be possible): %s", rev, exc
            )

    def archived(self, revision: str, name: str = "policy.yaml") -> bytes | None:
        """A file an archived revision kept (``policy.yaml``, ``artifact``, ``control.yaml``), or
        None; ``revision`` may come from a request, so it must look like one."""
        if not REVISION_NAME.fullmatch(revision):
            return None
        try:
            return (self.dir / revision / name).read_bytes()
        except OSError:
            return None

    def mark_applied(self, revision: str, at: float) -> None:
        meta = self.meta(revision)
        if meta is not None:
            meta.update(applied_at=at, since=at, rolled_back=None)
            self._write_meta(revision, meta)

    def since(self, revision: str) -> float | None:
        """When the revision last became the one in force (by any router sharing the archive)."""
        meta = self.meta(revision)
        return float(meta["since"]) if meta and meta.get("since") is not None else None

    def mark_rolled_back(self, revision: str, at: float, reason: str, to: str | None = None) -> None:
        meta = self.meta(revision)
        if meta is not None:
            meta["rolled_back"] = {"at": at, "reason": reason, "to": to}
            self._write_meta(revision, meta)

    def last_rollback(self) -> dict[str, Any] | None:
        """The latest rollback any router sharing this archive made: {at, from, to, reason}."""
        marks = [{"from": m["revision"], **m["rolled_back"]} for m in self.history() if m.get("rolled_back")]
        return max(marks, key=lambda m: float(m.get("at") or 0), default=None)

    def history(self) -> list[dict[str, Any]]:
        """Every archived revision's meta, most recently applied first."""
        if not self.dir.is_dir():
            return []
        metas = [m for d in self.dir.iterdir() if d.is_dir() and (m := self.meta(d.name)) is not None]
        return sorted(metas, key=lambda m: -float(m.get("applied_at") or 0))

    def previous(self, current: str, *, skip_rolled_back: bool = False) -> list[dict[str, Any]]:
        return [
            m for m in self.history()
            if m["revision"] != current and not (skip_rolled_back and m.get("rolled_back"))
        ]  # fmt: skip

    def resolve(self, given: str) -> str:
        """The archived revision ``given`` names: itself, or the one revision whose id starts with it
        (at least 4 characters, as git takes a commit's); typing all 12 was the only way."""
        if self.meta(given) is not None:
            return given
        ids = [str(m["revision"]) for m in self.history()]
        found = [r for r in ids if len(given) >= 4 and r.startswith(given)]
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise ConfigError(f"{self.policy_path}: revision {given!r} is ambiguous: {', '.join(found)}")
        raise ConfigError(
            f"{self.policy_path}: no archived policy revision {given!r} (known: {', '.join(ids) or 'none'})"
        )

    def restore(self, revision: str) -> None:
        """Put an archived revision's files back where they were; the policy file goes last, so a
        watching router never sees a policy that pins an artifact not yet written."""
        meta = self.meta(revision)
        where = self.dir / revision
        if meta is None or not (where / "policy.yaml").is_file():
            known = ", ".join(m["revision"] for m in self.history()) or "none"
            raise ConfigError(
                f"{self.policy_path}: no archived policy revision {revision!r} (known: {known})"
            )
        for key, name in (("artifact", "artifact"), ("control", "control.yaml")):
            target = meta.get(key)
            if target and (where / name).is_file():
                data = (where / name).read_bytes()
                if not Path(target).is_file() or Path(target).read_bytes() != data:
                    _atomic_write(Path(target), data)
        _atomic_write(self.policy_path, (where / "policy.yaml").read_bytes())
