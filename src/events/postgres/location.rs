//! Where the log is: a `postgres://` (or `postgresql://`) URL, with the password found the way
//! libpq finds it (`PGPASSWORD`, then a password file), never in the URL, so it never reaches
//! the log, a config event or an error message.

use crate::events::{EventStoreError, Result};
use postgres::config::Host;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

/// Where libpq builds put their socket by default (Debian's, and upstream's).
const DEFAULT_SOCKET_DIRS: [&str; 3] = ["/var/run/postgresql", "/run/postgresql", "/tmp"];

/// How long a connection attempt may take before it fails.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether `location` names a PostgreSQL log rather than a file.
pub fn is_postgres_url(location: &str) -> bool {
    location.starts_with("postgres://") || location.starts_with("postgresql://")
}

/// A parsed location: the client's config (password included) and how to show it.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) config: postgres::Config,
    /// `postgres://user@host:port/db`: for messages, never with a password.
    pub(crate) shown: String,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

impl Target {
    /// Parses `url` and finds its password.
    ///
    /// # Errors
    /// [`EventStoreError::InvalidLocation`] for a URL the client cannot parse (its text is not
    /// repeated, as it may hold a password), one that holds a password, or one without a user
    /// when the environment names none.
    pub(crate) fn parse(url: &str) -> Result<Target> {
        let invalid = |location: String, detail: String| EventStoreError::InvalidLocation {
            location,
            detail,
        };
        let mut config = postgres::Config::from_str(url).map_err(|e| {
            invalid(
                "postgres://…".into(),
                format!("not a PostgreSQL URL the client can read: {e}"),
            )
        })?;
        // Before anything is shown: with an unencoded `@` in the password, part of it would
        // be read as the host.
        let host_has_at = config.get_hosts().iter().any(|h| match h {
            Host::Tcp(h) => h.contains('@'),
            Host::Unix(p) => p.to_string_lossy().contains('@'),
        });
        if config.get_password().is_some() || host_has_at {
            return Err(invalid(
                "postgres://…".into(),
                "the URL holds a password; put it in PGPASSWORD or a password file (PGPASSFILE, \
                 ~/.pgpass) instead, so it is never written to the log, a config event or an \
                 error"
                    .into(),
            ));
        }
        if config.get_user().is_none() {
            match std::env::var("PGUSER")
                .ok()
                .or_else(|| std::env::var("USER").ok())
                .filter(|u| !u.is_empty())
            {
                Some(user) => {
                    config.user(&user);
                }
                None => {
                    return Err(invalid(
                        shown(&config),
                        "no user: name one in the URL (postgres://USER@HOST/DB) or PGUSER".into(),
                    ))
                }
            }
        }
        let shown = shown(&config);
        if let Some(password) = find_password(&config) {
            config.password(password);
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        // A peer that vanished (a partition, a dead host) is noticed in about a minute, not
        // after the system's two hours.
        config.keepalives_idle(Duration::from_secs(30));
        config.application_name("correx");
        Ok(Target { config, shown })
    }

    /// A new connection.
    ///
    /// # Errors
    /// [`EventStoreError::Connect`] with the server's or the client's reason.
    pub(crate) fn connect(&self) -> Result<postgres::Client> {
        self.config.connect(postgres::NoTls).map_err(|e| {
            let code = e.code().map(|c| c.code().to_owned());
            // Unreachable (an I/O error, a timeout) or full (53300) may pass later; a
            // refusal or a client-side configuration error (no password) will not.
            let io = std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>());
            let transient = match code.as_deref() {
                Some(c) => c.starts_with("53") || c.starts_with("57") || c.starts_with("08"),
                None => io || e.to_string().contains("timed out"),
            };
            EventStoreError::Connect {
                target: self.shown.clone(),
                detail: crate::events::postgres::describe(&e),
                code,
                transient,
            }
        })
    }
}

fn shown(config: &postgres::Config) -> String {
    let user = config.get_user().unwrap_or("");
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config.get_dbname().unwrap_or(user);
    format!("postgres://{user}@{host}:{port}/{db}")
}

/// The password libpq would use: `PGPASSWORD`, else the first matching line of the password
/// file (`PGPASSFILE`, else `~/.pgpass`), which, as libpq does, is ignored when others may read
/// it.
fn find_password(config: &postgres::Config) -> Option<String> {
    // An empty PGPASSWORD falls through to the file, as in libpq.
    if let Some(p) = std::env::var("PGPASSWORD").ok().filter(|p| !p.is_empty()) {
        return Some(p);
    }
    let file = std::env::var_os("PGPASSFILE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pgpass")))?;
    let text = read_private(&file)?;
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        // libpq matches a socket connection as `localhost`.
        // libpq matches a socket in the default directory as `localhost`, another by its
        // path.
        Some(Host::Unix(dir)) if !DEFAULT_SOCKET_DIRS.iter().any(|d| dir == Path::new(d)) => {
            dir.display().to_string()
        }
        Some(Host::Unix(_)) | None => "localhost".into(),
    };
    let port = config
        .get_ports()
        .first()
        .copied()
        .unwrap_or(5432)
        .to_string();
    let user = config.get_user().unwrap_or("");
    let db = config.get_dbname().unwrap_or(user);
    password_from_file(&text, [&host, &port, db, user])
}

fn read_private(file: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(file).ok()?;
    if !meta.is_file() {
        return None;
    }
    if meta.permissions().mode() & 0o077 != 0 {
        log::warn!(
            "password file {} has group or world access; ignored (chmod 0600 it)",
            file.display()
        );
        return None;
    }
    std::fs::read_to_string(file).ok()
}

/// The password of the first line of a libpq password file matching `want` (host, port,
/// database, user): `hostname:port:database:username:password`, an unescaped `*` matching
/// anything, `\` escaping `:`, `\` and `*`, `#` starting a comment line; as in libpq the
/// password ends at the next unescaped `:`.
pub(crate) fn password_from_file(text: &str, want: [&str; 4]) -> Option<String> {
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields = split_fields(line);
        if fields.len() < 5 {
            continue;
        }
        let matches = fields[..4]
            .iter()
            .zip(want)
            .all(|((field, wildcard), want)| *wildcard || field == want);
        if matches {
            return Some(fields[4].0.clone());
        }
    }
    None
}

/// A line's fields, unescaped, each with whether it is the wildcard `*` (unescaped).
fn split_fields(line: &str) -> Vec<(String, bool)> {
    let mut fields = Vec::new();
    let (mut field, mut escaped_any) = (String::new(), false);
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next() {
                    field.push(next);
                    escaped_any = true;
                }
            }
            ':' => {
                let wildcard = field == "*" && !escaped_any;
                fields.push((std::mem::take(&mut field), wildcard));
                escaped_any = false;
            }
            c => field.push(c),
        }
    }
    let wildcard = field == "*" && !escaped_any;
    fields.push((field, wildcard));
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn password_file_lines_match_like_libpq() {
        let text = "# comment\n\
                    db.example:5432:other:alice:nope\n\
                    127.0.0.1:5433:*:alice:pa\\:ss\\\\word\n\
                    *:*:*:*:fallback\n";
        // An escaped `*` is a literal star; the password ends at an unescaped `:`.
        let stars = "h:1:\\*:u:literal\nh:1:*:u:pa:ss\n";
        for (text, want, found) in [
            (
                text,
                ["127.0.0.1", "5433", "correx", "alice"],
                Some("pa:ss\\word"),
            ),
            (
                text,
                ["127.0.0.1", "5432", "correx", "bob"],
                Some("fallback"),
            ),
            ("a:b:c\n", ["a", "b", "c", "d"], None),
            (stars, ["h", "1", "*", "u"], Some("literal")),
            (stars, ["h", "1", "db", "u"], Some("pa")),
        ] {
            assert_eq!(password_from_file(text, want).as_deref(), found, "{want:?}");
        }
    }

    /// The password file is ignored when others may read it (another user could have read
    /// the password; libpq refuses it too), whoever runs the store.
    #[test]
    fn a_password_file_others_can_read_is_ignored() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("correx-pgpass-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("pgpass");
        std::fs::write(&file, "*:*:*:*:secret\n").expect("write");
        for (mode, read) in [(0o600, true), (0o640, false), (0o604, false), (0o400, true)] {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).expect("chmod");
            assert_eq!(read_private(&file).is_some(), read, "mode {mode:o}");
        }
        assert!(
            read_private(&dir).is_none(),
            "a directory is not a password file"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_password_in_the_url_is_refused_and_never_shown() {
        let e = Target::parse("postgres://alice:s3cret@127.0.0.1:5432/log").unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(e, EventStoreError::InvalidLocation { .. }),
            "{e:?}"
        );
        assert!(!text.contains("s3cret"), "{text}");
        assert!(text.contains("PGPASSWORD"), "{text}");
        let e = Target::parse("postgres://alice:s3cret@[::1:5432/log").unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
        let e = Target::parse("postgres://alice:p@ssw0rd@db/log").unwrap_err();
        assert!(!e.to_string().contains("ssw0rd"), "{e}");
    }
}
