"""`router promote`: pin a trained artifact in the policy file, archive the revisions before and
after (so `router rollback` can undo it), and tell every replica to reload now."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import time
from pathlib import Path

from router.errors import ConfigError
from router.policy.active import ActivePolicy, load_active_policy
from router.policy.artifact import Artifact
from router.policy.learned import LearnedScorer
from router.policy.loading import load_policy
from router.policy.revisions import Archive
from router.shared import StateConfig, open_state

_LEARNED_BLOCK = re.compile(r"^learned:\n(?:[ \t]+.*\n?)*", re.MULTILINE)


def promote(
    artifact: str, config: str, redis_url: str | None = None, redis_prefix: str = "router:", *,
    force: bool = False,
) -> str:  # fmt: skip
    """Pin ``artifact`` in the policy file (path and sha256); running routers pick it up.
    Refused when the artifact was trained for other models than the policy's (``force``: pinned
    anyway: the router then warns, and scores the models it lacks as an even chance), or when it
    learned no routing and the policy's artifact did (``force``: pinned, the cheapest routes)."""
    art = Path(artifact).resolve()
    try:
        raw = art.read_bytes()
    except FileNotFoundError:
        # Promoting before training (README step 8 before step 6): say what makes one.
        raise ConfigError(f"artifact {artifact}: no such file; `router train --config {config} --out "
                          f"{artifact}` writes it from the log") from None  # fmt: skip
    except OSError as exc:
        raise ConfigError(f"artifact {artifact}: {exc.strerror}") from None
    learned = Artifact.from_json(raw, source=str(art), expected_sha256=None)  # refuse a broken artifact now
    sha = hashlib.sha256(raw).hexdigest()
    cfg = Path(config)
    try:
        text = cfg.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{config}: cannot read policy file: {exc.strerror}") from None
    # Relative to the policy file, as the loader reads it: the pair survives a move or a clone.
    rel = Path(os.path.relpath(art, cfg.resolve().parent))
    block = f"learned:\n  artifact: {rel}\n  sha256: {sha}\n"
    new = (
        _LEARNED_BLOCK.sub(block, text, count=1)
        if _LEARNED_BLOCK.search(text)
        else text.rstrip("\n") + "\n\n" + block
    )
    # Archived as a router applying it would (the file's revision before, if no router did), so
    # `router rollback` can undo a promotion whether or not a router was serving the file.
    archive = Archive(cfg)
    try:
        before: ActivePolicy | None = load_active_policy(cfg)
    except ConfigError:
        before = None  # a file no router would load: nothing worth going back to
    if before is not None and not force:
        sized = list(learned.estimates.learned)
        if learned.models:
            _same_models(artifact, config, list(learned.models), list(before.policy.models))
        elif sized and not set(sized) & set(before.policy.models):
            # Sizes only, all of other models: pinned, nothing of it would apply.
            raise ConfigError(
                f"{artifact} does not match the models of {config}: models the policy does not have: "
                f"{', '.join(sized)} (the sizes of a call it learned) — train on a log of this policy's models "
                "(router train --config it), or pass --force to pin it anyway"
            )
        elif isinstance(before.decider.scorer, LearnedScorer):
            # Training on a log with too few labels writes sizes only: pinned over a learned
            # routing it would silently put the policy back to the cheapest.
            raise ConfigError(
                f"{artifact} has no learned routing (trained on too few labelled attempts), and {config} routes by "
                f"the artifact it pins now: promoting it would route by the cheapest again; pass --force to pin it anyway"
            )
    # Validate before writing: a promotion never leaves a policy file the router would refuse.
    tmp = cfg.with_suffix(cfg.suffix + ".promote")
    tmp.write_text(new, encoding="utf-8")
    try:
        policy = load_policy(tmp)
        if policy.learned_path is None:
            raise ConfigError(f"{config}: the learned block did not parse")
        # An atomic swap: a watching router reads the old file or the new one, never half of one.
        written_at = cfg.stat().st_mtime
        os.replace(tmp, cfg)
    finally:
        tmp.unlink(missing_ok=True)
    if before is not None and before.files is not None and archive.meta(before.revision or "") is None:
        archive.keep(before.files, before.policy.name, written_at)
    after = load_active_policy(cfg)
    if after.files is not None:
        archive.keep(after.files, after.policy.name, time.time())
    if redis_url:
        asyncio.run(publish(redis_url, redis_prefix, hashlib.sha256(new.encode()).hexdigest()))
    return sha


async def publish(redis_url: str, prefix: str, version: str) -> None:
    """Tell every replica to reload now (each also polls its files, for when Redis is away)."""
    state = open_state(redis_url, StateConfig(prefix=prefix))
    try:
        await state.policy.publish_version(version)
    finally:
        await state.aclose()


def _same_models(artifact: str, config: str, learned: list[str], catalog: list[str]) -> None:
    """Refuse, in one line, an artifact trained for other models than the policy routes to."""
    unseen = [m for m in catalog if m not in learned]
    foreign = [m for m in learned if m not in catalog]
    if not unseen and not foreign:
        return
    parts = [f"no attempt of {', '.join(unseen)} (scored as an even chance)"] if unseen else []
    parts += [f"models the policy does not have: {', '.join(foreign)}"] if foreign else []
    raise ConfigError(
        f"{artifact} does not match the models of {config}: {'; '.join(parts)} — train on a log of this "
        "policy's models (router train --config it), or pass --force to pin it anyway"
    )
