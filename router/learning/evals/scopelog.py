"""Recorded agent outcomes as a router log with one scope per repository, for `router train`.

Do per-repository learned effects predict on real data? ``python -m router.learning.evals.scopelog
OUT`` writes ``OUT/log.db`` — every task × model run of the data directory as the log of a
router that routed it (``deploy.log_records``: the task's first request as the proxy parses it,
one attempt per run, an explicit outcome, the run's cost) with the task's repository in the
``repo`` column, as the proxy logs ``X-Router-Repo`` — and ``OUT/policy.yaml``: the evaluation
policy with one scope per repository (``match: {repo: "owner/*"}``, no overrides). Then

    router train --store sqlite:///OUT/log.db --config OUT/policy.yaml --out OUT/learned.json

prints, per repository, the held-out log loss of the global fit and of the fit with the
repository's own effects, and which it keeps (``router.learning.training.scopes``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import re
from pathlib import Path

import yaml

from router.features.task.context import vector_for
from router.features.tokens import TokenCounter
from router.learning.evals.arrival import arrive, first_request
from router.learning.evals.deploy import Knobs, log_records, policy_for
from router.learning.evals.loader import Dataset, default_data_dir, load
from router.protocols import openai_chat
from router.store.sqlite import SQLiteStore


def scope_name(owner: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "-", owner)[:64]


def policy_yaml(data: Dataset) -> str:
    """The evaluation policy (every model a candidate of ``auto``) with a scope per repository owner."""
    policy = policy_for(data.models, Knobs())
    doc = policy.spec.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    owners = sorted({t.repo.split("/", 1)[0] for t in data.tasks})
    doc["scopes"] = [{"name": scope_name(o), "match": {"repo": f"{o}/*"}} for o in owners]
    return yaml.safe_dump(doc, sort_keys=False)


async def write_log(data: Dataset, path: Path, repo_feature: bool = True) -> int:
    """``repo_feature=False``: task vectors without the repository's hashed feature (the header's),
    as a router that is not told the repository computes them; the ``repo`` column stays."""
    counter = TokenCounter()
    arrivals = {t.id: arrive(t, counter) for t in data.tasks}
    if not repo_feature:
        arrivals = {
            t.id: dataclasses.replace(arrivals[t.id], vector=vector_for(openai_chat.parse(first_request(t))))
            for t in data.tasks
        }
    requests, outcomes = log_records(data, data.task_ids, arrivals)
    store = SQLiteStore(str(path))
    await store.open()
    try:
        # A session is ``task#model``: its repository is the task's, as the proxy logs it.
        await store.write_requests(
            [dataclasses.replace(r, repo=arrivals[(r.task_id or "").split("#")[0]].repo) for r in requests]
        )
        for o in outcomes:
            await store.write_outcome(o)
    finally:
        await store.close()
    return len(requests)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m router.learning.evals.scopelog", description=__doc__.split("\n")[0]
    )
    p.add_argument("out", type=Path, help="directory for log.db and policy.yaml (created)")
    p.add_argument(
        "--data", type=Path, default=None, help="data directory (default: the shipped SWE-bench data)"
    )
    p.add_argument("--no-repo-feature", action="store_true",
                   help="leave the repository's hashed feature out of the task vectors (an ablation)")  # fmt: skip
    args = p.parse_args(argv)
    data = load(args.data or default_data_dir())
    args.out.mkdir(parents=True, exist_ok=True)
    db = args.out / "log.db"
    db.unlink(missing_ok=True)
    n = asyncio.run(write_log(data, db, repo_feature=not args.no_repo_feature))
    (args.out / "policy.yaml").write_text(policy_yaml(data), encoding="utf-8")
    print(f"wrote {db} ({n} attempts of {len(data.tasks)} tasks) and {args.out / 'policy.yaml'}")
    print(
        f"router train --store sqlite:///{db} --config {args.out / 'policy.yaml'} --out {args.out / 'learned.json'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
