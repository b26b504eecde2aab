"""``python -m benchmarks.guard``: how often the guard rolls back, and how soon, by simulation.

Each run draws task outcomes for a control and a treated arm (Bernoulli, independent tasks),
calls ``router.rollout.guard.judge`` every ``--look`` tasks per arm, as the router does every
``check_every_s``, up to ``--max-tasks``, and records whether and when it rolled back. Printed per
true drop in success rate: the share of runs rolled back and the median tasks per arm it took.
A drop at or under ``max_success_drop`` should roll back in at most ``alpha`` of the runs.
"""

from __future__ import annotations

import argparse
import random
import statistics

from router.policy.config import GuardSpec
from router.rollout.arms import ArmTasks
from router.rollout.guard import judge


def run(
    p_control: float, drop: float, spec: GuardSpec, look: int, max_tasks: int, rng: random.Random
) -> int | None:
    c = ArmTasks()
    t = ArmTasks()
    for n in range(1, max_tasks + 1):
        for arm, p in ((c, p_control), (t, p_control - drop)):
            arm.tasks += 1
            arm.success.append(1.0 if rng.random() < p else 0.0)
            arm.cost.append(1.0)
        if n % look == 0 and judge(c, t, spec).worse:
            return n
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--base", type=float, default=0.70, help="control arm's success rate")
    ap.add_argument("--drops", default="0,0.03,0.05,0.10", help="true drops of the treated arm")
    ap.add_argument("--look", type=int, default=100, help="tasks per arm between two looks")
    ap.add_argument("--max-tasks", type=int, default=3000, help="tasks per arm per run")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    spec = GuardSpec()  # the defaults: max_success_drop 0.03, min_tasks 200, alpha 0.05
    rng = random.Random(args.seed)
    print(f"guard {spec.model_dump()}; control success {args.base}; a look every {args.look} tasks per arm, "
          f"up to {args.max_tasks}; {args.runs} runs each")  # fmt: skip
    print(f"{'true drop':>10} {'rolled back':>12} {'median tasks/arm':>17}")
    for drop in (float(x) for x in args.drops.split(",")):
        when = [run(args.base, drop, spec, args.look, args.max_tasks, rng) for _ in range(args.runs)]
        hits = [n for n in when if n is not None]
        median = f"{statistics.median(hits):.0f}" if hits else "-"
        print(f"{drop:>10.2f} {len(hits) / args.runs:>12.1%} {median:>17}")


if __name__ == "__main__":
    main()
