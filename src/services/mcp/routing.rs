//! The routing headers of the stateless revision's HTTP transport (2026-07-28, SEP-2243):
//! `Mcp-Method` on every POST, `Mcp-Name` for the tool, prompt or resource a request names,
//! and `Mcp-Param-<Name>` for each argument a tool's input schema marks with
//! `x-mcp-header`, so a gateway can route without reading the body.
//!
//! A value that is not plain visible ASCII (non-ASCII, a control character, leading or
//! trailing white space) goes as `=?base64?<base64 of its UTF-8>?=`. A tool whose
//! annotations are unusable (an empty or non-token name, one repeated in any case, on a
//! property that is not a string, integer or boolean) is not offered: the server's other
//! tools are.

use serde_json::{Map, Value};

/// The longest argument mirrored into a header (before its encoding).
const MAX_PARAM_VALUE: usize = 4096;

/// The header a tool argument is mirrored into: (argument, header name).
pub(crate) type ParamHeader = (String, String);

/// The `x-mcp-header` annotations of a tool's `input_schema`, or why they cannot be used.
pub(crate) fn param_headers(input_schema: &Value) -> Result<Vec<ParamHeader>, String> {
    let mut found: Vec<ParamHeader> = Vec::new();
    let Some(properties) = input_schema.get("properties").and_then(Value::as_object) else {
        return Ok(found);
    };
    for (arg, schema) in properties {
        let Some(name) = schema.get("x-mcp-header") else {
            continue;
        };
        let Some(name) = name.as_str() else {
            return Err(format!("{arg}: x-mcp-header is not a string"));
        };
        if name.is_empty() || !name.bytes().all(is_token_char) {
            return Err(format!("{arg}: x-mcp-header {name:?} is not a header name"));
        }
        let primitive = matches!(
            schema.get("type").and_then(Value::as_str),
            Some("string" | "integer" | "boolean")
        );
        if !primitive {
            return Err(format!(
                "{arg}: x-mcp-header on a property that is not a string, integer or boolean"
            ));
        }
        if found.iter().any(|(_, n)| n.eq_ignore_ascii_case(name)) {
            return Err(format!("x-mcp-header {name:?} is given twice"));
        }
        found.push((arg.clone(), name.to_owned()));
    }
    Ok(found)
}

/// An RFC 9110 token character.
fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The routing headers of `message` (a request or notification), its tool's `params`
/// annotations given.
pub(crate) fn headers(message: &Value, params: &[ParamHeader]) -> Vec<(String, String)> {
    let mut h = Vec::new();
    let Some(method) = message.get("method").and_then(Value::as_str) else {
        return h;
    };
    h.push(("Mcp-Method".to_owned(), encode(method)));
    let p = &message["params"];
    let name = match method {
        "tools/call" | "prompts/get" => p.get("name"),
        "resources/read" => p.get("uri"),
        _ => None,
    };
    if let Some(name) = name.and_then(Value::as_str) {
        h.push(("Mcp-Name".to_owned(), encode(name)));
    }
    if method == "tools/call" {
        let args = p.get("arguments").and_then(Value::as_object);
        for (arg, header) in params {
            if let Some(v) = args.and_then(|a: &Map<String, Value>| a.get(arg)) {
                let text = match v {
                    Value::String(s) => s.clone(),
                    Value::Bool(b) => b.to_string(),
                    Value::Number(n) => n.to_string(),
                    // Null (or a wrong shape, which the schema check refuses first): none.
                    _ => continue,
                };
                // A value too long for a header is left to the body alone.
                if text.len() > MAX_PARAM_VALUE {
                    log::warn!("an argument too long for Mcp-Param-{header} is not mirrored");
                    continue;
                }
                h.push((format!("Mcp-Param-{header}"), encode(&text)));
            }
        }
    }
    h
}

/// `value` as a header value: as it is when it is visible ASCII with inner spaces only,
/// else base64 in the `=?base64?…?=` form.
fn encode(value: &str) -> String {
    // A plain value that looks encoded would be decoded by the server: it is encoded too.
    let plain = value.bytes().all(|b| (0x20..0x7f).contains(&b))
        && value.trim() == value
        && !value.starts_with("=?base64?");
    if plain {
        value.to_owned()
    } else {
        format!("=?base64?{}?=", crate::text::base64(value.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_that_are_not_plain_ascii_go_as_base64() {
        assert_eq!(encode("us west 1"), "us west 1");
        assert_eq!(encode(""), "");
        assert_eq!(encode("Hello, 世界"), "=?base64?SGVsbG8sIOS4lueVjA==?=");
        assert_eq!(encode(" padded "), "=?base64?IHBhZGRlZCA=?=");
        assert_eq!(encode("a\r\nb"), "=?base64?YQ0KYg==?=");
        assert_eq!(encode("=?base64?eA==?="), "=?base64?PT9iYXNlNjQ/ZUE9PT89?=");
    }

    #[test]
    fn a_tool_call_carries_method_name_and_its_annotated_arguments() {
        let schema = json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "n": {"type": "integer", "x-mcp-header": "N"},
            "v": {"type": "boolean", "x-mcp-header": "V"},
            "f": {"type": "number"}}});
        let params = param_headers(&schema).expect("usable");
        let message = json!({"method": "tools/call", "params": {"name": "t",
            "arguments": {"region": "eu", "n": 42, "v": null, "f": 1.5}}});
        let mut h = headers(&message, &params);
        h.sort();
        assert_eq!(
            h,
            [
                ("Mcp-Method".to_owned(), "tools/call".to_owned()),
                ("Mcp-Name".to_owned(), "t".to_owned()),
                ("Mcp-Param-N".to_owned(), "42".to_owned()),
                ("Mcp-Param-Region".to_owned(), "eu".to_owned()),
            ]
        );
    }

    #[test]
    fn unusable_annotations_are_refused() {
        let with = |p: Value| param_headers(&json!({"properties": p}));
        assert!(with(json!({"a": {"type": "string", "x-mcp-header": ""}})).is_err());
        assert!(with(json!({"a": {"type": "string", "x-mcp-header": "A B"}})).is_err());
        assert!(with(json!({"a": {"type": "string", "x-mcp-header": "A:B"}})).is_err());
        assert!(with(json!({"a": {"type": "string", "x-mcp-header": "Ä"}})).is_err());
        assert!(with(json!({"a": {"type": "number", "x-mcp-header": "A"}})).is_err());
        assert!(with(json!({"a": {"type": "object", "x-mcp-header": "A"}})).is_err());
        assert!(with(json!({"a": {"type": "string", "x-mcp-header": "A"},
            "b": {"type": "string", "x-mcp-header": "a"}}))
        .is_err());
        assert!(with(json!({"a": {"type": "string", "x-mcp-header": "X-Region_1"}})).is_ok());
    }
}
