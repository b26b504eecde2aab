"""Phase timing of one request: queue, retry, time to first token, decode, gaps, delivery.

Clock readings are ``time.perf_counter()`` seconds; summaries are milliseconds. A phase that
cannot be observed (TTFT and decode of a non-streamed reply) or did not happen (retry, when the
first try served) is ``None``, never a guess.

The phases are contiguous, so they add up: queue (arrival → the first try's upstream call:
reading, routing, waiting for a concurrency slot), retry (the first try's call → the last try's
call: tries that failed, the back-off after them and any slot wait before the next try), then the
last try's TTFT and decode, and delivery (last upstream byte → the response's end).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter


@dataclass(slots=True)
class Phases:
    arrival: float = field(default_factory=perf_counter)
    #: When the policy's decision was made: arrival → decided is intake and routing.
    decided: float | None = None
    #: The first try's upstream call: queue ends and, if that try fails, retry begins.
    first_upstream_start: float | None = None
    #: The last try's upstream call (the one that served, or failed last).
    upstream_start: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    last_byte: float | None = None
    done: float | None = None
    gaps: list[float] = field(default_factory=list)

    def decide(self) -> None:
        self.decided = perf_counter()

    def start_upstream(self) -> None:
        """Called at the start of each try's upstream call; the try that serves keeps its own start."""
        now = self.upstream_start = perf_counter()
        if self.first_upstream_start is None:
            self.first_upstream_start = now
        self.first_token = self.last_token = self.last_byte = None
        self.gaps.clear()

    def token(self, now: float | None = None) -> None:
        now = perf_counter() if now is None else now
        if self.first_token is None:
            self.first_token = now
        elif self.last_token is not None:
            self.gaps.append(now - self.last_token)
        self.last_token = now

    def byte(self) -> None:
        self.last_byte = perf_counter()

    def finish(self) -> None:
        self.done = perf_counter()

    def summary(self) -> dict[str, float | None]:
        def ms(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else round((b - a) * 1000, 3)

        gaps = sorted(self.gaps)
        retried = self.upstream_start is not None and self.upstream_start != self.first_upstream_start
        return {
            "queue_ms": ms(self.arrival, self.first_upstream_start),
            "retry_ms": ms(self.first_upstream_start, self.upstream_start) if retried else None,
            "ttft_ms": ms(self.upstream_start, self.first_token),
            "decode_ms": ms(self.first_token, self.last_token),
            "gap_mean_ms": round(sum(gaps) / len(gaps) * 1000, 3) if gaps else None,
            "gap_p95_ms": round(gaps[min(len(gaps) - 1, int(0.95 * len(gaps)))] * 1000, 3) if gaps else None,
            "gap_max_ms": round(gaps[-1] * 1000, 3) if gaps else None,
            "delivery_ms": ms(self.last_byte, self.done),
            "total_ms": ms(self.arrival, self.done),
        }
