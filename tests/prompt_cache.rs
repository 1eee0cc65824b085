//! Sessions' prompt caches on the real model: saved after each answer, restored after an
//! eviction, a crash and a host restart so the next turn computes only its new suffix and
//! answers as a warm server does; never restored into another model file, context size or
//! conversation, and not trusted when the server does not use what was restored.

use crate::manager::{descriptor, kinds, model_events, setup_with, wait_for, TestResult};
use crate::util::{llama_install, TempDir};
use correx::{
    CancelToken, ContextEntry, ContextPack, DefaultModelManager, GenerationConfig,
    InferenceRequest, InferenceResponse, LlamaInstall, ManagerOptions, ModelDescriptor,
    ModelManager, PromptCacheOptions, RecordedEvent, ResidencyMode, Session, SourceType,
    SqliteEventStore,
};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A system prompt of about `n` × 17 tokens of facts to look up.
fn facts(n: u32) -> String {
    let mut s = String::from("You answer in a few words. ");
    for i in 0..n {
        s += &format!("Fact {i}: the value of item {i} is {}. ", i * 7 % 13);
    }
    s
}

fn chat(install: &LlamaInstall, id: &str, context_size: u32) -> ModelDescriptor {
    let mut d = descriptor(install, id, ResidencyMode::Persistent);
    d.context_size = context_size;
    d
}

fn request(pack: &ContextPack, session: Option<&str>) -> InferenceRequest {
    InferenceRequest {
        context: pack.clone(),
        config: GenerationConfig {
            temperature: 0.0,
            max_tokens: 12,
            seed: Some(7),
            ..GenerationConfig::default()
        },
        session: session.map(str::to_owned),
    }
}

fn conversation(system: String, question: &str) -> ContextPack {
    ContextPack {
        system: Some(system),
        task: Some(question.into()),
        entries: Vec::new(),
    }
}

/// The conversation after `answer`, with the next question.
fn next(pack: &mut ContextPack, answer: &str, question: &str) {
    pack.entries
        .push(ContextEntry::new(SourceType::Model, answer));
    pack.entries
        .push(ContextEntry::new(SourceType::User, question));
}

/// Tokens the server computed for the prompt.
fn computed(r: &InferenceResponse) -> u64 {
    r.timings
        .as_ref()
        .and_then(|t| t["prompt_n"].as_u64())
        .unwrap_or(u64::MAX)
}

fn cache_events(store: &SqliteEventStore, kind: &str, session: &str) -> Vec<RecordedEvent> {
    model_events(store)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.type_id == kind && e.payload["session_id"] == session)
        .collect()
}

fn wait_saved(store: &SqliteEventStore, session: &str, saves: usize) -> TestResult {
    wait_for(
        &format!("save {saves} of {session}"),
        Duration::from_secs(60),
        || cache_events(store, "model.cache_saved", session).len() >= saves,
    )
}

fn cache_options(tmp: &TempDir) -> PromptCacheOptions {
    PromptCacheOptions {
        dir: Some(tmp.join("cache")),
        ..PromptCacheOptions::default()
    }
}

/// The restore of `session` recorded last: it reused the prompt and computed `r`'s.
fn assert_restored(store: &SqliteEventStore, session: &str, r: &InferenceResponse) -> TestResult {
    let restored = cache_events(store, "model.cache_restored", session);
    let last = restored.last().ok_or("no model.cache_restored")?;
    assert_eq!(last.payload["tokens_computed"], computed(r));
    assert!(
        last.payload["tokens_reused"].as_u64() > Some(1500),
        "{}",
        last.payload
    );
    Ok(())
}

#[test]
fn a_session_resumes_warm_after_an_eviction_a_crash_and_a_restart() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let tmp = TempDir::new("prompt-cache");
    let options = |o: &mut ManagerOptions| {
        o.max_loaded = 1;
        o.prompt_cache = Some(cache_options(&tmp));
    };
    let s = setup_with(install.clone(), options)?;
    // What a warm server answers: one without a prompt cache that never unloads.
    let warm = setup_with(install.clone(), |o| o.max_loaded = 1)?;
    let reference = warm.manager.managed(&chat(&install, "warm", 4096));
    let d = chat(&install, "chat", 4096);
    let cached = s.manager.managed(&d);
    let session = Session::open(s.store.clone(), "resume")?;
    let cancel = CancelToken::new();
    let questions = [
        "What is item 3?",
        "And item 5?",
        "And item 8?",
        "And item 11?",
    ];
    let mut pack = conversation(facts(110), questions[0]);

    // Each turn goes through the durable session (which names itself to the model) and to
    // the warm server; the answers must agree.
    let turn =
        |step: &str, pack: &ContextPack| -> Result<InferenceResponse, Box<dyn std::error::Error>> {
            let ours = session
                .infer(step, &cached, &request(pack, None), &cancel)?
                .value;
            let theirs = reference.infer_with_cancel(&request(pack, None), &cancel)?;
            assert_eq!(
                ours.text, theirs.text,
                "{step}: the answer differs from a warm server's"
            );
            Ok(ours)
        };
    let first = turn("t1", &pack)?;
    assert!(
        first.usage.prompt_tokens > 1800,
        "{} prompt tokens",
        first.usage.prompt_tokens
    );
    wait_saved(&s.store, "resume", 1)?;

    // Evicted: another model takes the only place.
    s.manager
        .load(&descriptor(&install, "other", ResidencyMode::Persistent))?;
    assert!(kinds(&model_events(&s.store)?).contains(&"unloaded:evicted".to_owned()));
    next(&mut pack, &first.text, questions[1]);
    let second = turn("t2", &pack)?;
    let suffix = u64::from(second.usage.prompt_tokens - first.usage.prompt_tokens);
    assert!(
        computed(&second) <= suffix,
        "after the eviction the server computed {} tokens; the new suffix is {suffix}",
        computed(&second)
    );
    assert_restored(&s.store, "resume", &second)?;
    wait_saved(&s.store, "resume", 2)?;

    // Killed: the next turn loads a new server and restores what was saved before.
    let pid = s
        .manager
        .server_pid_of("chat")
        .ok_or("chat is not loaded")?;
    // SAFETY: SIGKILL to the server this manager started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    wait_for("the crash", Duration::from_secs(10), || {
        kinds(&model_events(&s.store).unwrap_or_default()).contains(&"unloaded:crashed".to_owned())
    })?;
    next(&mut pack, &second.text, questions[2]);
    let third = turn("t3", &pack)?;
    let suffix = u64::from(third.usage.prompt_tokens - second.usage.prompt_tokens);
    assert!(
        computed(&third) <= suffix,
        "after the crash: {} of {suffix}",
        computed(&third)
    );
    assert_restored(&s.store, "resume", &third)?;
    assert_eq!(
        cache_events(&s.store, "model.cache_restored", "resume").len(),
        2
    );
    wait_saved(&s.store, "resume", 3)?;

    // The host restarts: a new manager and the session from the log.
    let store = s.store.clone();
    drop(cached);
    drop(session);
    drop(s.manager);
    let mut o = ManagerOptions {
        server_bin: install.server.clone(),
        port: crate::util::free_port(),
        log_dir: Some(tmp.join("logs")),
        ..ManagerOptions::default()
    };
    options(&mut o);
    let manager = DefaultModelManager::new(store.clone(), o)?;
    let session = Session::open(store.clone(), "resume")?;
    let mut resumed = session.transcript()?;
    resumed
        .entries
        .push(ContextEntry::new(SourceType::User, questions[3]));
    next(&mut pack, &third.text, questions[3]);
    assert_eq!(resumed, pack, "the log tells the conversation as it was");
    let fourth = session
        .infer(
            "t4",
            &manager.managed(&d),
            &request(&resumed, None),
            &cancel,
        )?
        .value;
    let theirs = reference.infer_with_cancel(&request(&pack, None), &cancel)?;
    assert_eq!(fourth.text, theirs.text, "after the restart");
    let suffix = u64::from(fourth.usage.prompt_tokens - third.usage.prompt_tokens);
    assert!(
        computed(&fourth) <= suffix,
        "after the restart: {} of {suffix}",
        computed(&fourth)
    );
    assert_restored(&store, "resume", &fourth)?;
    assert!(cache_events(&store, "model.cache_missed", "resume").is_empty());
    Ok(())
}

/// The reason of the one miss recorded for `session`.
fn missed(store: &SqliteEventStore, session: &str) -> Result<String, Box<dyn std::error::Error>> {
    let misses = cache_events(store, "model.cache_missed", session);
    assert_eq!(misses.len(), 1, "{session}: {misses:?}");
    assert!(cache_events(store, "model.cache_restored", session).is_empty());
    Ok(misses[0].payload["reason"]
        .as_str()
        .unwrap_or("?")
        .to_owned())
}

#[test]
fn a_cache_saved_for_another_model_context_or_conversation_is_not_restored() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let tmp = TempDir::new("prompt-cache-miss");
    let s = setup_with(install.clone(), |o| {
        o.max_loaded = 1;
        o.prompt_cache = Some(cache_options(&tmp));
    })?;
    let cancel = CancelToken::new();
    let a = chat(&install, "a", 4096);
    let a_2k = chat(&install, "a-2k", 2048);
    // Another model file: the same weights with bytes after them (llama.cpp reads tensors by
    // offset), so only its digest differs.
    let copy = tmp.join("copy.gguf");
    std::fs::copy(&install.model, &copy)?;
    std::fs::OpenOptions::new()
        .append(true)
        .open(&copy)
        .and_then(|mut f| std::io::Write::write_all(&mut f, &[0u8; 64]))?;
    let mut b = chat(&install, "b", 4096);
    b.model_path = copy;

    let ask = |d: &ModelDescriptor, pack: &ContextPack, session: &str| {
        s.manager
            .managed(d)
            .infer_with_cancel(&request(pack, Some(session)), &cancel)
    };
    // Another conversation: the saved messages are not the start of the request's.
    let pack = conversation(facts(20), "What is item 3?");
    ask(&a, &pack, "prefix")?;
    wait_saved(&s.store, "prefix", 1)?;
    s.manager.unload("a")?;
    let edited = conversation(facts(19), "What is item 3?");
    let r = ask(&a, &edited, "prefix")?;
    assert!(!r.text.is_empty());
    assert_eq!(missed(&s.store, "prefix")?, "prefix");

    // Another context size.
    let mut pack = conversation(facts(20), "What is item 4?");
    let first = ask(&a, &pack, "context")?;
    wait_saved(&s.store, "context", 1)?;
    next(&mut pack, &first.text, "And item 6?");
    ask(&a_2k, &pack, "context")?;
    assert_eq!(missed(&s.store, "context")?, "settings");

    // Another model file.
    let mut pack = conversation(facts(20), "What is item 5?");
    let first = ask(&a, &pack, "model")?;
    wait_saved(&s.store, "model", 1)?;
    next(&mut pack, &first.text, "And item 7?");
    let r = ask(&b, &pack, "model")?;
    assert!(!r.text.is_empty());
    assert_eq!(missed(&s.store, "model")?, "model");
    Ok(())
}

/// Where `session`'s save is, as the cache directory lays it out: `<key>/<name>.bin`, the
/// name being the first 16 bytes of the SHA-256 of the session id, in hex (one key here).
fn saved_file(cache: &Path, session: &str) -> Result<PathBuf, Box<dyn std::error::Error>> {
    use sha2::{Digest, Sha256};
    let name: String = Sha256::digest(session.as_bytes())[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let key_dir = std::fs::read_dir(cache)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.len() == 32))
        .ok_or("no key directory")?;
    let file = key_dir.join(format!("{name}.bin"));
    if !file.is_file() {
        return Err(format!("no file of {session} at {}", file.display()).into());
    }
    Ok(file)
}

#[test]
fn a_restore_the_server_does_not_use_is_recorded_as_a_miss_and_dropped() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let tmp = TempDir::new("prompt-cache-swap");
    let s = setup_with(install.clone(), |o| {
        o.max_loaded = 1;
        o.prompt_cache = Some(cache_options(&tmp));
    })?;
    let cancel = CancelToken::new();
    let a = chat(&install, "a", 4096);
    let ask = |pack: &ContextPack, session: &str| {
        s.manager
            .managed(&a)
            .infer_with_cancel(&request(pack, Some(session)), &cancel)
    };
    let mut x = conversation(facts(30), "What is item 3?");
    let mut y = conversation(
        "Reply in French. ".repeat(40) + &facts(10),
        "What is item 2?",
    );
    let rx = ask(&x, "x")?;
    let ry = ask(&y, "y")?;
    wait_saved(&s.store, "x", 1)?;
    wait_saved(&s.store, "y", 1)?;
    s.manager.unload("a")?;
    // y's file now holds x's conversation: a valid file the server restores, of tokens that
    // are not y's prefix.
    let cache = tmp.join("cache");
    let (x_file, y_file) = (saved_file(&cache, "x")?, saved_file(&cache, "y")?);
    std::fs::copy(&x_file, &y_file)?;
    next(&mut y, &ry.text, "And item 4?");
    let r = ask(&y, "y")?;
    assert!(!r.text.is_empty());
    assert_eq!(missed(&s.store, "y")?, "not_reused");
    // The file that did not work was dropped; the save after the answer holds y's own.
    wait_saved(&s.store, "y", 2)?;
    assert_ne!(std::fs::read(&y_file)?, std::fs::read(&x_file)?);
    // x's own file still restores.
    s.manager.unload("a")?;
    next(&mut x, &rx.text, "And item 9?");
    let r = ask(&x, "x")?;
    let restored = cache_events(&s.store, "model.cache_restored", "x");
    assert_eq!(restored.len(), 1);
    assert_eq!(restored[0].payload["tokens_computed"], computed(&r));
    Ok(())
}
