//! OAuth 2.1 for remote MCP servers, as the MCP specification's authorization section asks of
//! a client: a server answering 401 with a `Bearer` challenge is authorized — its
//! protected-resource metadata, its authorization server's metadata, a client registration,
//! the authorization code with PKCE and the `resource` parameter (the browser step is the
//! host's, [`McpAuthorizer`]; correx listens on loopback for the redirect) — and its token sent
//! with every request. A token is refreshed before it expires and when the server rejects it,
//! one refresh at a time per server, the rotated refresh token saved before the new access
//! token is used; a 403 `insufficient_scope` asks again for the union of the scopes (a bounded
//! number of times). Tokens live in a 0600 file ([`store`]) and never reach the log, an error
//! or a config event. Every request of the flow goes through the server's network policy.

mod discovery;
mod fetch;
mod flow;
mod store;

use crate::cancel::CancelToken;
use crate::http::Resolver;
use parking_lot::{Mutex, RwLock};
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(crate) use discovery::Challenge;
use store::{Saved, TokenFile};

/// A token this close to its expiry is refreshed before it is used.
const REFRESH_MARGIN: u64 = 60;

/// The host's part of an authorization: showing the user the authorization server's page.
pub trait McpAuthorizer: Send + Sync {
    /// Opens `url` (the authorization server's page) for the user, typically in a browser,
    /// for the remote server `server`; returns once it was handed on, not when the user is
    /// done (correx waits for the redirect on loopback, up to `oauth.authorize_timeout_ms`).
    ///
    /// # Errors
    /// Why it could not be shown; the call that needed it fails with this reason.
    fn open(&self, server: &str, url: &str) -> Result<(), String>;
}

/// Where the host's authorizer is registered, shared by every server of a runtime.
#[derive(Clone, Default)]
pub(crate) struct AuthorizerSlot(Arc<RwLock<Option<Arc<dyn McpAuthorizer>>>>);

impl AuthorizerSlot {
    pub fn set(&self, authorizer: Option<Arc<dyn McpAuthorizer>>) {
        let old = std::mem::replace(&mut *self.0.write(), authorizer);
        drop(old);
    }

    fn get(&self) -> Option<Arc<dyn McpAuthorizer>> {
        self.0.read().clone()
    }
}

/// How correx authorizes to a remote server that asks for OAuth
/// (`mcp_servers.<name>.oauth`); every field optional.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpOAuthConfig {
    /// A client id registered with the authorization server beforehand (else a Client ID
    /// Metadata Document, else dynamic registration).
    pub client_id: Option<String>,
    /// The environment variable holding that client's secret (the secret itself is never
    /// in the config).
    pub client_secret_env: Option<String>,
    /// The URL of this client's Client ID Metadata Document, used as its client id by
    /// authorization servers that accept them.
    pub client_metadata_url: Option<String>,
    /// Scopes asked for when neither the server's challenge nor its metadata names any.
    pub scopes: Vec<String>,
    /// Where the registration and tokens are kept (mode 0600, in a directory only this user
    /// can enter, made 0700 if missing); default
    /// `$XDG_STATE_HOME/correx/mcp-oauth/<digest of the url>.json`
    /// (`~/.local/state/...`).
    pub token_file: Option<PathBuf>,
    /// How long the user has for the browser step; default 300 s.
    #[serde(rename = "authorize_timeout_ms", with = "crate::settings::millis")]
    pub authorize_timeout: Duration,
}

impl Default for McpOAuthConfig {
    fn default() -> Self {
        McpOAuthConfig {
            client_id: None,
            client_secret_env: None,
            client_metadata_url: None,
            scopes: Vec::new(),
            token_file: None,
            authorize_timeout: Duration::from_secs(300),
        }
    }
}

impl McpOAuthConfig {
    /// Checks the fields that can be checked before a flow runs.
    ///
    /// # Errors
    /// The field that cannot be used, and why.
    pub fn validate(&self) -> Result<(), crate::settings::ConfigError> {
        use crate::settings::check;
        check(
            self.client_id.as_ref().is_none_or(|c| !c.is_empty()),
            "client_id",
            "must not be empty",
        )?;
        check(
            self.client_secret_env.is_none() || self.client_id.is_some(),
            "client_secret_env",
            "is a pre-registered client's: set client_id too",
        )?;
        check(
            self.client_metadata_url
                .as_ref()
                .is_none_or(|u| u.starts_with("https://") && !u.contains(['#', ' '])),
            "client_metadata_url",
            "must be an https:// URL (a Client ID Metadata Document's)",
        )?;
        check(
            self.scopes
                .iter()
                .all(|s| !s.is_empty() && !s.contains(char::is_whitespace)),
            "scopes",
            "each scope is one word",
        )?;
        if let Some(p) = &self.token_file {
            check(p.is_absolute(), "token_file", "must be an absolute path")?;
        }
        crate::settings::positive_ms("authorize_timeout_ms", self.authorize_timeout)
    }
}

/// The authorizations asked for one request at most (a server answering 403 for ever is
/// not asked again and again).
pub(crate) const MAX_AUTHORIZATIONS: u32 = 3;

/// One server's OAuth state, shared by its connections.
pub(crate) struct OAuth {
    name: String,
    url: String,
    config: McpOAuthConfig,
    resolver: Resolver,
    authorizer: AuthorizerSlot,
    file: Option<TokenFile>,
    /// What is known (loaded from the file at first use); held across a refresh or an
    /// authorization, so only one runs at a time.
    saved: Mutex<Option<Saved>>,
    /// What discovery found, for refreshes.
    found: Mutex<Option<(discovery::Resource, discovery::AuthServer)>>,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl OAuth {
    /// Server `name` at `url`, its flow's requests through `resolver`.
    pub fn new(
        name: &str,
        url: &str,
        config: McpOAuthConfig,
        resolver: Resolver,
        authorizer: AuthorizerSlot,
    ) -> OAuth {
        let file = config
            .token_file
            .clone()
            .or_else(|| TokenFile::default_for(url))
            .map(TokenFile::new);
        OAuth {
            name: name.to_owned(),
            url: url.to_owned(),
            config,
            resolver,
            authorizer,
            file,
            saved: Mutex::new(None),
            found: Mutex::new(None),
        }
    }

    fn loaded<'a>(&self, saved: &'a mut Option<Saved>) -> &'a mut Saved {
        saved.get_or_insert_with(|| {
            self.file
                .as_ref()
                .map(|f| f.load(&self.url))
                .unwrap_or_else(|| Saved {
                    server: self.url.clone(),
                    ..Saved::default()
                })
        })
    }

    fn store(&self, saved: &Saved) -> Result<(), String> {
        match &self.file {
            Some(f) => f.save(saved).map_err(|e| format!("the token file: {e}")),
            None => Ok(()),
        }
    }

    /// The `Authorization` value to send, if a token is held: refreshed first when it is
    /// about to expire (a failed refresh sends the old one; the server's 401 then asks for
    /// a new authorization).
    pub fn bearer(&self, cancel: &CancelToken) -> Option<String> {
        let mut guard = self.saved.lock();
        let saved = self.loaded(&mut guard);
        let tokens = saved.tokens.as_ref()?;
        let due = tokens
            .expires_at
            .is_some_and(|at| at <= now() + REFRESH_MARGIN);
        if due && tokens.refresh_token.is_some() {
            let _ = self.refresh_locked(saved, cancel);
        }
        saved
            .tokens
            .as_ref()
            .map(|t| format!("Bearer {}", t.access_token))
    }

    /// Refreshes the held token; the new one saved before it is used.
    fn refresh_locked(&self, saved: &mut Saved, cancel: &CancelToken) -> Result<(), String> {
        let (Some(client), Some(tokens)) = (saved.client.clone(), saved.tokens.clone()) else {
            return Err("nothing to refresh".into());
        };
        // Another process on the same file may have refreshed meanwhile, and a rotated
        // refresh token is good once: its tokens are taken instead.
        let disk = self.file.as_ref().map(|f| f.load(&self.url));
        if let Some(disk) = disk.filter(|d| {
            d.tokens.as_ref().is_some_and(|t| {
                t.access_token != tokens.access_token
                    && t.expires_at.is_none_or(|at| at > now() + REFRESH_MARGIN)
            })
        }) {
            *saved = disk;
            return Ok(());
        }
        // Taken out first: `discover` locks `found` itself.
        let cached = self.found.lock().clone();
        let found = match cached {
            Some(f) => f,
            None => self.discover(&Challenge::default(), cancel)?,
        };
        // A refresh token is only ever sent to the server that issued it: metadata that now
        // names another authorization server gets a new authorization instead.
        if found.1.issuer != client.issuer {
            return Err(format!(
                "the authorization server is now {:?}, not {:?} that issued the tokens: not \
                 refreshed there",
                found.1.issuer, client.issuer
            ));
        }
        let fresh = flow::refresh(
            &self.resolver,
            &found.1,
            &client,
            &found.0.resource,
            &tokens,
            cancel,
        );
        match fresh {
            Ok(t) => {
                saved.tokens = Some(t);
                self.store(saved)
            }
            Err(e) => {
                log::info!("mcp server {}: the token refresh failed: {e}", self.name);
                Err(e)
            }
        }
    }

    fn discover(
        &self,
        challenge: &Challenge,
        cancel: &CancelToken,
    ) -> Result<(discovery::Resource, discovery::AuthServer), String> {
        let resource = discovery::resource(&self.resolver, &self.url, challenge, cancel)?;
        let auth = discovery::auth_server(&self.resolver, &resource.authorization_server, cancel)?;
        let found = (resource, auth);
        *self.found.lock() = Some(found.clone());
        Ok(found)
    }

    /// The server refused the request with 401 (`sent` the `Authorization` it carried):
    /// unless another caller already renewed the token, it is refreshed, or, failing that,
    /// a new authorization runs.
    ///
    /// # Errors
    /// Why no token could be had.
    pub fn unauthorized(
        &self,
        challenge: &Challenge,
        sent: Option<&str>,
        cancel: &CancelToken,
    ) -> Result<(), String> {
        let mut guard = self.saved.lock();
        let saved = self.loaded(&mut guard);
        let held = saved
            .tokens
            .as_ref()
            .map(|t| format!("Bearer {}", t.access_token));
        if held.is_some() && held.as_deref() != sent {
            return Ok(());
        }
        if saved
            .tokens
            .as_ref()
            .is_some_and(|t| t.refresh_token.is_some())
            && self.refresh_locked(saved, cancel).is_ok()
        {
            return Ok(());
        }
        let scope = challenge.scope.clone();
        self.authorize_locked(saved, challenge, scope, cancel)
    }

    /// The server refused the request with 403 `insufficient_scope`: a new authorization for
    /// the union of the scopes held and those the challenge names.
    ///
    /// # Errors
    /// Why no token could be had.
    pub fn insufficient_scope(
        &self,
        challenge: &Challenge,
        sent: Option<&str>,
        cancel: &CancelToken,
    ) -> Result<(), String> {
        let mut guard = self.saved.lock();
        let saved = self.loaded(&mut guard);
        let held = saved
            .tokens
            .as_ref()
            .map(|t| format!("Bearer {}", t.access_token));
        if held.is_some() && held.as_deref() != sent {
            // Another caller already stepped up.
            return Ok(());
        }
        let mut scopes: Vec<String> = saved
            .tokens
            .as_ref()
            .map(|t| t.scope.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default();
        for s in challenge.scope.as_deref().unwrap_or("").split_whitespace() {
            if !scopes.iter().any(|x| x == s) {
                scopes.push(s.to_owned());
            }
        }
        let scope = Some(scopes.join(" ")).filter(|s| !s.is_empty());
        self.authorize_locked(saved, challenge, scope, cancel)
    }

    fn authorize_locked(
        &self,
        saved: &mut Saved,
        challenge: &Challenge,
        scope: Option<String>,
        cancel: &CancelToken,
    ) -> Result<(), String> {
        let authorizer = self.authorizer.get().ok_or(
            "the server asks for OAuth authorization, and the host registered no authorizer \
             to show the user its page (McpHub::set_authorizer; not yet offered from C or Java)",
        )?;
        let (resource, auth) = self.discover(challenge, cancel)?;
        // The challenge's scope, else all the server's metadata lists, else the config's.
        let scope = scope
            .or_else(|| Some(resource.scopes_supported.join(" ")))
            .filter(|s| !s.is_empty())
            .or_else(|| Some(self.config.scopes.join(" ")).filter(|s| !s.is_empty()));
        let secret =
            match &self.config.client_secret_env {
                Some(var) => Some(std::env::var(var).map_err(|_| {
                    format!("oauth.client_secret_env names {var}, which is not set")
                })?),
                None => None,
            };
        let settings = flow::Settings {
            client_id: self.config.client_id.as_deref(),
            client_secret: secret,
            client_metadata_url: self.config.client_metadata_url.as_deref(),
            authorize_timeout: self.config.authorize_timeout,
        };
        let redirect = flow::Redirect::listen()?;
        let client = match saved.client.clone().filter(|c| {
            c.issuer == auth.issuer
                && self
                    .config
                    .client_id
                    .as_ref()
                    .is_none_or(|id| *id == c.client_id)
        }) {
            Some(c) => c,
            None => {
                let c = flow::register(&self.resolver, &auth, &settings, &redirect.uri, cancel)?;
                saved.client = Some(c.clone());
                saved.tokens = None;
                self.store(saved)?;
                c
            }
        };
        let name = self.name.clone();
        let open = Box::new(move |url: &str| authorizer.open(&name, url));
        let tokens = flow::authorize(
            &self.resolver,
            &resource,
            &auth,
            &client,
            &redirect,
            scope.as_deref(),
            &settings,
            open,
            cancel,
        )?;
        saved.tokens = Some(tokens);
        self.store(saved)
    }
}
