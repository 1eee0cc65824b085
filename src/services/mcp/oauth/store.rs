//! Where a server's OAuth client registration and tokens are kept between runs: a JSON file
//! of mode 0600 in a 0700 directory, replaced whole (written beside it, then renamed), so a
//! crash leaves the old tokens or the new, never half of either.

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The client registered with an authorization server (its `Debug` hides the secret).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Client {
    pub issuer: String,
    pub client_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    /// `none`, `client_secret_basic` or `client_secret_post`.
    pub auth_method: String,
}

/// Tokens for one server (their `Debug` hides them).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Tokens {
    pub access_token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
    /// Unix seconds; `None` when the server gave no `expires_in`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    /// The scopes asked for (space-separated), for a step-up's union.
    #[serde(default)]
    pub scope: String,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
            .field(
                "client_secret",
                &self.client_secret.as_ref().map(|_| "<hidden>"),
            )
            .field("auth_method", &self.auth_method)
            .finish()
    }
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("access_token", &"<hidden>")
            .field(
                "refresh_token",
                &self.refresh_token.as_ref().map(|_| "<hidden>"),
            )
            .field("expires_at", &self.expires_at)
            .field("scope", &self.scope)
            .finish()
    }
}

/// What the file holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Saved {
    /// The server these are for: a file for another URL is not used.
    pub server: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<Client>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Tokens>,
}

/// A token file.
pub(crate) struct TokenFile {
    path: PathBuf,
}

impl TokenFile {
    /// The file at `path` (not read yet).
    pub fn new(path: PathBuf) -> TokenFile {
        TokenFile { path }
    }

    /// The default file of the server at `url`: under `$XDG_STATE_HOME/correx/mcp-oauth`
    /// (`~/.local/state/...`), named by a digest of the url.
    pub fn default_for(url: &str) -> Option<PathBuf> {
        use sha2::Digest;
        let base = std::env::var_os("XDG_STATE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))?;
        let digest = sha2::Sha256::digest(url.as_bytes());
        Some(
            base.join("correx/mcp-oauth")
                .join(format!("{}.json", crate::text::hex(&digest[..12]))),
        )
    }

    /// What the file holds for `server`; nothing when it is missing, unreadable, for another
    /// server, or not ours (a file others may read is not trusted, and is replaced).
    pub fn load(&self, server: &str) -> Saved {
        use std::os::unix::fs::MetadataExt;
        let fresh = Saved {
            server: server.to_owned(),
            ..Saved::default()
        };
        let Ok(meta) = std::fs::metadata(&self.path) else {
            return fresh;
        };
        if meta.mode() & 0o077 != 0 {
            log::warn!(
                "{}: readable by others; not used (it will be replaced)",
                self.path.display()
            );
            return fresh;
        }
        std::fs::read(&self.path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Saved>(&b).ok())
            .filter(|s| s.server == server)
            .unwrap_or(fresh)
    }

    /// Replaces the file with `saved`.
    ///
    /// # Errors
    /// The directory or file could not be written (the message names the path, never what
    /// it holds).
    pub fn save(&self, saved: &Saved) -> Result<(), String> {
        let fail = |e: std::io::Error| format!("{}: {e}", self.path.display());
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(fail)?;
        let tmp = self
            .path
            .with_extension(format!("tmp{}", std::process::id()));
        let body = serde_json::to_vec_pretty(saved).map_err(|e| e.to_string())?;
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| {
                f.write_all(&body)?;
                f.sync_all()
            })
            .and_then(|()| std::fs::rename(&tmp, &self.path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(fail(e));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn tokens_are_kept_0600_for_their_server_only() {
        let dir = std::env::temp_dir().join(format!("correx-tokens-{}", std::process::id()));
        let file = TokenFile::new(dir.join("sub/t.json"));
        let saved = Saved {
            server: "http://a/mcp".into(),
            client: None,
            tokens: Some(Tokens {
                access_token: "AT-9".into(),
                refresh_token: Some("RT-9".into()),
                expires_at: Some(5),
                scope: "s".into(),
            }),
        };
        file.save(&saved).expect("saved");
        let shown = format!("{saved:?}");
        assert!(
            !shown.contains("AT-9") && !shown.contains("RT-9"),
            "{shown}"
        );
        let mode = std::fs::metadata(dir.join("sub/t.json"))
            .expect("the file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(file.load("http://a/mcp"), saved);
        assert_eq!(file.load("http://b/mcp").tokens, None);
        std::fs::set_permissions(
            dir.join("sub/t.json"),
            std::fs::Permissions::from_mode(0o644),
        )
        .expect("chmod");
        assert_eq!(
            file.load("http://a/mcp").tokens,
            None,
            "a shared file is not trusted"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
