"""Mutation testing of the critical decision code, with a score per part: ``python -m tests.mutation``.

mutmut (configured in pyproject.toml, ``[tool.mutmut]``) changes one thing at a time in the code
below — an operator, a constant, a condition — and runs the unit tests that cover it; a mutant no
test notices is a fault the suite would let through. The score is the share of mutants caught
(killed, or made a test hang). Slow (tens of minutes): not part of CI. Every run re-tests all
mutants of the parts it names; which tests cover which function is kept in ``mutants/`` and only
extended for tests new by name (delete ``mutants/`` after changing existing tests or moving
modules: mutmut also keeps its old copy of unmutated files). ``--smoke`` runs five mutants of the
retry budget, to check the set-up itself in a few minutes.

    python -m tests.mutation                 # every critical part
    python -m tests.mutation planner budgets # some of them
    mutmut show <mutant name>                # what a surviving mutant changed
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections import Counter
from fnmatch import fnmatch
from pathlib import Path

#: Each part, as mutmut names its mutants (module, then ``xǁClassǁmethod`` or ``x_function``).
CRITICAL: dict[str, list[str]] = {
    "planner": ["router.policy.plan.*"],
    "learned scorer": [
        "router.policy.learned.*",
        "router.policy.artifact.*",
        "router.policy.objective.*",
        "router.policy.prior.*",
    ],
    "retry loop": ["router.forward.execute.*"],
    "admission": ["router.http.admission.*"],
    "signals": ["router.features.signals.*"],
    "budgets": [
        "router.shared.memory.xǁMemoryBudgetsǁ*",
        "router.shared.memory.xǁ_Scopeǁ*",
        "router.shared.memory.x_unique_scopes*",
    ],
}
SMOKE = ["router.forward.execute.xǁRetryBudgetǁspend__mutmut_[1-5]"]
CAUGHT = ("killed", "timeout")
ROOT = Path(__file__).resolve().parents[1]


def mutmut(*args: str, capture: bool = False) -> str:
    exe = Path(sys.executable).with_name("mutmut")
    done = subprocess.run([str(exe), *args], cwd=ROOT, text=True, capture_output=capture, env=os.environ)
    if done.returncode != 0:
        raise SystemExit(f"mutmut {args[0]} failed (exit {done.returncode}); see its output above")
    return done.stdout if capture else ""


def statuses() -> dict[str, str]:
    out = mutmut("results", "--all", "true", capture=True)
    result = {}
    for line in out.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep:
            result[name] = status
    return result


def score(parts: dict[str, list[str]], found: dict[str, str]) -> list[tuple[str, int, int, int]]:
    """Per part: (name, caught, survived or not covered, not checked yet)."""
    rows = []
    for part, globs in parts.items():
        counts = Counter(s for n, s in found.items() if any(fnmatch(n, g) for g in globs))
        caught = sum(counts[s] for s in CAUGHT)
        pending = counts["not checked"]
        rows.append((part, caught, sum(counts.values()) - caught - pending, pending))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="*", help=f"parts to test (default all): {', '.join(CRITICAL)}")
    ap.add_argument("--smoke", action="store_true", help="a few mutants only, to check the set-up")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--score-only", action="store_true", help="print the score of the last run")
    args = ap.parse_args(argv)
    unknown = set(args.parts) - set(CRITICAL)
    if unknown:
        ap.error(f"unknown part(s) {', '.join(sorted(unknown))}; known: {', '.join(CRITICAL)}")
    parts = {p: CRITICAL[p] for p in args.parts} if args.parts else CRITICAL
    globs = SMOKE if args.smoke else [g for gs in parts.values() for g in gs]
    if not args.score_only:
        mutmut("run", "--max-children", str(args.jobs), *globs)
    if args.smoke:
        found = {n: s for n, s in statuses().items() if any(fnmatch(n, g) for g in SMOKE)}
        escaped = sorted(n for n, s in found.items() if s not in CAUGHT)
        print(f"smoke: {len(found) - len(escaped)} of {len(found)} mutants caught", *escaped, sep="\n  ")
        return 1 if escaped or not found else 0
    rows = score(parts, statuses())
    print(f"{'part':<16}{'mutants':>9}{'caught':>8}{'missed':>8}{'score':>8}")
    for part, caught, missed, pending in rows:
        total = caught + missed
        note = f"  ({pending} not run yet)" if pending else ""
        print(f"{part:<16}{total:>9}{caught:>8}{missed:>8}{caught / max(total, 1):>8.1%}{note}")
    caught = sum(r[1] for r in rows)
    total = caught + sum(r[2] for r in rows)
    print(f"{'all':<16}{total:>9}{caught:>8}{total - caught:>8}{caught / max(total, 1):>8.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
