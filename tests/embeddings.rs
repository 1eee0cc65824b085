//! Embeddings on the real model: a resident like any other, vectors in input order, the same
//! warm and after a reload, recorded, and refused clearly where they do not belong.

use crate::manager::{ask, descriptor, kinds, model_events, setup_with, TestResult};
use crate::util::llama_install;
use correx::{CancelToken, EventStore, InferenceError, ModelRole, ResidencyMode};

fn texts(t: &[&str]) -> Vec<String> {
    t.iter().map(|s| (*s).to_owned()).collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

#[test]
fn embeddings_are_ordered_recorded_and_the_same_after_a_reload() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |o| o.max_loaded = 2)?;
    let mut emb = descriptor(&s.install, "embedder", ResidencyMode::Persistent);
    emb.serves = ModelRole::Embeddings;
    let cancel = CancelToken::new();
    let inputs = texts(&["The sea is deep.", "A cat sleeps.", "The sea is deep."]);
    let warm = s.manager.embed(&emb, &inputs, &cancel)?;
    assert_eq!(warm.model, "embedder");
    assert_eq!(warm.vectors.len(), 3);
    let dims = warm.vectors[0].len();
    assert!(dims > 16, "{dims} dimensions");
    assert!(warm.vectors.iter().all(|v| v.len() == dims));
    // Within one batch the same text lands at another position, which llama.cpp's kernels
    // may sum in another order: the same direction, not always the same bits.
    let same = cosine(&warm.vectors[0], &warm.vectors[2]);
    let other = cosine(&warm.vectors[0], &warm.vectors[1]);
    assert!(same > 0.999, "the same text: cosine {same}");
    assert!(
        other < same - 0.01,
        "different texts: cosine {other} against {same}"
    );
    assert!(warm.prompt_tokens > 0);

    let events = model_events(&s.store)?;
    let e = events
        .iter()
        .find(|e| e.type_id == "embedding.completed")
        .ok_or("no embedding.completed")?;
    assert_eq!(e.payload["model_id"], "embedder");
    assert_eq!(e.payload["inputs"], 3);
    assert_eq!(e.payload["dimensions"], dims as u64);
    assert_eq!(e.payload["prompt_tokens"], u64::from(warm.prompt_tokens));

    // Unloaded, then loaded again by the next call: the same vectors.
    correx::ModelManager::unload(&s.manager, "embedder")?;
    let again = s.manager.embed(&emb, &inputs, &cancel)?;
    assert!(
        again.vectors == warm.vectors,
        "the same batch after a reload differs"
    );
    assert_eq!(
        kinds(&model_events(&s.store)?)
            .iter()
            .filter(|k| k.as_str() == "loaded:embedder")
            .count(),
        2
    );
    Ok(())
}

#[test]
fn chat_and_embeddings_stay_resident_side_by_side() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |o| o.max_loaded = 2)?;
    let chat = descriptor(&s.install, "chat", ResidencyMode::Persistent);
    let mut emb = descriptor(&s.install, "embedder", ResidencyMode::Persistent);
    emb.serves = ModelRole::Embeddings;
    let provider = s.manager.provider(&chat);
    let cancel = CancelToken::new();
    let one = texts(&["alternating"]);
    let first = s.manager.embed(&emb, &one, &cancel)?;
    // 1,000 calls, alternating.
    for _ in 0..500 {
        assert!(provider.infer(&ask(1))?.usage.prompt_tokens > 0);
        let again = s.manager.embed(&emb, &one, &cancel)?;
        assert!(
            again.vectors == first.vectors,
            "one text's vector changed between calls"
        );
    }
    let kinds = kinds(&model_events(&s.store)?);
    assert!(
        !kinds.iter().any(|k| k.starts_with("unloaded")),
        "an eviction: {kinds:?}"
    );
    assert_eq!(kinds.iter().filter(|k| k.starts_with("loaded")).count(), 2);
    assert_eq!(
        kinds.iter().filter(|k| *k == "embedding.completed").count(),
        501
    );
    Ok(())
}

#[test]
fn an_embedding_of_a_chat_model_or_of_nothing_is_a_clear_error_and_sends_nothing() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |_| {})?;
    let chat = descriptor(&s.install, "chat", ResidencyMode::Persistent);
    let mut emb = descriptor(&s.install, "embedder", ResidencyMode::Persistent);
    emb.serves = ModelRole::Embeddings;
    let cancel = CancelToken::new();
    let e = s.manager.embed(&chat, &texts(&["x"]), &cancel).unwrap_err();
    assert!(matches!(e, InferenceError::NotServed { .. }), "{e:?}");
    assert!(e.to_string().contains("\"serves\": \"embeddings\""), "{e}");
    let e = s.manager.provider(&emb).infer(&ask(1)).unwrap_err();
    assert!(matches!(e, InferenceError::NotServed { .. }), "{e:?}");
    for bad in [texts(&[]), texts(&["ok", ""])] {
        let e = s.manager.embed(&emb, &bad, &cancel).unwrap_err();
        assert!(matches!(e, InferenceError::InvalidInput { .. }), "{e:?}");
    }
    // Nothing was loaded for any of them.
    assert!(s.store.read_stream(correx::MODEL_STREAM, 1, 10)?.is_empty());
    let cancelled = CancelToken::new();
    cancelled.cancel();
    let e = s
        .manager
        .embed(&emb, &texts(&["x"]), &cancelled)
        .unwrap_err();
    assert!(matches!(e, InferenceError::Cancelled), "{e:?}");
    Ok(())
}

#[test]
fn a_remote_model_cannot_claim_to_serve_embeddings() {
    let mut d = correx::ModelDescriptor::remote("r", vec!["http://127.0.0.1:1".into()]);
    d.serves = ModelRole::Embeddings;
    let e = d.validate().unwrap_err().to_string();
    assert!(e.contains("serves: embeddings"), "{e}");
    let parsed: Result<correx::ModelDescriptor, _> = serde_json::from_str(
        r#"{"model_id": "e", "model_path": "/m.gguf", "residency": "persistent", "serves": "vectors"}"#,
    );
    assert!(parsed.is_err());
}
