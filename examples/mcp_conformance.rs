//! A client for the official MCP conformance suite (`@modelcontextprotocol/conformance`):
//! `conformance client --command "target/debug/examples/mcp_conformance" --scenario NAME`
//! runs it with the scenario's server URL as its argument and the scenario's name in
//! `MCP_CONFORMANCE_SCENARIO`. It opens a runtime with that server as `mcp_servers.s` (its
//! host allowed, loopback included), answers elicitation by accepting with no fields (so the
//! form's defaults apply), lists the server's tools and calls each with arguments made from
//! its input schema. It exits 0 once every call was made, whatever the server answered: the
//! suite judges what it saw on the wire.

use correx::{
    CancelToken, McpClientMethod, McpRefusal, McpRequestHandler, McpServerRequest, Runtime,
    RuntimeConfig, ToolExecutor, ToolRequest, ToolResult,
};
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// Accepts every elicitation, leaving every field to its default.
struct Host;

impl McpRequestHandler for Host {
    fn methods(&self) -> Vec<McpClientMethod> {
        vec![McpClientMethod::Elicitation]
    }

    fn handle(&self, _: &McpServerRequest<'_>, _: &CancelToken) -> Result<Value, McpRefusal> {
        Ok(json!({"action": "accept", "content": {}}))
    }
}

/// A value of `schema`'s type.
fn sample(schema: &Value) -> Value {
    if let Some(d) = schema.get("default") {
        return d.clone();
    }
    match schema["type"].as_str() {
        Some("number") | Some("integer") => json!(1),
        Some("boolean") => json!(true),
        Some("array") => json!([]),
        Some("object") => Value::Object(arguments(schema)),
        _ => json!("conformance"),
    }
}

/// Arguments for a tool: each required property (and each with a default) given a value.
fn arguments(schema: &Value) -> Map<String, Value> {
    let required: Vec<&str> = schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let mut out = Map::new();
    for (name, s) in schema["properties"].as_object().into_iter().flatten() {
        if required.contains(&name.as_str()) || s.get("type").is_some_and(|t| t == "number") {
            out.insert(name.clone(), sample(s));
        }
    }
    out
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .ok_or("usage: mcp_conformance SERVER_URL")?;
    let scenario = std::env::var("MCP_CONFORMANCE_SCENARIO").unwrap_or_default();
    let authority = url
        .strip_prefix("http://")
        .and_then(|r| r.split('/').next())
        .ok_or("the server URL is not http://")?
        .to_owned();
    let dir = std::env::temp_dir().join(format!("correx-conformance-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config = RuntimeConfig::from_json(
        &json!({
            "v": 1,
            "event_log": dir.join("events.db"),
            "sandbox_root": dir.join("sandbox"),
            "mcp_servers": {"s": {
                "url": url,
                "tier": 0,
                "network": {"allow": [authority], "allow_private": true},
                "call_timeout_ms": 20000
            }}
        })
        .to_string(),
    )?;
    let runtime = Runtime::new(&config, Arc::new(correx::DenyAll))?;
    runtime.mcp().set_request_handler(Some(Arc::new(Host)));
    let tools = runtime.executor().registry().describe();
    eprintln!("scenario {scenario}: {} tool(s)", tools.len());
    for tool in tools.iter().filter(|t| t.name.starts_with("s.")) {
        if !tool.enabled {
            eprintln!("{}: {}", tool.name, tool.description);
            continue;
        }
        let params = Value::Object(arguments(&tool.parameters));
        let request = ToolRequest::json("conformance", &tool.name, params)?;
        match runtime.executor().execute(&request) {
            ToolResult::Success { output, .. } => eprintln!("{}: {output}", tool.name),
            ToolResult::Failure { reason, .. } => eprintln!("{} failed: {reason}", tool.name),
        }
    }
    drop(runtime);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
