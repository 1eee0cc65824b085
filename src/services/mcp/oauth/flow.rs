//! One authorization: the client registered (pre-registration, a Client ID Metadata Document
//! or dynamic registration), the authorization code asked for with PKCE (S256), a `state`
//! and the `resource` parameter (RFC 8707), the browser step handed to the host while a
//! loopback listener waits for the redirect, the `iss` checked (RFC 9207), and the code
//! exchanged; and the refresh of a token.

use super::discovery::{AuthServer, Resource};
use super::fetch::{encode, fetch, form, query_pairs};
use super::store::{Client, Tokens};
use crate::cancel::CancelToken;
use crate::http::Resolver;
use serde_json::{json, Value};
use sha2::Digest;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The host's part: shows the user the authorization page at the URL it is given.
pub(crate) type Open = Box<dyn FnOnce(&str) -> Result<(), String> + Send>;

/// What the flow needs from its server's settings.
pub(crate) struct Settings<'a> {
    pub client_id: Option<&'a str>,
    pub client_secret: Option<String>,
    pub client_metadata_url: Option<&'a str>,
    pub authorize_timeout: Duration,
}

/// Kernel randomness, base64url without padding: a PKCE verifier or a `state`.
fn random_token() -> Result<String, String> {
    let mut b = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| format!("no randomness for PKCE: {e}"))?;
    Ok(base64url(&b))
}

fn base64url(b: &[u8]) -> String {
    crate::text::base64(b)
        .trim_end_matches('=')
        .replace('+', "-")
        .replace('/', "_")
}

/// The registered client for `auth`: the configured one, a metadata document's URL when the
/// server accepts them, or one registered now (RFC 7591).
///
/// # Errors
/// No way to have a client id, or a registration refused.
pub(crate) fn register(
    resolver: &Resolver,
    auth: &AuthServer,
    settings: &Settings<'_>,
    redirect_uri: &str,
    cancel: &CancelToken,
) -> Result<Client, String> {
    if let Some(id) = settings.client_id {
        let secret = settings.client_secret.clone();
        let supports =
            |m: &str| auth.auth_methods.is_empty() || auth.auth_methods.iter().any(|x| x == m);
        let auth_method = match &secret {
            None => "none",
            Some(_) if supports("client_secret_basic") => "client_secret_basic",
            Some(_) if auth.auth_methods.iter().any(|x| x == "client_secret_post") => {
                "client_secret_post"
            }
            Some(_) => "client_secret_basic",
        };
        return Ok(Client {
            issuer: auth.issuer.clone(),
            client_id: id.to_owned(),
            client_secret: secret,
            auth_method: auth_method.to_owned(),
        });
    }
    if let Some(url) = settings
        .client_metadata_url
        .filter(|_| auth.client_id_metadata_documents)
    {
        return Ok(Client {
            issuer: auth.issuer.clone(),
            client_id: url.to_owned(),
            client_secret: None,
            auth_method: "none".into(),
        });
    }
    let Some(endpoint) = &auth.registration_endpoint else {
        return Err(
            "the authorization server offers no dynamic registration and accepts no client \
             metadata document: register a client with it and set oauth.client_id"
                .into(),
        );
    };
    let method = if auth.auth_methods.is_empty() || auth.auth_methods.iter().any(|m| m == "none") {
        "none"
    } else {
        auth.auth_methods[0].as_str()
    };
    let body = json!({
        "client_name": "correx",
        "redirect_uris": [redirect_uri],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": method,
        "application_type": "native",
    })
    .to_string();
    let f = fetch(
        resolver,
        "POST",
        endpoint,
        &[
            ("Content-Type", "application/json"),
            ("Accept", "application/json"),
        ],
        body.as_bytes(),
        cancel,
    )
    .map_err(|e| format!("client registration: {e}"))?;
    let v: Value = serde_json::from_slice(&f.body).unwrap_or(Value::Null);
    if !(200..300).contains(&f.status) {
        return Err(format!(
            "client registration refused: HTTP {}{}",
            f.status,
            said(&v)
        ));
    }
    let client_id = v["client_id"]
        .as_str()
        .ok_or("client registration answered no client_id")?;
    Ok(Client {
        issuer: auth.issuer.clone(),
        client_id: client_id.to_owned(),
        client_secret: v["client_secret"].as_str().map(str::to_owned),
        auth_method: v["token_endpoint_auth_method"]
            .as_str()
            .unwrap_or(method)
            .to_owned(),
    })
}

/// An OAuth error answer's `error` and `error_description`, for a message (never a token).
fn said(v: &Value) -> String {
    match (v["error"].as_str(), v["error_description"].as_str()) {
        (Some(e), Some(d)) => format!(" ({e}: {})", crate::text::prefix(d, 200)),
        (Some(e), None) => format!(" ({e})"),
        _ => String::new(),
    }
}

/// The loopback listener the authorization server redirects the browser to.
pub(crate) struct Redirect {
    listener: TcpListener,
    pub uri: String,
}

impl Redirect {
    /// A listener on a free loopback port.
    ///
    /// # Errors
    /// No port could be had.
    pub fn listen() -> Result<Redirect, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| format!("no loopback port for the authorization's redirect: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        Ok(Redirect {
            listener,
            uri: format!("http://127.0.0.1:{port}/callback"),
        })
    }

    /// The redirect's query pairs, once the browser comes back; other requests (a favicon)
    /// are answered 404 and waited past.
    fn wait(
        &self,
        until: Instant,
        state: &str,
        opened: &std::sync::mpsc::Receiver<Result<(), String>>,
        cancel: &CancelToken,
    ) -> Result<Vec<(String, String)>, String> {
        while Instant::now() < until {
            if cancel.is_cancelled() {
                return Err("cancelled while waiting for the authorization".into());
            }
            if let Ok(Err(e)) = opened.try_recv() {
                return Err(format!(
                    "the host could not show the authorization page: {e}"
                ));
            }
            match self.listener.accept() {
                // A request without this flow's state (another page, another process) is
                // answered 400 and waited past: it cannot end the login.
                Ok((stream, _)) => {
                    if let Some(pairs) = answer(stream, state) {
                        return Ok(pairs);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(format!("the redirect listener failed: {e}")),
            }
        }
        Err("the authorization was not completed in time (no redirect came back)".into())
    }
}

/// Reads one request; the callback's query pairs when they carry `state`, answered with a
/// page saying so.
fn answer(stream: TcpStream, state: &str) -> Option<Vec<(String, String)>> {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let mut out = stream.try_clone().ok()?;
    let mut r = BufReader::new(stream.take(16 * 1024));
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let target = line.split(' ').nth(1).unwrap_or("");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let pairs = query_pairs(query);
    let ok = line.starts_with("GET ")
        && path == "/callback"
        && pairs.iter().any(|(k, v)| k == "state" && v == state);
    let page = if ok {
        "correx: the authorization came back; you may close this window."
    } else {
        "not this authorization's callback"
    };
    let status = if ok { "200 OK" } else { "400 Bad Request" };
    let _ = write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
        page.len()
    );
    ok.then_some(pairs)
}

/// Runs the authorization-code flow for `client` and `scope`: `open` hands the URL to the
/// host (its browser); the code that comes back is exchanged for tokens.
///
/// # Errors
/// What failed, in words: a server without S256, the host's refusal, a timeout, a state or
/// issuer that does not match, a refused exchange.
#[allow(clippy::too_many_arguments)]
pub(crate) fn authorize(
    resolver: &Resolver,
    resource: &Resource,
    auth: &AuthServer,
    client: &Client,
    redirect: &Redirect,
    scope: Option<&str>,
    settings: &Settings<'_>,
    open: Open,
    cancel: &CancelToken,
) -> Result<Tokens, String> {
    if !auth.code_challenge_methods.iter().any(|m| m == "S256") {
        return Err("the authorization server does not offer PKCE with S256 \
             (code_challenge_methods_supported): refused, as the MCP specification requires"
            .into());
    }
    // The URL goes to the host's browser: a web page's, nothing else (no file:, no custom
    // scheme, no control characters a metadata document could smuggle in).
    let endpoint = &auth.authorization_endpoint;
    if !(endpoint.starts_with("https://") || endpoint.starts_with("http://"))
        || endpoint
            .chars()
            .any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(format!(
            "the authorization server's authorization_endpoint {:?} is not a web page's URL: \
             refused",
            crate::text::prefix(endpoint, 200)
        ));
    }
    let verifier = random_token()?;
    let state = random_token()?;
    let challenge = base64url(&sha2::Sha256::digest(verifier.as_bytes()));
    let mut pairs = vec![
        ("response_type", "code"),
        ("client_id", client.client_id.as_str()),
        ("redirect_uri", redirect.uri.as_str()),
        ("code_challenge", challenge.as_str()),
        ("code_challenge_method", "S256"),
        ("state", state.as_str()),
        ("resource", resource.resource.as_str()),
    ];
    if let Some(s) = scope.filter(|s| !s.is_empty()) {
        pairs.push(("scope", s));
    }
    let sep = if auth.authorization_endpoint.contains('?') {
        '&'
    } else {
        '?'
    };
    let url = format!("{}{sep}{}", auth.authorization_endpoint, form(&pairs));
    // The host's part runs on a thread of its own while the redirect is waited for here: a
    // host that loads the page itself (as a test's browser does) comes back to the listener
    // before it returns.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("correx-oauth-open".into())
        .spawn(move || {
            let _ = tx.send(open(&url));
        })
        .map_err(|e| format!("no thread to hand the authorization to the host: {e}"))?;
    let back = redirect.wait(
        Instant::now() + settings.authorize_timeout,
        &state,
        &rx,
        cancel,
    )?;
    let get = |k: &str| back.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    match get("iss") {
        Some(iss) if iss != auth.issuer => {
            return Err(format!(
                "the authorization came back from issuer {iss:?}, not {:?}: refused (RFC 9207)",
                auth.issuer
            ))
        }
        None if auth.iss_parameter_supported => {
            return Err(
                "the authorization came back without the iss its server promises: refused \
                 (RFC 9207)"
                    .into(),
            )
        }
        _ => {}
    }
    if let Some(e) = get("error") {
        return Err(format!(
            "the authorization was refused: {e}{}",
            get("error_description")
                .map(|d| format!(": {}", crate::text::prefix(d, 200)))
                .unwrap_or_default()
        ));
    }
    let code = get("code").ok_or("the authorization came back without a code")?;
    let grant = [
        ("grant_type", "authorization_code"),
        ("code", code),
        ("redirect_uri", redirect.uri.as_str()),
        ("code_verifier", verifier.as_str()),
        ("resource", resource.resource.as_str()),
    ];
    token_request(
        resolver,
        auth,
        client,
        &grant,
        scope.unwrap_or(""),
        None,
        cancel,
    )
}

/// Refreshes `tokens` (the refresh token kept when the server sends no new one).
///
/// # Errors
/// No refresh token, or the server refused.
pub(crate) fn refresh(
    resolver: &Resolver,
    auth: &AuthServer,
    client: &Client,
    resource: &str,
    tokens: &Tokens,
    cancel: &CancelToken,
) -> Result<Tokens, String> {
    let rt = tokens.refresh_token.as_deref().ok_or("no refresh token")?;
    let grant = [
        ("grant_type", "refresh_token"),
        ("refresh_token", rt),
        ("resource", resource),
    ];
    token_request(
        resolver,
        auth,
        client,
        &grant,
        &tokens.scope,
        Some(rt),
        cancel,
    )
}

fn token_request(
    resolver: &Resolver,
    auth: &AuthServer,
    client: &Client,
    grant: &[(&str, &str)],
    scope: &str,
    old_refresh: Option<&str>,
    cancel: &CancelToken,
) -> Result<Tokens, String> {
    let mut pairs = grant.to_vec();
    let mut basic = None;
    match (client.auth_method.as_str(), &client.client_secret) {
        ("client_secret_basic", Some(secret)) => {
            let pair = format!("{}:{}", encode(&client.client_id), encode(secret));
            basic = Some(format!("Basic {}", crate::text::base64(pair.as_bytes())));
        }
        ("client_secret_post", Some(secret)) => {
            pairs.push(("client_id", &client.client_id));
            pairs.push(("client_secret", secret));
        }
        _ => pairs.push(("client_id", &client.client_id)),
    }
    let body = form(&pairs);
    let mut headers = vec![
        ("Content-Type", "application/x-www-form-urlencoded"),
        ("Accept", "application/json"),
    ];
    if let Some(b) = &basic {
        headers.push(("Authorization", b));
    }
    let f = fetch(
        resolver,
        "POST",
        &auth.token_endpoint,
        &headers,
        body.as_bytes(),
        cancel,
    )
    .map_err(|e| format!("the token request: {e}"))?;
    let v: Value = serde_json::from_slice(&f.body).unwrap_or(Value::Null);
    if f.status != 200 {
        return Err(format!(
            "the token request was refused: HTTP {}{}",
            f.status,
            said(&v)
        ));
    }
    let access = v["access_token"]
        .as_str()
        .filter(|t| !t.is_empty())
        .ok_or("the token answer has no access_token")?;
    if !v["token_type"]
        .as_str()
        .is_some_and(|t| t.eq_ignore_ascii_case("bearer"))
    {
        return Err("the token answer's token_type is not Bearer (only Bearer is spoken)".into());
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Ok(Tokens {
        access_token: access.to_owned(),
        refresh_token: v["refresh_token"]
            .as_str()
            .map(str::to_owned)
            .or_else(|| old_refresh.map(str::to_owned)),
        expires_at: v["expires_in"].as_u64().map(|s| now.saturating_add(s)),
        scope: v["scope"].as_str().unwrap_or(scope).to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_callback_without_the_flows_state_is_refused_and_waited_past() {
        let redirect = Redirect::listen().expect("a listener");
        let port = redirect
            .uri
            .split(':')
            .nth(2)
            .and_then(|p| p.split('/').next());
        let addr = format!("127.0.0.1:{}", port.expect("a port"));
        let get = |query: &str| {
            let mut s = TcpStream::connect(&addr).expect("connects");
            write!(s, "GET /callback?{query} HTTP/1.1\r\nHost: x\r\n\r\n").expect("sent");
            s
        };
        let read = |mut s: TcpStream| {
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            out
        };
        let (_tx, rx) = std::sync::mpsc::channel();
        let forged = get("code=evil&state=guess");
        let real = get("code=good&state=s3cret");
        let until = Instant::now() + Duration::from_secs(10);
        let pairs = redirect
            .wait(until, "s3cret", &rx, &CancelToken::new())
            .expect("the real callback");
        assert!(pairs.contains(&("code".into(), "good".into())), "{pairs:?}");
        assert!(read(forged).starts_with("HTTP/1.1 400"));
        assert!(read(real).starts_with("HTTP/1.1 200"));
    }

    #[test]
    fn pkce_s256_matches_rfc_7636_appendix_b() {
        let verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
        assert_eq!(
            base64url(&sha2::Sha256::digest(verifier.as_bytes())),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
        let a = random_token().expect("randomness");
        assert_eq!(a.len(), 43);
        assert_ne!(a, random_token().expect("randomness"));
    }
}
