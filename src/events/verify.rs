//! Checking a log file without writing to it: is it a correx log, is SQLite's structure
//! intact, are the streams gapless, is every payload readable.

use super::{EventStoreError, RecordedEvent, Result};
use rusqlite::{Connection, OpenFlags};
use std::collections::HashMap;
use std::path::Path;

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
    /// Everything wrong, in position order after SQLite's own findings; empty when the log is
    /// sound.
    pub problems: Vec<LogProblem>,
}

/// Opens `path` read-only and checks that it is a correx log; the connection is for reading.
///
/// # Errors
/// [`EventStoreError::Open`] when the file cannot be opened (a missing file is not created);
/// [`EventStoreError::NotALog`] when it is not SQLite or has no correx `events` table.
pub(super) fn open_log_read_only(path: &Path) -> Result<Connection> {
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
/// strictly increase, stream versions 1, 2, 3, ... with no gap, payloads that are JSON, and
/// whatever `check` says of each event (`Some(problem)`; the domain's schemas, in
/// `crate::verify_log`).
///
/// # Errors
/// As `open_log_read_only`; a row that cannot be read at all is a problem, not an error.
pub fn verify_log_with(
    path: &Path,
    check: &dyn Fn(&RecordedEvent) -> Option<String>,
) -> Result<LogReport> {
    let conn = open_log_read_only(path)?;
    let sqlite = |source| EventStoreError::Sqlite {
        operation: "verify",
        source,
    };
    let mut report = LogReport::default();
    let integrity: Vec<String> = conn
        .prepare("PRAGMA integrity_check")
        .and_then(|mut st| {
            st.query_map([], |r| r.get::<_, String>(0))?
                .collect::<std::result::Result<Vec<_>, _>>()
        })
        .map_err(sqlite)?;
    for line in integrity.into_iter().filter(|l| l != "ok") {
        report.problems.push(LogProblem {
            position: None,
            detail: format!("SQLite integrity check: {line}"),
        });
    }
    let mut stmt = conn
        .prepare(
            "SELECT position, event_id, stream_id, stream_version, type_id, schema_version, \
             timestamp_ms, correlation_id, causation_id, payload FROM events ORDER BY position",
        )
        .map_err(sqlite)?;
    let mut rows = stmt.query([]).map_err(sqlite)?;
    let mut last_position = 0u64;
    let mut versions: HashMap<String, u64> = HashMap::new();
    while let Some(row) = rows.next().map_err(sqlite)? {
        report.events += 1;
        let position = row.get::<_, i64>(0).unwrap_or(0);
        let mut problem = |detail: String| {
            report.problems.push(LogProblem {
                position: u64::try_from(position).ok(),
                detail,
            })
        };
        if position <= last_position as i64 {
            problem(format!(
                "position {position} does not follow position {last_position}"
            ));
        }
        last_position = position.max(0) as u64;
        let stream: String = row.get(2).unwrap_or_default();
        let version = row.get::<_, i64>(3).unwrap_or(-1);
        let want = versions.get(&stream).map_or(1, |v| v + 1);
        if version != want as i64 {
            problem(format!(
                "stream {stream:?} jumps to version {version} where {want} comes next"
            ));
        }
        versions.insert(stream.clone(), version.max(0) as u64);
        let type_id: String = row.get(4).unwrap_or_default();
        let payload_text = match row.get::<_, String>(9) {
            Ok(t) => t,
            Err(e) => {
                problem(format!("the payload of {type_id} is not text: {e}"));
                continue;
            }
        };
        let payload: serde_json::Value = match serde_json::from_str(&payload_text) {
            Ok(v) => v,
            Err(e) => {
                problem(format!("the payload of {type_id} is not JSON: {e}"));
                continue;
            }
        };
        {
            let event = RecordedEvent {
                position: last_position,
                event_id: crate::ids::EventId::from_string(
                    row.get::<_, String>(1).unwrap_or_default(),
                ),
                stream_id: stream,
                stream_version: version.max(0) as u64,
                type_id: type_id.clone(),
                schema_version: row.get(5).unwrap_or(0),
                timestamp_ms: row.get(6).unwrap_or(0),
                correlation_id: row.get(7).ok().flatten(),
                causation_id: row.get(8).ok().flatten(),
                payload,
            };
            if let Some(p) = check(&event) {
                problem(p);
            }
        }
    }
    report.streams = versions.len() as u64;
    Ok(report)
}
