//! The part of JSON Schema an MCP tool's `inputSchema` uses in practice, checked before a call
//! is put to the approver: `type` (one or a list), `properties`, `required`,
//! `additionalProperties: false`, `enum`, `const`, `items`, `minItems`/`maxItems`,
//! `minLength`/`maxLength`, `pattern` (see [`super::pattern`]), `minimum`/`maximum`, and
//! `anyOf`/`oneOf` (at least one alternative must hold; `oneOf` is not held to exactly one).
//! Keywords it does not know are ignored (the server checks again); a schema that is not an
//! object accepts everything.

use serde_json::{Map, Value};

/// Depth beyond which nested values are not checked (a schema is data from the server).
const MAX_DEPTH: usize = 32;

/// Checks `value` against `schema`; the first problem, with its path (`$.a.b[2]`).
pub(crate) fn check(schema: &Value, value: &Value) -> Result<(), String> {
    check_at(schema, value, "$", 0)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn is_type(v: &Value, t: &str) -> bool {
    match t {
        "number" => v.is_number(),
        "integer" => {
            kind(v) == "integer"
                || v.as_f64()
                    .is_some_and(|f| f.fract() == 0.0 && f.is_finite())
        }
        other => kind(v) == other,
    }
}

fn check_at(schema: &Value, value: &Value, path: &str, depth: usize) -> Result<(), String> {
    let Value::Object(s) = schema else {
        return Ok(());
    };
    if depth > MAX_DEPTH {
        return Ok(());
    }
    check_type(s, value, path)?;
    if let Some(Value::Array(options)) = s.get("enum") {
        if !options.iter().any(|o| same(o, value)) {
            return Err(format!(
                "{path} must be one of {}",
                Value::Array(options.clone())
            ));
        }
    }
    if let Some(c) = s.get("const") {
        if !same(c, value) {
            return Err(format!("{path} must be {c}"));
        }
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(alts)) = s.get(key) {
            if !alts.is_empty()
                && !alts
                    .iter()
                    .any(|a| check_at(a, value, path, depth + 1).is_ok())
            {
                return Err(format!("{path} matches none of the allowed forms ({key})"));
            }
        }
    }
    match value {
        Value::Object(o) => object(s, o, path, depth),
        Value::Array(items) => array(s, items, path, depth),
        Value::String(text) => {
            bounds(
                s,
                "minLength",
                "maxLength",
                text.chars().count(),
                path,
                "characters",
            )?;
            match s.get("pattern") {
                Some(Value::String(p)) if super::pattern::matches(p, text) == Some(false) => {
                    Err(format!("{path} does not match the pattern {p:?}"))
                }
                _ => Ok(()),
            }
        }
        Value::Number(n) => number(s, n, path),
        Value::Null | Value::Bool(_) => Ok(()),
    }
}

/// The schema's `type` (one or a list).
fn check_type(s: &Map<String, Value>, value: &Value, path: &str) -> Result<(), String> {
    match s.get("type") {
        Some(Value::String(t)) if !is_type(value, t) => {
            return Err(format!(
                "{path} must be {}, got {}",
                article(t),
                kind(value)
            ));
        }
        Some(Value::Array(ts)) => {
            let names: Vec<&str> = ts.iter().filter_map(Value::as_str).collect();
            if !names.is_empty() && !names.iter().any(|t| is_type(value, t)) {
                return Err(format!(
                    "{path} must be one of {}, got {}",
                    names.join(", "),
                    kind(value)
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

fn array(s: &Map<String, Value>, items: &[Value], path: &str, depth: usize) -> Result<(), String> {
    bounds(s, "minItems", "maxItems", items.len(), path, "items")?;
    if let Some(item) = s.get("items") {
        for (i, v) in items.iter().enumerate() {
            check_at(item, v, &format!("{path}[{i}]"), depth + 1)?;
        }
    }
    Ok(())
}

fn number(s: &Map<String, Value>, n: &serde_json::Number, path: &str) -> Result<(), String> {
    let x = n.as_f64().unwrap_or(0.0);
    if let Some(min) = s.get("minimum").and_then(Value::as_f64) {
        if x < min {
            return Err(format!("{path} must be at least {min}"));
        }
    }
    if let Some(max) = s.get("maximum").and_then(Value::as_f64) {
        if x > max {
            return Err(format!("{path} must be at most {max}"));
        }
    }
    Ok(())
}

fn object(
    s: &Map<String, Value>,
    o: &Map<String, Value>,
    path: &str,
    depth: usize,
) -> Result<(), String> {
    if let Some(Value::Array(required)) = s.get("required") {
        for r in required.iter().filter_map(Value::as_str) {
            if !o.contains_key(r) {
                return Err(format!("{path} is missing required property {r:?}"));
            }
        }
    }
    let props = s.get("properties").and_then(Value::as_object);
    for (k, v) in o {
        match props.and_then(|p| p.get(k)) {
            Some(p) => check_at(p, v, &format!("{path}.{k}"), depth + 1)?,
            // Properties other keywords may allow are not judged here.
            None if s.contains_key("patternProperties")
                || s.contains_key("allOf")
                || s.contains_key("anyOf")
                || s.contains_key("oneOf") => {}
            None => match s.get("additionalProperties") {
                Some(Value::Bool(false)) => {
                    return Err(format!("{path} has no property {k:?}"));
                }
                Some(extra @ Value::Object(_)) => {
                    check_at(extra, v, &format!("{path}.{k}"), depth + 1)?
                }
                _ => {}
            },
        }
    }
    Ok(())
}

fn bounds(
    s: &Map<String, Value>,
    min: &str,
    max: &str,
    n: usize,
    path: &str,
    what: &str,
) -> Result<(), String> {
    if let Some(lo) = s.get(min).and_then(Value::as_u64) {
        if (n as u64) < lo {
            return Err(format!("{path} must have at least {lo} {what}"));
        }
    }
    if let Some(hi) = s.get(max).and_then(Value::as_u64) {
        if n as u64 > hi {
            return Err(format!("{path} must have at most {hi} {what}"));
        }
    }
    Ok(())
}

/// JSON equality, numbers by value (`1.0` is `1`).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

fn article(t: &str) -> String {
    match t {
        "object" | "array" | "integer" => format!("an {t}"),
        "null" => "null".into(),
        _ => format!("a {t}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_usual_keywords_hold_and_name_the_path() {
        let schema = json!({
            "type": "object",
            "properties": {
                "timezone": {"type": "string", "minLength": 1},
                "count": {"type": "integer", "minimum": 1, "maximum": 10},
                "mode": {"enum": ["a", "b"]},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                "either": {"anyOf": [{"type": "string"}, {"type": "null"}]}
            },
            "required": ["timezone"],
            "additionalProperties": false
        });
        assert_eq!(
            check(&schema, &json!({"timezone": "UTC", "count": 3})),
            Ok(())
        );
        let bad = [
            (json!([]), "$ must be an object, got array"),
            (json!({}), "$ is missing required property \"timezone\""),
            (
                json!({"timezone": 1}),
                "$.timezone must be a string, got integer",
            ),
            (
                json!({"timezone": ""}),
                "$.timezone must have at least 1 characters",
            ),
            (
                json!({"timezone": "x", "count": 0}),
                "$.count must be at least 1",
            ),
            (
                json!({"timezone": "x", "count": 2.5}),
                "$.count must be an integer, got number",
            ),
            (
                json!({"timezone": "x", "mode": "c"}),
                "$.mode must be one of [\"a\",\"b\"]",
            ),
            (
                json!({"timezone": "x", "tags": ["a", 2]}),
                "$.tags[1] must be a string, got integer",
            ),
            (
                json!({"timezone": "x", "tags": ["a", "b", "c"]}),
                "$.tags must have at most 2 items",
            ),
            (
                json!({"timezone": "x", "either": 3}),
                "$.either matches none of the allowed forms (anyOf)",
            ),
            (
                json!({"timezone": "x", "extra": 1}),
                "$ has no property \"extra\"",
            ),
        ];
        for (v, want) in bad {
            assert_eq!(check(&schema, &v), Err(want.to_owned()), "{v}");
        }
        // A schema that says nothing accepts anything; 2.0 is an integer.
        assert_eq!(check(&json!(true), &json!([1])), Ok(()));
        assert_eq!(check(&json!({"type": "integer"}), &json!(2.0)), Ok(()));
    }
}
