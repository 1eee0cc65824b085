//! The OTLP trace protobuf messages correx sends, encoded by hand: a few message types, each
//! field written with its number and wire type from `opentelemetry/proto/trace/v1/trace.proto`
//! and `common/v1/common.proto` (the tests decode every request with the official definitions).

/// An attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `string_value` (1).
    Str(String),
    /// `bool_value` (2).
    Bool(bool),
    /// `int_value` (3).
    Int(i64),
    /// `array_value` (5) of strings.
    Strs(Vec<String>),
}

/// A span event (`Span.Event`).
#[derive(Clone, Debug, PartialEq)]
pub struct SpanEvent {
    /// When, in nanoseconds since the Unix epoch.
    pub time_unix_nano: u64,
    /// Its name.
    pub name: String,
    /// Its attributes.
    pub attributes: Vec<(String, Value)>,
}

/// `Span.SpanKind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanKind {
    /// 1.
    Internal = 1,
    /// 3.
    Client = 3,
}

/// One span.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    /// 16 bytes.
    pub trace_id: [u8; 16],
    /// 8 bytes.
    pub span_id: [u8; 8],
    /// The parent's id, if any.
    pub parent_span_id: Option<[u8; 8]>,
    /// Its name.
    pub name: String,
    /// Its kind.
    pub kind: SpanKind,
    /// Start, nanoseconds since the Unix epoch.
    pub start_time_unix_nano: u64,
    /// End, nanoseconds since the Unix epoch.
    pub end_time_unix_nano: u64,
    /// Its attributes.
    pub attributes: Vec<(String, Value)>,
    /// Its events.
    pub events: Vec<SpanEvent>,
    /// `Some(message)`: status ERROR with that message; `None`: UNSET.
    pub error: Option<String>,
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn key(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, (u64::from(field) << 3) | u64::from(wire));
}

fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    key(out, field, 2);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn message(out: &mut Vec<u8>, field: u32, f: impl FnOnce(&mut Vec<u8>)) {
    let mut inner = Vec::new();
    f(&mut inner);
    bytes(out, field, &inner);
}

fn fixed64(out: &mut Vec<u8>, field: u32, v: u64) {
    key(out, field, 1);
    out.extend_from_slice(&v.to_le_bytes());
}

fn any_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Str(s) => bytes(out, 1, s.as_bytes()),
        Value::Bool(b) => {
            key(out, 2, 0);
            varint(out, u64::from(*b));
        }
        Value::Int(i) => {
            key(out, 3, 0);
            // int64: two's complement, as a 64-bit varint.
            varint(out, *i as u64);
        }
        Value::Strs(items) => message(out, 5, |a| {
            for s in items {
                message(a, 1, |v| bytes(v, 1, s.as_bytes()));
            }
        }),
    }
}

fn attributes(out: &mut Vec<u8>, field: u32, attrs: &[(String, Value)]) {
    for (k, v) in attrs {
        message(out, field, |kv| {
            bytes(kv, 1, k.as_bytes());
            message(kv, 2, |any| any_value(any, v));
        });
    }
}

fn span(out: &mut Vec<u8>, s: &Span) {
    bytes(out, 1, &s.trace_id);
    bytes(out, 2, &s.span_id);
    if let Some(p) = &s.parent_span_id {
        bytes(out, 4, p);
    }
    bytes(out, 5, s.name.as_bytes());
    key(out, 6, 0);
    varint(out, s.kind as u64);
    fixed64(out, 7, s.start_time_unix_nano);
    fixed64(out, 8, s.end_time_unix_nano);
    attributes(out, 9, &s.attributes);
    for e in &s.events {
        message(out, 11, |ev| {
            fixed64(ev, 1, e.time_unix_nano);
            bytes(ev, 2, e.name.as_bytes());
            attributes(ev, 3, &e.attributes);
        });
    }
    if let Some(msg) = &s.error {
        message(out, 15, |st| {
            bytes(st, 2, msg.as_bytes());
            key(st, 3, 0);
            varint(st, 2); // STATUS_CODE_ERROR
        });
    }
}

/// An `ExportTraceServiceRequest` holding `spans` under one resource (`service.name`) and
/// one instrumentation scope (`correx`, this crate's version).
pub fn export_request(service: &str, spans: &[Span]) -> Vec<u8> {
    let mut out = Vec::new();
    message(&mut out, 1, |rs| {
        message(rs, 1, |res| {
            attributes(
                res,
                1,
                &[("service.name".to_owned(), Value::Str(service.to_owned()))],
            )
        });
        message(rs, 2, |ss| {
            message(ss, 1, |scope| {
                bytes(scope, 1, b"correx");
                bytes(scope, 2, env!("CARGO_PKG_VERSION").as_bytes());
            });
            for s in spans {
                message(ss, 2, |sp| span(sp, s));
            }
            bytes(ss, 3, super::SCHEMA_URL.as_bytes());
        });
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_negative_ints_encode_as_protobuf_does() {
        let mut out = Vec::new();
        varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
        let mut out = Vec::new();
        any_value(&mut out, &Value::Int(-1));
        // Field 3, varint, then -1 as ten bytes of two's complement.
        let mut want = vec![0x18];
        want.extend([0xff; 9]);
        want.push(0x01);
        assert_eq!(out, want);
    }
}
