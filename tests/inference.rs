use crate::stub::{canned, Canned, StubServer};
use crate::util::{free_port, llama_install, raw_http, TestServer};
use correx::{
    chat_body, ContextPack, FinishReason, GenerationConfig, HttpOptions, InferenceError,
    InferenceProvider, InferenceRequest, LlamaCppInferenceProvider, LlamaCppTokenizer,
    ProviderHealth, Tokenizer,
};
use std::time::Duration;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A brief, repeatable question (temperature 0, seed 7).
pub fn ask(question: &str, max_tokens: u32) -> InferenceRequest {
    InferenceRequest {
        context: ContextPack {
            system: Some("You answer briefly.".into()),
            task: Some(question.into()),
            entries: vec![],
        },
        config: GenerationConfig {
            temperature: 0.0,
            max_tokens,
            seed: Some(7),
            ..GenerationConfig::default()
        },
        session: None,
    }
}

#[test]
fn real_server_completion_has_text_and_consistent_usage() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let server = TestServer::start(&install);
    let p = LlamaCppInferenceProvider::new("gemma", &server.base_url(), &HttpOptions::default());
    let r = p.infer(&ask("What is the capital of France?", 16))?;
    assert!(!r.text.trim().is_empty());
    assert!(r.usage.completion_tokens <= 16 && r.usage.completion_tokens > 0);
    assert!(r.usage.prompt_tokens > 5);
    assert_eq!(
        r.usage.total_tokens,
        r.usage.prompt_tokens + r.usage.completion_tokens
    );
    assert!(r.timings.is_some(), "llama-server sends timings");
    let tiny = p.infer(&ask("Write a long story about a dragon.", 2))?;
    assert_eq!(tiny.finish_reason, FinishReason::Length);
    assert_eq!(tiny.usage.completion_tokens, 2);
    Ok(())
}

#[test]
fn real_server_is_deterministic_at_temperature_zero_with_a_seed() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let server = TestServer::start(&install);
    let p = LlamaCppInferenceProvider::new("gemma", &server.base_url(), &HttpOptions::default());
    let a = p.infer(&ask("Name three colors.", 12))?;
    let b = p.infer(&ask("Name three colors.", 12))?;
    assert_eq!(a.text, b.text);
    Ok(())
}

#[test]
fn real_server_token_count_matches_the_server() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let server = TestServer::start(&install);
    let p = LlamaCppInferenceProvider::new("gemma", &server.base_url(), &HttpOptions::default());
    let text = "The quick brown fox jumps over the lazy dog, twice: the quick brown fox.";
    let tokens = p.tokenizer().tokenize(text)?;
    assert_eq!(p.tokenizer().count(text), tokens.len());
    // The server's own answer, fetched without correx.
    let (status, body) = raw_http(
        server.port,
        "POST",
        "/tokenize",
        &serde_json::json!({"content": text}).to_string(),
    )?;
    assert_eq!(status, 200);
    let theirs: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(
        theirs["tokens"].as_array().map(Vec::len),
        Some(tokens.len())
    );
    // And the ids are real: they detokenize back to the text.
    let (_, back) = raw_http(
        server.port,
        "POST",
        "/detokenize",
        &serde_json::json!({"tokens": tokens}).to_string(),
    )?;
    let back: serde_json::Value = serde_json::from_str(&back)?;
    assert_eq!(back["content"].as_str().map(str::trim), Some(text));
    Ok(())
}

#[test]
fn real_server_health_follows_the_process() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let mut server = TestServer::start(&install);
    let p = LlamaCppInferenceProvider::new("gemma", &server.base_url(), &HttpOptions::default());
    assert_eq!(p.health_check(), ProviderHealth::Healthy);
    server.stop();
    match p.health_check() {
        ProviderHealth::Unhealthy { reason } => assert!(reason.contains("unreachable"), "{reason}"),
        ProviderHealth::Healthy => return Err("healthy after stop".into()),
    }
    // The tokenizer falls back instead of failing.
    assert_eq!(p.tokenizer().count("abcdefghijkl"), 3);
    assert!(matches!(
        p.infer(&ask("hi", 4)),
        Err(InferenceError::ConnectionRefused { .. })
    ));
    Ok(())
}

#[test]
fn tokenizer_falls_back_to_chars_over_four_when_nothing_listens() {
    let t = LlamaCppTokenizer::new(
        &format!("http://127.0.0.1:{}", free_port()),
        &HttpOptions::default(),
    );
    assert_eq!(t.count("12345678"), 2);
    assert!(t.tokenize("x").is_err());
}

#[test]
fn stub_captures_the_exact_request_body() -> TestResult {
    let ok = r#"{"choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4},"model":"m"}"#;
    let stub = StubServer::start(vec![canned(200, ok)]);
    let p = LlamaCppInferenceProvider::new("m", &stub.base_url(), &HttpOptions::default());
    let req = ask("hello", 5);
    let r = p.infer(&req)?;
    assert_eq!(
        (r.text.as_str(), r.finish_reason, r.usage.total_tokens),
        ("hi", FinishReason::Stop, 4)
    );
    let sent: serde_json::Value =
        serde_json::from_str(&stub.requests.recv_timeout(Duration::from_secs(5))?)?;
    assert_eq!(sent, correx::stream_body("m", &req));
    assert_eq!(
        sent["stream"], true,
        "every call streams, so a cancel can stop the server"
    );
    assert_eq!(chat_body("m", &req)["stream"], false);
    assert_eq!(sent["seed"], 7);
    Ok(())
}

#[test]
fn stub_500_is_an_http_error_with_the_servers_message() -> TestResult {
    let stub = StubServer::start(vec![canned(
        500,
        r#"{"error":{"code":500,"message":"kv cache exploded","type":"server_error"}}"#,
    )]);
    let p = LlamaCppInferenceProvider::new("m", &stub.base_url(), &HttpOptions::default());
    match p.infer(&ask("x", 4)) {
        Err(e @ InferenceError::Http { status: 500, .. }) => {
            assert!(e.to_string().contains("kv cache exploded"));
            assert!(e.is_transient());
        }
        other => return Err(format!("{other:?}").into()),
    }
    Ok(())
}

#[test]
fn stub_malformed_body_is_its_own_error() -> TestResult {
    let stub = StubServer::start(vec![
        canned(200, "<html>not json"),
        canned(200, r#"{"choices":[]}"#),
    ]);
    let p = LlamaCppInferenceProvider::new("m", &stub.base_url(), &HttpOptions::default());
    for _ in 0..2 {
        assert!(matches!(
            p.infer(&ask("x", 4)),
            Err(InferenceError::MalformedBody { .. })
        ));
    }
    Ok(())
}

#[test]
fn stub_context_error_is_not_retryable() -> TestResult {
    let body = r#"{"error":{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error","n_prompt_tokens":9000,"n_ctx":2048}}"#;
    let stub = StubServer::start(vec![canned(400, body)]);
    let p = LlamaCppInferenceProvider::new("m", &stub.base_url(), &HttpOptions::default());
    match p.infer(&ask("x", 4)) {
        Err(
            e @ InferenceError::ContextExceeded {
                prompt_tokens: Some(9000),
                context_size: Some(2048),
                ..
            },
        ) => {
            assert!(!e.is_transient())
        }
        other => return Err(format!("{other:?}").into()),
    }
    Ok(())
}

#[test]
fn stub_slow_server_gives_a_timeout() -> TestResult {
    let stub = StubServer::start(vec![Canned {
        delay: Duration::from_secs(3),
        ..canned(200, "{}")
    }]);
    let opts = HttpOptions {
        read_timeout: Duration::from_millis(300),
        ..HttpOptions::default()
    };
    let p = LlamaCppInferenceProvider::new("m", &stub.base_url(), &opts);
    assert!(matches!(
        p.infer(&ask("x", 4)),
        Err(InferenceError::Timeout { .. })
    ));
    Ok(())
}
