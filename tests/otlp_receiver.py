"""A loopback OTLP/HTTP trace receiver for the tests: decodes every request with the official
protobuf definitions (opentelemetry-proto), refuses one that does not decode or carries fields
the definitions do not know, and writes each span as a JSON line to the file in argv[1]. With
argv[2] == "unavailable" it answers every request 503 instead. Prints its port, then serves
until its standard input ends (the test's end, however it ends)."""
import http.server
import json
import os
import sys
import threading

UNAVAILABLE = len(sys.argv) > 2 and sys.argv[2] == "unavailable"

from google.protobuf.unknown_fields import UnknownFieldSet
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

OUT = open(sys.argv[1], "a", encoding="utf-8")
LOCK = threading.Lock()


def unknown(msg):
    """Whether `msg` or any message inside it holds a field its definition lacks."""
    if len(UnknownFieldSet(msg)) > 0:
        return True
    for field, value in msg.ListFields():
        if field.message_type is None:
            continue
        # A repeated field's value is a container of messages; a single one is a message.
        items = [value] if hasattr(value, "ListFields") else value
        if any(unknown(v) for v in items):
            return True
    return False


def value(any_value):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def attrs(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if UNAVAILABLE:
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        problem = None
        if self.path != "/v1/traces":
            problem = "path " + self.path
        elif self.headers.get("Content-Type") != "application/x-protobuf":
            problem = "content type " + str(self.headers.get("Content-Type"))
        req = ExportTraceServiceRequest()
        try:
            req.ParseFromString(body)
        except Exception as e:  # noqa: BLE001 - any decode failure is the answer
            problem = "does not decode: %s" % e
        if problem is None and unknown(req):
            problem = "fields the definitions do not know"
        if problem is not None:
            with LOCK:
                OUT.write(json.dumps({"refused": problem}) + "\n")
                OUT.flush()
            self.send_response(400)
            self.end_headers()
            return
        lines = []
        for rs in req.resource_spans:
            resource = attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                for sp in ss.spans:
                    lines.append(json.dumps({
                        "service": resource.get("service.name"),
                        "scope": ss.scope.name,
                        "schema_url": ss.schema_url,
                        "trace_id": sp.trace_id.hex(),
                        "span_id": sp.span_id.hex(),
                        "parent": sp.parent_span_id.hex(),
                        "name": sp.name,
                        "kind": sp.kind,
                        "start": sp.start_time_unix_nano,
                        "end": sp.end_time_unix_nano,
                        "attributes": attrs(sp.attributes),
                        "events": [{"name": e.name, "time": e.time_unix_nano,
                                    "attributes": attrs(e.attributes)} for e in sp.events],
                        "status": {"code": sp.status.code, "message": sp.status.message},
                    }))
        with LOCK:
            for line in lines:
                OUT.write(line + "\n")
            OUT.flush()
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


def exit_when_stdin_ends():
    sys.stdin.read()
    os._exit(0)


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=exit_when_stdin_ends, daemon=True).start()
print(server.server_address[1], flush=True)
server.serve_forever()
