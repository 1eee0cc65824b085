//! Where a server's OAuth client registration and tokens are kept between runs: a JSON file
//! of mode 0600 in a directory only this user can enter, replaced whole (written beside it,
//! then renamed), so a crash leaves the old tokens or the new, never half of either. A file
//! or directory another user could have placed or changed is not trusted.

use serde::{Deserialize, Serialize};
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
    /// server, or not trusted: a symlink, another user's, open to others, or in a directory
    /// others can enter (it is replaced, or refused at [`TokenFile::save`]).
    pub fn load(&self, server: &str) -> Saved {
        let fresh = Saved {
            server: server.to_owned(),
            ..Saved::default()
        };
        match self.read_trusted() {
            Ok(Some(bytes)) => serde_json::from_slice::<Saved>(&bytes)
                .ok()
                .filter(|s| s.server == server)
                .unwrap_or(fresh),
            Ok(None) => fresh,
            Err(why) => {
                log::warn!("{}: {why}; not used", self.path.display());
                fresh
            }
        }
    }

    /// The file's bytes, if it exists and is trusted.
    fn read_trusted(&self) -> Result<Option<Vec<u8>>, String> {
        use std::io::Read;
        use std::os::unix::fs::MetadataExt;
        if let Some(dir) = self.path.parent().filter(|d| d.exists()) {
            crate::private_dir::check_private(dir).map_err(|e| e.to_string())?;
        }
        // Not followed: a link planted here could point at another file this user can read.
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&self.path);
        let mut f = match opened {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.to_string()),
        };
        let meta = f.metadata().map_err(|e| e.to_string())?;
        if !meta.is_file() {
            return Err("not a regular file".into());
        }
        if meta.uid() != crate::sys::uid() {
            return Err("it belongs to another user".into());
        }
        if meta.mode() & 0o077 != 0 {
            return Err("readable by others (it will be replaced)".into());
        }
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes).map_err(|e| e.to_string())?;
        Ok(Some(bytes))
    }

    /// Replaces the file with `saved`: written whole into a new file beside it (never through
    /// a link), then renamed over it.
    ///
    /// # Errors
    /// The directory could not be made, is open to others or not this user's, or the file
    /// could not be written (the message names the path, never what it holds).
    pub fn save(&self, saved: &Saved) -> Result<(), String> {
        let fail = |e: std::io::Error| format!("{}: {e}", self.path.display());
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(fail)?;
        crate::private_dir::check_private(dir).map_err(|e| e.to_string())?;
        let body = serde_json::to_vec_pretty(saved).map_err(|e| e.to_string())?;
        crate::private_dir::write_atomic(&self.path, &body).map_err(fail)
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

    fn sample(server: &str, token: &str) -> Saved {
        Saved {
            server: server.into(),
            client: None,
            tokens: Some(Tokens {
                access_token: token.into(),
                ..Tokens::default()
            }),
        }
    }

    /// An attacker who could write the token directory plants a link to a file of the user's
    /// (to have its tokens read from, or written over, something else).
    #[test]
    fn a_link_in_place_of_the_token_file_is_neither_read_nor_written_through() {
        let dir = std::env::temp_dir().join(format!("correx-tokens-link-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir.join("state"))
            .expect("dir");
        let target = dir.join("elsewhere.json");
        let planted = serde_json::to_vec(&sample("http://a/mcp", "PLANTED")).expect("json");
        std::fs::write(&target, &planted).expect("target");
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let path = dir.join("state/t.json");
        std::os::unix::fs::symlink(&target, &path).expect("symlink");
        let file = TokenFile::new(path.clone());
        assert_eq!(
            file.load("http://a/mcp").tokens,
            None,
            "read through a link"
        );
        file.save(&sample("http://a/mcp", "MINE")).expect("saved");
        assert_eq!(
            std::fs::read(&target).expect("target"),
            planted,
            "written through a link"
        );
        assert!(!std::fs::symlink_metadata(&path).expect("file").is_symlink());
        assert_eq!(file.load("http://a/mcp"), sample("http://a/mcp", "MINE"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A token directory others can enter (made so before correx first used it) is refused:
    /// whoever can write it could swap the file.
    #[test]
    fn a_token_directory_open_to_others_is_refused() {
        let dir = std::env::temp_dir().join(format!("correx-tokens-open-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let file = TokenFile::new(dir.join("t.json"));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        file.save(&sample("http://a/mcp", "MINE")).expect("saved");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        assert_eq!(
            file.load("http://a/mcp").tokens,
            None,
            "used from an open directory"
        );
        let e = file
            .save(&sample("http://a/mcp", "NEXT"))
            .expect_err("saved into an open directory");
        assert!(e.contains("readable or writable by others"), "{e}");
        assert!(!e.contains("NEXT"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
