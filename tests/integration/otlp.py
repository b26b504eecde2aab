"""An OTLP/HTTP trace receiver on 127.0.0.1: what a collector or Arize Phoenix would receive.

It decodes each ``ExportTraceServiceRequest`` (protobuf, gzip or not) into plain ``Span`` values, so
a test checks the spans that crossed the wire rather than the SDK's objects in memory.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


@dataclass
class Span:
    name: str
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind: 2 SERVER, 3 CLIENT, 1 INTERNAL
    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes
    start_ns: int
    end_ns: int
    status_code: int  # 0 unset, 1 ok, 2 error
    attributes: dict[str, Any]
    events: dict[str, int]  # name → time, ns
    resource: dict[str, Any] = field(default_factory=dict)

    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    return getattr(v, kind) if kind else None


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs if isinstance(kv, KeyValue)}


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver._add(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _add(self, request: ExportTraceServiceRequest) -> None:
        spans = []
        for rs in request.resource_spans:
            resource = _attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append(Span(
                        s.name, s.kind, s.trace_id, s.span_id, s.parent_span_id, s.start_time_unix_nano,
                        s.end_time_unix_nano, s.status.code, _attributes(s.attributes),
                        {e.name: e.time_unix_nano for e in s.events}, resource,
                    ))  # fmt: skip
        with self._changed:
            self.spans.extend(spans)
            self._changed.notify_all()

    def wait_for(self, done: Callable[[list[Span]], bool], timeout: float = 20.0) -> list[Span]:
        """The spans received so far, once ``done`` holds for them (AssertionError after ``timeout``)."""
        with self._changed:
            if not self._changed.wait_for(lambda: done(self.spans), timeout):
                raise AssertionError(f"spans did not arrive in {timeout} s: {[s.name for s in self.spans]}")
            return list(self.spans)
