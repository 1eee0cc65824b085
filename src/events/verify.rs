//! Checking a log file without writing to it: is it a correx log, is SQLite's structure
//! intact, are the streams gapless, is every payload readable, does the hash chain hold, and
//! does the log match the seals given.

use super::chain::{to_hex, ChainHash, Link, GENESIS};
use super::seal::Seal;
use super::time::format_rfc3339_ms;
use super::{EventStoreError, RecordedEvent, Result};
use rusqlite::{Connection, OpenFlags};
use std::collections::HashMap;
use std::path::Path;

/// How every problem that is a break of the hash chain begins.
pub const CHAIN_BREAK: &str = "the hash chain breaks here";

/// One thing wrong with a log.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LogProblem {
    /// The row it is about, when it is about one.
    pub position: Option<u64>,
    /// What is wrong.
    pub detail: String,
}

/// What [`verify_log`](crate::verify_log) found.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LogReport {
    /// Rows read.
    pub events: u64,
    /// Streams seen.
    pub streams: u64,
    /// Events before the hash chain starts (written by a correx from before it); the first
    /// stored hash covers them, so an edit of them breaks the chain there.
    pub unchained: u64,
    /// The first chained position, when any event is chained.
    pub chained_from: Option<u64>,
    /// The last event's position and hash as stored (hex), when it has a well-formed one:
    /// what a seal of this log now would hold (`None` for an empty log, whose seal holds
    /// position 0 and zeros).
    pub head: Option<(u64, String)>,
    /// How many seals the log was checked against.
    pub seals: u64,
    /// The positions whose payloads were erased (`correx log erase`): their digests stay in
    /// the chain, so they are not problems.
    pub erased: Vec<u64>,
    /// Everything wrong, in position order after SQLite's own findings; empty when the log is
    /// sound.
    pub problems: Vec<LogProblem>,
}

/// Opens `path` read-only and checks that it is a correx log; the connection is for reading.
///
/// # Errors
/// [`EventStoreError::Open`] when the file cannot be opened (a missing file is not created);
/// [`EventStoreError::NotALog`] when it is not SQLite or has no correx `events` table.
pub(crate) fn open_log_read_only(path: &Path) -> Result<Connection> {
    if !path.is_file() {
        return Err(EventStoreError::NotALog {
            path: path.to_path_buf(),
            detail: if path.exists() {
                "not a regular file".into()
            } else {
                "no such file".into()
            },
        });
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|source| EventStoreError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let not_a_log = |detail: String| EventStoreError::NotALog {
        path: path.to_path_buf(),
        detail,
    };
    let columns: Vec<String> = conn
        .prepare("SELECT name FROM pragma_table_info('events')")
        .and_then(|mut st| {
            st.query_map([], |r| r.get::<_, String>(0))?
                .collect::<std::result::Result<Vec<_>, _>>()
        })
        .map_err(|e| not_a_log(e.to_string()))?;
    let needed = [
        "position",
        "stream_id",
        "stream_version",
        "type_id",
        "payload",
    ];
    if let Some(missing) = needed.iter().find(|c| !columns.iter().any(|x| x == *c)) {
        return Err(not_a_log(if columns.is_empty() {
            "it has no events table".into()
        } else {
            format!("its events table has no {missing} column")
        }));
    }
    Ok(conn)
}

/// Checks the log at `path` without changing it: SQLite's integrity check, positions that
/// strictly increase, stream versions 1, 2, 3, ... with no gap, payloads that are JSON, the
/// hash chain (see [`chain`](super::chain): each problem at the first position it breaks), the
/// log against each of `seals` (shorter than a seal: cut or rolled back; another hash at a
/// sealed position: rewritten), and whatever `check` says of each event (`Some(problem)`; the
/// domain's schemas, in `crate::verify_log`).
///
/// # Errors
/// As `open_log_read_only`; a row that cannot be read at all is a problem, not an error.
pub fn verify_log_with(
    path: &Path,
    check: &dyn Fn(&RecordedEvent) -> Option<String>,
    seals: &[Seal],
) -> Result<LogReport> {
    let conn = open_log_read_only(path)?;
    let has_hash =
        super::sqlite::has_hash_column(&conn).map_err(|source| EventStoreError::Sqlite {
            operation: "verify",
            source,
        })?;
    let sqlite = |source| EventStoreError::Sqlite {
        operation: "verify",
        source,
    };
    let mut walk = Walk::new(check, seals, chain_start(&conn))
        .with_digests(digest_start(&conn), erased_digests(&conn));
    let integrity: Vec<String> = conn
        .prepare("PRAGMA integrity_check")
        .and_then(|mut st| {
            st.query_map([], |r| r.get::<_, String>(0))?
                .collect::<std::result::Result<Vec<_>, _>>()
        })
        .map_err(sqlite)?;
    for line in integrity.into_iter().filter(|l| l != "ok") {
        walk.report.problems.push(LogProblem {
            position: None,
            detail: format!("SQLite integrity check: {line}"),
        });
    }
    let mut stmt = conn
        .prepare(&format!(
            "SELECT position, event_id, stream_id, stream_version, type_id, schema_version, \
             timestamp_ms, correlation_id, causation_id, payload, {} FROM events \
             ORDER BY position",
            if has_hash { "hash" } else { "NULL" }
        ))
        .map_err(sqlite)?;
    let mut rows = stmt.query([]).map_err(sqlite)?;
    while let Some(row) = rows.next().map_err(sqlite)? {
        let stored = match row.get_ref(10) {
            Ok(rusqlite::types::ValueRef::Null) => Stored::Missing,
            Ok(rusqlite::types::ValueRef::Blob(b)) => Stored::of_bytes(b),
            Ok(other) => Stored::Damaged(format!(
                "{}, not 32 bytes",
                other.data_type().to_string().to_lowercase()
            )),
            Err(e) => Stored::Damaged(e.to_string()),
        };
        walk.row(WalkRow {
            position: row.get::<_, i64>(0).unwrap_or(0),
            link: super::sqlite::link_of(row).map_err(|e| e.to_string()),
            stored,
            event_id: row.get::<_, String>(1).unwrap_or_default(),
            stream: row.get(2).unwrap_or_default(),
            version: row.get::<_, i64>(3).unwrap_or(-1),
            type_id: row.get(4).unwrap_or_default(),
            schema_version: row.get(5).unwrap_or(0),
            timestamp_ms: row.get(6).unwrap_or(0),
            correlation_id: row.get(7).ok().flatten(),
            causation_id: row.get(8).ok().flatten(),
            payload: row.get::<_, String>(9).map_err(|e| e.to_string()),
        });
    }
    Ok(walk.finish())
}

/// One row as `verify` reads it, whatever the store.
pub(crate) struct WalkRow<'r> {
    pub(crate) position: i64,
    /// What the chain covers, or why a column cannot be read.
    pub(crate) link: std::result::Result<Link<'r>, String>,
    pub(crate) stored: Stored,
    pub(crate) event_id: String,
    pub(crate) stream: String,
    pub(crate) version: i64,
    pub(crate) type_id: String,
    pub(crate) schema_version: u32,
    pub(crate) timestamp_ms: i64,
    pub(crate) correlation_id: Option<String>,
    pub(crate) causation_id: Option<String>,
    /// The payload's text, or why it cannot be read as text.
    pub(crate) payload: std::result::Result<String, String>,
}

/// A walk over a log's rows in position order, collecting what is wrong.
pub(crate) struct Walk<'a> {
    pub(crate) report: LogReport,
    check: &'a dyn Fn(&RecordedEvent) -> Option<String>,
    seals: &'a [Seal],
    sealed: std::collections::HashSet<u64>,
    stored_at: HashMap<u64, Option<ChainHash>>,
    chain: Chain,
    last_position: u64,
    versions: HashMap<String, u64>,
    digest_from: u64,
    erased: HashMap<u64, ChainHash>,
    /// Where each recorded erasure says a payload was erased, and where it is recorded.
    erasures: Vec<(u64, u64)>,
}

impl<'a> Walk<'a> {
    /// A walk checking each event with `check`, the log against `seals`, the chain expected
    /// from `chain_from` (where the log says it starts; `None` when it does not say).
    pub(crate) fn new(
        check: &'a dyn Fn(&RecordedEvent) -> Option<String>,
        seals: &'a [Seal],
        chain_from: Option<u64>,
    ) -> Self {
        Walk {
            report: LogReport::default(),
            check,
            seals,
            sealed: seals.iter().map(|s| s.position).collect(),
            stored_at: HashMap::new(),
            chain: Chain {
                expected_from: chain_from,
                ..Chain::default()
            },
            last_position: 0,
            versions: HashMap::new(),
            digest_from: u64::MAX,
            erased: HashMap::new(),
            erasures: Vec::new(),
        }
    }

    /// The walk of a log whose chain commits to digests from `digest_from` on, with the kept
    /// digests of its `erased` payloads.
    pub(crate) fn with_digests(
        mut self,
        digest_from: u64,
        erased: HashMap<u64, ChainHash>,
    ) -> Self {
        self.digest_from = digest_from;
        self.erased = erased;
        self
    }

    /// The last position walked.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn last_position(&self) -> u64 {
        self.last_position
    }

    /// The hash the next event would follow.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn previous(&self) -> ChainHash {
        self.chain.previous.unwrap_or(GENESIS)
    }

    /// Checks the next row.
    pub(crate) fn row(&mut self, row: WalkRow<'_>) {
        let report = &mut self.report;
        report.events += 1;
        let position = row.position;
        let mut problem = |detail: String| {
            report.problems.push(LogProblem {
                position: u64::try_from(position).ok(),
                detail,
            })
        };
        if position <= self.last_position as i64 {
            problem(format!(
                "position {position} does not follow position {}",
                self.last_position
            ));
        }
        self.last_position = position.max(0) as u64;
        let erased = self.erased.get(&self.last_position).copied();
        match &row.link {
            Ok(link) => {
                let form = Form {
                    digest_from: self.digest_from,
                    erased: erased.as_ref(),
                };
                if let Some(p) = self.chain.follow(link, &row.stored, form) {
                    problem(p);
                }
            }
            Err(e) => {
                self.chain.last_stored = None;
                problem(format!(
                    "a column cannot be read, so its hash cannot be checked: {e}"
                ))
            }
        }
        if self.sealed.contains(&self.last_position) {
            let hash = match row.stored {
                Stored::Hash(h) => Some(h),
                Stored::Missing | Stored::Damaged(_) => None,
            };
            self.stored_at.insert(self.last_position, hash);
        }
        let want = self.versions.get(&row.stream).map_or(1, |v| v + 1);
        if row.version != want as i64 {
            problem(format!(
                "stream {:?} jumps to version {} where {want} comes next",
                row.stream, row.version
            ));
        }
        self.versions
            .insert(row.stream.clone(), row.version.max(0) as u64);
        let type_id = row.type_id;
        if erased.is_some() {
            self.report.erased.push(self.last_position);
            if row.payload.as_deref() != Ok(super::erase::TOMBSTONE) {
                self.report.problems.push(LogProblem {
                    position: Some(self.last_position),
                    detail: "this payload was erased, but the event holds a payload again: it \
                             was put back, or the tombstone was changed"
                        .into(),
                });
            }
            return;
        }
        let payload_text = match row.payload {
            Ok(t) => t,
            Err(e) => {
                problem(format!("the payload of {type_id} is not text: {e}"));
                return;
            }
        };
        let payload: serde_json::Value = match serde_json::from_str(&payload_text) {
            Ok(v) => v,
            Err(e) => {
                problem(format!("the payload of {type_id} is not JSON: {e}"));
                return;
            }
        };
        let event = RecordedEvent {
            position: self.last_position,
            event_id: crate::ids::EventId::from_string(row.event_id),
            stream_id: row.stream,
            stream_version: row.version.max(0) as u64,
            type_id,
            schema_version: row.schema_version,
            timestamp_ms: row.timestamp_ms,
            correlation_id: row.correlation_id,
            causation_id: row.causation_id,
            payload,
        };
        if let Some(erased) = super::erase::erasure_of(&event) {
            self.erasures.push((erased, event.position));
        }
        if let Some(p) = (self.check)(&event) {
            self.report.problems.push(LogProblem {
                position: Some(event.position),
                detail: p,
            });
        }
    }

    /// The report: the seals checked, problems in position order.
    pub(crate) fn finish(mut self) -> LogReport {
        let mut report = std::mem::take(&mut self.report);
        report.streams = self.versions.len() as u64;
        report.unchained = self.chain.unchained;
        report.chained_from = self.chain.from;
        report.head = self
            .chain
            .last_stored
            .map(|h| (self.last_position, to_hex(&h)));
        report.seals = self.seals.len() as u64;
        for (erased, at) in &self.erasures {
            if !self.erased.contains_key(erased) {
                report.problems.push(LogProblem {
                    position: Some(*erased),
                    detail: format!(
                        "the erasure recorded at position {at} is not in effect: the payload \
                         was put back (or the erasure did not finish: run `correx log erase` \
                         again)"
                    ),
                });
            }
        }
        report
            .problems
            .extend(check_seals(self.seals, self.last_position, &self.stored_at));
        // In position order (a sort that keeps each position's problems in the order found).
        report.problems.sort_by_key(|p| p.position);
        report
    }
}

/// A row's stored hash.
pub(crate) enum Stored {
    Missing,
    Damaged(String),
    Hash(ChainHash),
}

impl Stored {
    /// A stored byte string: a hash if it has 32 bytes.
    pub(crate) fn of_bytes(b: &[u8]) -> Stored {
        match ChainHash::try_from(b) {
            Ok(h) => Stored::Hash(h),
            Err(_) => Stored::Damaged(format!("{} bytes, not 32", b.len())),
        }
    }
}

/// Where the log says its chain starts (`correx_chain`); `None` for a log no chained correx
/// has opened.
pub(crate) fn chain_start(conn: &Connection) -> Option<u64> {
    conn.query_row("SELECT chain_from FROM correx_chain", [], |r| {
        r.get::<_, i64>(0)
    })
    .ok()
    .map(|p| p.max(1) as u64)
}

/// Where the log's chain starts committing to payload digests (`correx_chain.digest_from`);
/// never (`u64::MAX`) for a log no digesting correx has opened.
pub(crate) fn digest_start(conn: &Connection) -> u64 {
    conn.query_row("SELECT digest_from FROM correx_chain", [], |r| {
        r.get::<_, Option<i64>>(0)
    })
    .ok()
    .flatten()
    .map_or(u64::MAX, |p| p.max(1) as u64)
}

/// The kept digests of erased payloads, by position (none for a log without erasures).
pub(crate) fn erased_digests(conn: &Connection) -> HashMap<u64, ChainHash> {
    let read = || -> rusqlite::Result<HashMap<u64, ChainHash>> {
        let mut st = conn.prepare("SELECT position, digest FROM correx_erased")?;
        let rows = st.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?)))?;
        let mut out = HashMap::new();
        for row in rows {
            let (p, d) = row?;
            if let Ok(d) = ChainHash::try_from(d.as_slice()) {
                out.insert(p.max(0) as u64, d);
            }
        }
        Ok(out)
    };
    read().unwrap_or_default()
}

/// How one event enters the chain.
#[derive(Clone, Copy)]
struct Form<'a> {
    digest_from: u64,
    erased: Option<&'a ChainHash>,
}

/// The chain as `verify` walks it.
#[derive(Default)]
struct Chain {
    /// The hash the next event follows; `None` until the first event.
    previous: Option<ChainHash>,
    /// The first position with a stored hash.
    from: Option<u64>,
    /// Where the log's schema says the chain starts.
    expected_from: Option<u64>,
    unchained: u64,
    /// The last event's stored hash, if it has a well-formed one.
    last_stored: Option<ChainHash>,
}

impl Chain {
    /// Checks one event's stored hash; the problem, if any. After a broken link the walk goes
    /// on from the stored hash, so one edit is one problem, at its own position.
    fn follow(&mut self, link: &Link<'_>, stored: &Stored, form: Form<'_>) -> Option<String> {
        self.last_stored = None;
        // An event without a (well-formed) hash is still chained in passing, as the writer
        // does: the next stored hash covers every event before it.
        let passing = link.hash_at(
            &self.previous.unwrap_or(GENESIS),
            form.digest_from,
            form.erased,
        );
        let stored = match stored {
            Stored::Hash(h) => *h,
            Stored::Missing => {
                self.previous = Some(passing);
                let start = match (self.from, self.expected_from) {
                    (Some(from), _) => from,
                    (None, Some(from)) if link.position >= from => from,
                    (None, _) => {
                        self.unchained += 1;
                        return None;
                    }
                };
                return Some(format!(
                    "the event has no hash, though the chain starts at position {start}: its \
                     hash was removed, or a correx without the chain wrote it"
                ));
            }
            Stored::Damaged(what) => {
                self.previous = Some(passing);
                return Some(format!(
                    "the event's hash is {what}: the hash column was changed"
                ));
            }
        };
        self.from.get_or_insert(link.position);
        self.previous = Some(stored);
        self.last_stored = Some(stored);
        (passing != stored).then(|| {
            format!(
                "{CHAIN_BREAK}: this event was changed, or an event before it was deleted, \
                 inserted or moved"
            )
        })
    }
}

/// What the seals say of a log that ends at `last` and holds `stored` at their positions: a
/// problem for the first seal the log falls short of, and for the first whose hash it does not
/// hold.
fn check_seals(
    seals: &[Seal],
    last: u64,
    stored: &HashMap<u64, Option<ChainHash>>,
) -> Vec<LogProblem> {
    let mut sorted: Vec<&Seal> = seals.iter().collect();
    sorted.sort_by_key(|s| (s.position, s.sealed_at_ms));
    let when = |s: &Seal| format_rfc3339_ms(s.sealed_at_ms);
    let mut problems = Vec::new();
    let mut last_match: Option<&Seal> = None;
    let mut differs = false;
    for seal in &sorted {
        if seal.position > last {
            problems.push(LogProblem {
                position: Some(last + 1),
                detail: format!(
                    "the log ends at position {last}, but the seal made {} reached position {} \
                     (hash {}): events {} to {} were cut off, or this is an older copy of the log",
                    when(seal),
                    seal.position,
                    to_hex(&seal.hash),
                    last + 1,
                    seal.position
                ),
            });
            break;
        }
        let holds = if seal.position == 0 {
            seal.hash == GENESIS
        } else {
            stored.get(&seal.position).copied().flatten() == Some(seal.hash)
        };
        if holds {
            last_match = Some(seal);
        } else if !differs {
            differs = true;
            let since = match last_match {
                Some(m) => format!(
                    "positions {} to {} (the seal made {} at position {} still matches)",
                    m.position + 1,
                    seal.position,
                    when(m),
                    m.position
                ),
                None => format!("positions 1 to {}", seal.position.max(1)),
            };
            problems.push(LogProblem {
                position: Some(seal.position),
                detail: format!(
                    "the log does not hold the hash the seal made {} recorded here (hash {}): \
                     it was rewritten or replaced by another log in {since}",
                    when(seal),
                    to_hex(&seal.hash)
                ),
            });
        }
    }
    problems
}
