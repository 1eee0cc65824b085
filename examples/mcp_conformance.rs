//! A client for the official MCP conformance suite (`@modelcontextprotocol/conformance`):
//! `conformance client --command "target/debug/examples/mcp_conformance" --scenario NAME`
//! runs it with the scenario's server URL as its argument and the scenario's name in
//! `MCP_CONFORMANCE_SCENARIO`. It opens a runtime with that server as `mcp_servers.s` (its
//! host allowed, loopback included), answers elicitation by accepting with no fields (so the
//! form's defaults apply), plays the user's browser when the server asks for OAuth (it
//! fetches the authorization page, which the suite's authorization server answers with a
//! redirect to correx's loopback listener, and follows it), lists the server's tools and
//! calls each with the arguments the scenario's context names for it (`toolCalls`), else
//! with arguments made from its input schema. A pre-registered client's id and
//! secret come from the scenario's `MCP_CONFORMANCE_CONTEXT`. It exits 0 once every call was
//! made, whatever the server answered: the suite judges what it saw on the wire.

use correx::{
    CancelToken, McpAuthorizer, McpClientMethod, McpRefusal, McpRequestHandler, McpServerRequest,
    Runtime, RuntimeConfig, ToolExecutor, ToolRequest, ToolResult,
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

/// The user's browser: loads the authorization page and follows its redirects (to correx's
/// loopback listener).
struct Browser;

impl McpAuthorizer for Browser {
    fn open(&self, _server: &str, url: &str) -> Result<(), String> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let r = agent.get(url).call().map_err(|e| e.to_string())?;
        eprintln!("browser: {} after the authorization page", r.status());
        Ok(())
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
    let host = url
        .strip_prefix("http://")
        .and_then(|r| r.split('/').next())
        .and_then(|a| a.rsplit_once(':').map(|(h, _)| h).or(Some(a)))
        .ok_or("the server URL is not http://")?
        .to_owned();
    let dir = std::env::temp_dir().join(format!("correx-conformance-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let context: Value = std::env::var("MCP_CONFORMANCE_CONTEXT")
        .ok()
        .and_then(|c| serde_json::from_str(&c).ok())
        .unwrap_or(Value::Null);
    let mut oauth = json!({
        "token_file": dir.join("tokens/tokens.json"),
        "client_metadata_url": "https://conformance-test.local/client-metadata.json",
        "authorize_timeout_ms": 10000
    });
    if let Some(id) = context["client_id"].as_str() {
        oauth["client_id"] = id.into();
    }
    if let Some(secret) = context["client_secret"].as_str() {
        std::env::set_var("CONFORMANCE_CLIENT_SECRET", secret);
        oauth["client_secret_env"] = "CONFORMANCE_CLIENT_SECRET".into();
    }
    let config = RuntimeConfig::from_json(
        &json!({
            "v": 1,
            "event_log": dir.join("events.db"),
            "sandbox_root": dir.join("sandbox"),
            "mcp_servers": {"s": {
                "url": url,
                "tier": 0,
                // The server and its authorization server, on two ports of one host.
                "network": {"allow": [format!("{host}:*")], "allow_private": true},
                "oauth": oauth,
                "call_timeout_ms": 20000
            }}
        })
        .to_string(),
    )?;
    let runtime = Runtime::new(&config, Arc::new(correx::DenyAll))?;
    runtime.mcp().set_request_handler(Some(Arc::new(Host)));
    runtime.mcp().set_authorizer(Some(Arc::new(Browser)));
    let tools = runtime.executor().registry().describe();
    eprintln!("scenario {scenario}: {} tool(s)", tools.len());
    for tool in tools.iter().filter(|t| t.name.starts_with("s.")) {
        if !tool.enabled {
            eprintln!("{}: {}", tool.name, tool.description);
            continue;
        }
        // The scenario's own arguments for a tool, when it names some.
        let given = context["toolCalls"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| Some(c["name"].as_str().unwrap_or_default()) == tool.name.strip_prefix("s."))
            .and_then(|c| c.get("arguments").cloned())
            // correx checks arguments against the tool's schema, where a null is not the
            // boolean a property asks for: a host leaves such an argument out.
            .map(|mut a| {
                if let Some(a) = a.as_object_mut() {
                    a.retain(|_, v| !v.is_null());
                }
                a
            });
        let params = given.unwrap_or_else(|| Value::Object(arguments(&tool.parameters)));
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
