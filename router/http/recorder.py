"""What a request leaves behind once it has ended, however it ended, exactly once: the decide
stage's follow-up (the prompt's exact size, the task's pin, the weak label), the budget settle,
the log record, metrics and the console line."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from router.background import Background
from router.http.admission import Admission
from router.http.flight import Flight, record
from router.policy.pipeline import Decided, Pipeline
from router.store.writer import LogWriter
from router.telemetry import Telemetry, console
from router.telemetry.phases import Phases


class Recorder:
    """``secret``: whether a string is the master key (``Auth.is_master``), which the log keeps
    nothing of wherever the client put it."""

    def __init__(
        self, pipeline: Pipeline, admission: Admission, writer: LogWriter, telemetry: Telemetry,
        background: Background, secret: Callable[[str], bool],
    ) -> None:  # fmt: skip
        self.secret = secret
        self.pipeline = pipeline
        self.admission = admission
        self.writer = writer
        self.telemetry = telemetry
        self.background = background

    def started(self, f: Flight) -> None:
        self.telemetry.started(f)

    def decided(self, decided: Decided) -> None:
        self.telemetry.prompt_sized(decided.remembered, decided.counted)

    def holding(self, f: Flight) -> None:
        """``f`` holds money in the budgets: renewed until it ends (``Admission.keep``)."""
        if f.renewal is None:
            f.renewal = self.background.spawn(self.admission.keep(f.holds), name="renew-holds")

    def close(self, f: Flight, phases: Phases) -> None:
        if f.closed:
            return
        f.closed = True
        if f.renewal is not None:
            f.renewal.cancel()
        phases.finish()
        if f.decided is not None:
            served_by = f.model if f.status == 200 else None
            c = f.charge
            input_tokens = c.usage.input_tokens if c is not None else None
            reported = c.reported_input_tokens if c is not None and served_by is not None else None
            cached = c.usage.cache_read_tokens if c is not None and reported is not None else None
            self.pipeline.finish(f.rt, f.decided, served_by, input_tokens, reported, cached)
        if f.held is not None:
            cost = f.charge.split.total if f.charge is not None else None
            self.background.spawn(self.admission.settle(f.held, cost), name="settle-budget")
        for more in f.held_more:  # the spend is all in ``held``'s settle
            self.background.spawn(self.admission.settle(more, 0.0), name="settle-budget")
        if f.rate_tokens and f.key_id is not None:
            u = f.charge.usage if f.charge is not None else None
            used = (u.input_tokens or 0) + (u.output_tokens or 0) if u is not None else 0
            self.background.spawn(
                self.admission.recount(f.key_id, f.rate_tokens, used), name="recount-tokens"
            )
        rec = record(f, phases, self.secret)
        self.writer.submit(rec)
        self.telemetry.finished(rec, phases)
        console.log_request(rec)

    async def stored(self, f: Flight, phases: Phases) -> None:
        """Close ``f`` and wait until its record is stored (durable mode: before the client hears
        anything; a store that fails keeps it buffered and retried, and /readyz says so)."""
        self.close(f, phases)
        with contextlib.suppress(Exception):
            await self.writer.flush()
