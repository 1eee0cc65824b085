//! `correx log keygen|seal --signing-key|export-session|verify-bundle|prove-consistency|
//! verify-consistency`: evidence someone else can check with only the public key.

use crate::args::Args;
use crate::style::line;
use crate::Failure;
use correx::evidence::{
    checkpoint_of_log, export_session, prove_consistency, verify_bundle, verify_consistency_proof,
    Checkpoint, EvidenceError, PublicKey, SigningKey,
};
use std::path::Path;

fn run(e: EvidenceError) -> Failure {
    Failure::Run(e.to_string())
}

fn file_only(db: &str) -> Result<&Path, Failure> {
    if db.contains("://") {
        return Err(Failure::Run(format!(
            "{db}: checkpoints, bundles and proofs are made from a SQLite log file; a \
             PostgreSQL log does not have them yet"
        )));
    }
    Ok(Path::new(db))
}

fn required<'a>(args: &'a Args, flag: &str, what: &str) -> Result<&'a str, Failure> {
    args.value(flag)
        .ok_or_else(|| Failure::Usage(format!("{flag} {what} is required")))
}

/// The public key of `--public-key` (a file, or 64 hex digits).
pub fn public_key(args: &Args) -> Result<Option<PublicKey>, Failure> {
    args.value("--public-key")
        .map(|p| PublicKey::from_file(Path::new(p)).map_err(run))
        .transpose()
}

fn read_json(path: &str) -> Result<serde_json::Value, Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| Failure::Run(format!("{path}: {e}")))?;
    serde_json::from_str(&text).map_err(|e| Failure::Run(format!("{path}: not JSON: {e}")))
}

/// The last checkpoint line of a file, as given and as checked.
fn last_checkpoint(
    path: &str,
    key: &PublicKey,
) -> Result<(Checkpoint, serde_json::Value), Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| Failure::Run(format!("{path}: {e}")))?;
    let Some(last) = text.lines().rev().find(|l| !l.trim().is_empty()) else {
        return Err(Failure::Run(format!("{path}: holds no checkpoint")));
    };
    let v: serde_json::Value =
        serde_json::from_str(last).map_err(|e| Failure::Run(format!("{path}: not JSON: {e}")))?;
    let c = Checkpoint::from_json(&v, key).map_err(|e| Failure::Run(format!("{path}: {e}")))?;
    Ok((c, v))
}

/// Writes `text` to `path` whole or not at all (a temporary file beside it, renamed).
fn write_whole(path: &str, text: &str) -> Result<(), Failure> {
    let io = |e: std::io::Error| Failure::Run(format!("{path}: {e}"));
    let tmp = format!("{path}.tmp-{}", std::process::id());
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(e)
        })
}

/// `correx log keygen KEYFILE`: a new signing key; prints its public key.
pub fn keygen(args: Args) -> Result<(), Failure> {
    let [path] = args.positionals(&["KEYFILE"])?[..] else {
        unreachable!("positionals returns exactly one")
    };
    let key = SigningKey::generate(Path::new(path)).map_err(run)?;
    line(&key.public().to_hex());
    Ok(())
}

/// `correx log seal DB --signing-key K`: a signed checkpoint.
pub fn seal(db: &str, key_file: &str, append_to: Option<&str>) -> Result<(), Failure> {
    let key = SigningKey::from_file(Path::new(key_file)).map_err(run)?;
    let c = checkpoint_of_log(file_only(db)?).map_err(|e| Failure::Run(format!("{db}: {e}")))?;
    let text = c.to_json(&key).to_string();
    if let Some(to) = append_to {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(to)
            .map_err(|e| Failure::Run(format!("{to}: {e}")))?;
        f.write_all(format!("{text}\n").as_bytes())
            .and_then(|()| f.sync_data())
            .map_err(|e| Failure::Run(format!("{to}: {e}")))?;
    }
    line(&text);
    Ok(())
}

/// `correx log export-session DB SESSION --bundle F --signing-key K`.
pub fn export(args: Args) -> Result<(), Failure> {
    let [db, session] = args.positionals(&["DB", "SESSION"])?[..] else {
        unreachable!("positionals returns exactly two")
    };
    let out = required(&args, "--bundle", "FILE")?;
    let key = SigningKey::from_file(Path::new(required(&args, "--signing-key", "KEYFILE")?))
        .map_err(run)?;
    let bundle = export_session(file_only(db)?, session, &key)
        .map_err(|e| Failure::Run(format!("{db}: {e}")))?;
    let n = bundle["events"].as_array().map_or(0, Vec::len);
    write_whole(out, &format!("{bundle}\n"))?;
    line(&format!(
        "{out}: {n} events of session {session}, proved against tree size {} (position {})",
        bundle["checkpoint"]["tree_size"], bundle["checkpoint"]["position"]
    ));
    Ok(())
}

/// `correx log verify-bundle F --public-key K [--checkpoint C]`.
pub fn verify(args: Args) -> Result<(), Failure> {
    let [file] = args.positionals(&["BUNDLE"])?[..] else {
        unreachable!("positionals returns exactly one")
    };
    let Some(key) = public_key(&args)? else {
        return Err(Failure::Usage("--public-key KEY is required".into()));
    };
    let expected = args
        .value("--checkpoint")
        .map(|c| last_checkpoint(c, &key).map(|(c, _)| c))
        .transpose()?;
    let bundle = read_json(file)?;
    match verify_bundle(&bundle, &key, expected.as_ref()) {
        Ok(r) => {
            line(&format!(
                "ok: {} events of session {}, each in the log {} signed at tree size {} \
                 (position {}, {})",
                r.events,
                r.session,
                correx::chain::to_hex(&r.checkpoint.log_id),
                r.checkpoint.tree_size,
                r.checkpoint.position,
                correx::format_rfc3339_ms(r.checkpoint.sealed_at_ms)
            ));
            Ok(())
        }
        Err(e) => {
            line(&format!("{file}: {e}"));
            Err(Failure::Found)
        }
    }
}

/// `correx log prove-consistency DB --from OLD --to NEW --public-key K`.
pub fn prove(args: Args) -> Result<(), Failure> {
    let [db] = args.positionals(&["DB"])?[..] else {
        unreachable!("positionals returns exactly one")
    };
    let Some(key) = public_key(&args)? else {
        return Err(Failure::Usage("--public-key KEY is required".into()));
    };
    let old = last_checkpoint(required(&args, "--from", "CHECKPOINT_FILE")?, &key)?;
    let new = last_checkpoint(required(&args, "--to", "CHECKPOINT_FILE")?, &key)?;
    let proof = prove_consistency(file_only(db)?, (&old.0, &old.1), (&new.0, &new.1))
        .map_err(|e| Failure::Run(format!("{db}: {e}")))?;
    line(&proof.to_string());
    Ok(())
}

/// `correx log verify-consistency PROOF --public-key K`.
pub fn verify_consistency(args: Args) -> Result<(), Failure> {
    let [file] = args.positionals(&["PROOF"])?[..] else {
        unreachable!("positionals returns exactly one")
    };
    let Some(key) = public_key(&args)? else {
        return Err(Failure::Usage("--public-key KEY is required".into()));
    };
    match verify_consistency_proof(&read_json(file)?, &key) {
        Ok((old, new)) => {
            line(&format!(
                "ok: the log at tree size {} (position {}) extends the log at tree size {} \
                 (position {}): it only grew",
                new.tree_size, new.position, old.tree_size, old.position
            ));
            Ok(())
        }
        Err(e) => {
            line(&format!("{file}: {e}"));
            Err(Failure::Found)
        }
    }
}

/// `correx log erase DB --position N --reason R [--by NAME]`.
pub fn erase(args: Args) -> Result<(), Failure> {
    let [db] = args.positionals(&["DB"])?[..] else {
        unreachable!("positionals returns exactly one")
    };
    let Some(position) = args.number("--position")? else {
        return Err(Failure::Usage("--position N is required".into()));
    };
    let reason = required(&args, "--reason", "TEXT")?;
    let path = file_only(db)?;
    let store = correx::SqliteEventStore::open_existing(path, correx::StoreOptions::default())
        .map_err(|e| Failure::Run(e.to_string()))?;
    let done = store
        .erase(position, reason, args.value("--by"))
        .map_err(|e| Failure::Run(format!("{db}: {e}")))?;
    line(&format!(
        "erased the payload at position {} (digest {} kept; recorded at position {}){}",
        done.position,
        correx::chain::to_hex(&done.digest),
        done.recorded_at,
        if done.wal_cleared {
            ""
        } else {
            "; a reader holds the WAL, so its copy of the old bytes goes at the next checkpoint"
        }
    ));
    Ok(())
}
