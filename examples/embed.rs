//! The demo's flow from Rust, with correx linked statically as an rlib:
//! `cargo run --release --example embed` (run scripts/install-llama.sh first).

use correx::{
    CallbackApprover, ContextEntry, ContextPack, EventStore, GenerationConfig, InferenceRequest,
    LlamaInstall, ModelDescriptor, ResidencyMode, Runtime, RuntimeConfig, SessionId, SourceType,
    ToolExecutor, ToolRequest, ToolResult,
};
use serde_json::json;
use std::sync::Arc;

fn params(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    v.as_object().cloned().unwrap_or_default()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let install = LlamaInstall::locate().ok_or("run scripts/install-llama.sh first")?;
    let dir = std::env::temp_dir().join(format!("correx-embed-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut config = RuntimeConfig::from_json(
        &json!({
            "v": 1,
            "event_log": dir.join("events.db"),
            "sandbox_root": dir.join("sandbox"),
            "tools": {
                "file_write": {"enabled": true, "allowed_paths": [dir]},
                "shell": {"enabled": true, "allowed_executables": ["ls"]}
            },
            "models": {"port": 18432, "log_dir": dir.join("logs")}
        })
        .to_string(),
    )?;
    config.models.server_bin = install.server.clone();
    let approver = CallbackApprover::new(|req, _| {
        let yes = req.tool_name == "file_write";
        println!(
            "  approver: {} ({}) -> {}",
            req.tool_name,
            req.tier,
            if yes { "APPROVE" } else { "DENY" }
        );
        Ok(yes)
    });
    let runtime = Runtime::new(&config, Arc::new(approver))?;

    println!("Loading gemma-3-270m...");
    let mut model = ModelDescriptor::new("gemma-3-270m", &install.model, ResidencyMode::Persistent);
    model.context_size = 2048;
    model.extra_args = vec![
        "--no-jinja".into(),
        "--chat-template".into(),
        "gemma".into(),
    ];
    let provider = runtime
        .models()
        .load_with_cancel(&model, &correx::CancelToken::new())?;

    println!("Asking: What is the capital of France?");
    let shot = ContextEntry::new;
    print!("  answer (streamed):");
    let answer = provider.infer_stream(
        &InferenceRequest {
            context: ContextPack {
                entries: vec![
                    shot(SourceType::User, "What is the capital of Italy?"),
                    shot(SourceType::Model, "Rome."),
                    shot(SourceType::User, "What is the capital of Germany?"),
                    shot(SourceType::Model, "Berlin."),
                    shot(SourceType::User, "What is the capital of France?"),
                ],
                ..ContextPack::default()
            },
            config: GenerationConfig {
                temperature: 0.0,
                max_tokens: 2,
                seed: Some(7),
                ..GenerationConfig::default()
            },
            session: None,
        },
        &correx::CancelToken::new(),
        &mut |chunk| {
            print!("{}", chunk.text);
            let _ = std::io::Write::flush(&mut std::io::stdout());
            correx::StreamControl::Continue
        },
    )?;
    println!();
    println!("  answer: {}", answer.text.trim());
    println!(
        "  usage: {} prompt + {} completion tokens ({} ms)",
        answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.latency_ms
    );

    let session = SessionId::from("embed");
    for req in [
        ToolRequest::new(
            session.clone(),
            "file_write",
            params(json!({"operation": "write", "path": "answer.txt", "content": answer.text})),
        ),
        ToolRequest::new(
            session.clone(),
            "shell",
            params(json!({"argv": ["ls", "-l", dir]})),
        ),
    ] {
        println!("{}:", req.tool_name);
        match runtime.executor().execute(&req) {
            ToolResult::Success { output, .. } => println!("  success: {output}"),
            ToolResult::Failure { reason, .. } => println!("  failure: {reason}"),
        }
    }
    correx::ModelManager::unload(runtime.models(), "gemma-3-270m")?;

    println!("\nEvent log:");
    for e in runtime.events().read_all(1, 1000)? {
        let summary = e
            .domain()?
            .map(|d| d.summary())
            .unwrap_or_else(|| e.type_id.clone());
        println!(
            "  #{:<3} {}  {:<16} {summary}",
            e.position,
            e.timestamp_rfc3339(),
            e.stream_id
        );
    }
    drop(runtime);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
