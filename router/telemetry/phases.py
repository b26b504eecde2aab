"""Phase timing of one request: queue, time to first token, decode, gaps, delivery.

Clock readings are ``time.perf_counter()`` seconds; summaries are milliseconds. A phase that
cannot be observed (TTFT and decode of a non-streamed reply) is ``None``, never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter


@dataclass(slots=True)
class Phases:
    arrival: float = field(default_factory=perf_counter)
    #: When the policy's decision was made: arrival → decided is intake and routing.
    decided: float | None = None
    upstream_start: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    last_byte: float | None = None
    done: float | None = None
    gaps: list[float] = field(default_factory=list)

    def decide(self) -> None:
        self.decided = perf_counter()

    def start_upstream(self) -> None:
        """Called at the start of each try; the try that serves keeps its own start."""
        self.upstream_start = perf_counter()
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
        return {
            "queue_ms": ms(self.arrival, self.upstream_start),
            "ttft_ms": ms(self.upstream_start, self.first_token),
            "decode_ms": ms(self.first_token, self.last_token),
            "gap_mean_ms": round(sum(gaps) / len(gaps) * 1000, 3) if gaps else None,
            "gap_p95_ms": round(gaps[min(len(gaps) - 1, int(0.95 * len(gaps)))] * 1000, 3) if gaps else None,
            "gap_max_ms": round(gaps[-1] * 1000, 3) if gaps else None,
            "delivery_ms": ms(self.last_byte, self.done),
            "total_ms": ms(self.arrival, self.done),
        }
