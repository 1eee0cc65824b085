//! Finding who authorizes a server: its `WWW-Authenticate` challenge, its protected-resource
//! metadata (RFC 9728) and its authorization server's metadata (RFC 8414, or OpenID Connect
//! discovery), at the well-known places the MCP specification lists, in its order.

use super::fetch::{fetch, Url};
use crate::cancel::CancelToken;
use crate::http::Resolver;
use serde_json::Value;

/// A `Bearer` challenge's parameters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Challenge {
    pub resource_metadata: Option<String>,
    pub scope: Option<String>,
    pub error: Option<String>,
}

impl Challenge {
    /// The `Bearer` challenge of a `WWW-Authenticate` value (`None` without one).
    pub fn parse(header: &str) -> Option<Challenge> {
        let rest = header.trim();
        let rest = rest
            .get(..6)
            .filter(|s| s.eq_ignore_ascii_case("bearer"))
            .map(|_| &rest[6..])?;
        let mut c = Challenge::default();
        for (k, v) in params(rest) {
            match k.to_ascii_lowercase().as_str() {
                "resource_metadata" => c.resource_metadata = Some(v),
                "scope" => c.scope = Some(v),
                "error" => c.error = Some(v),
                _ => {}
            }
        }
        Some(c)
    }
}

/// `k=v` and `k="v"` pairs, comma-separated (RFC 9110 auth-params); a bare token is skipped.
/// Every turn of the loop moves past at least one character.
fn params(s: &str) -> Vec<(String, String)> {
    let b: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        while i < b.len() && (b[i] == ',' || b[i].is_whitespace()) {
            i += 1;
        }
        let start = i;
        while i < b.len() && b[i] != '=' && b[i] != ',' {
            i += 1;
        }
        let key = b[start..i].iter().collect::<String>().trim().to_owned();
        if i >= b.len() || b[i] != '=' {
            i += 1;
            continue;
        }
        i += 1;
        while i < b.len() && b[i] == ' ' {
            i += 1;
        }
        let mut value = String::new();
        if i < b.len() && b[i] == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' && i + 1 < b.len() {
                    i += 1;
                }
                value.push(b[i]);
                i += 1;
            }
            i += 1;
        } else {
            let from = i;
            while i < b.len() && b[i] != ',' {
                i += 1;
            }
            value = b[from..i].iter().collect::<String>().trim().to_owned();
        }
        if !key.is_empty() {
            out.push((key, value));
        }
    }
    out
}

/// What the server's protected-resource metadata says.
#[derive(Clone, Debug)]
pub(crate) struct Resource {
    /// Its identifier, exactly as published: the `resource` parameter sent.
    pub resource: String,
    pub authorization_server: String,
    pub scopes_supported: Vec<String>,
}

/// The server's protected-resource metadata: at the challenge's `resource_metadata`, else at
/// the path-based then the root well-known URI of `server`.
///
/// # Errors
/// No document found, one that is not JSON, or one for another resource or without an
/// authorization server.
pub(crate) fn resource(
    resolver: &Resolver,
    server: &str,
    challenge: &Challenge,
    cancel: &CancelToken,
) -> Result<Resource, String> {
    let u = Url::parse(server).ok_or("the server's url is not http://")?;
    let mut candidates = Vec::new();
    if let Some(m) = &challenge.resource_metadata {
        candidates.push(m.clone());
    } else {
        if !u.bare_path().is_empty() {
            candidates.push(format!(
                "{}/.well-known/oauth-protected-resource{}",
                u.origin,
                u.bare_path()
            ));
        }
        candidates.push(format!("{}/.well-known/oauth-protected-resource", u.origin));
    }
    let doc = first_json(resolver, &candidates, cancel)
        .map_err(|e| format!("its protected-resource metadata: {e}"))?;
    let resource = doc["resource"]
        .as_str()
        .ok_or("its protected-resource metadata names no resource")?
        .to_owned();
    // RFC 9728 §3.3: metadata for another resource is not this server's.
    let ours = server.split('?').next().unwrap_or(server);
    if !(ours == resource || ours.starts_with(&format!("{}/", resource.trim_end_matches('/')))) {
        return Err(format!(
            "its protected-resource metadata is for {resource:?}, not for {ours:?}: refused"
        ));
    }
    let authorization_server = doc["authorization_servers"][0]
        .as_str()
        .ok_or("its protected-resource metadata names no authorization server")?
        .to_owned();
    Ok(Resource {
        resource,
        authorization_server,
        scopes_supported: strings(&doc["scopes_supported"]),
    })
}

/// What an authorization server's metadata says.
#[derive(Clone, Debug, Default)]
pub(crate) struct AuthServer {
    pub issuer: String,
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    pub registration_endpoint: Option<String>,
    pub code_challenge_methods: Vec<String>,
    pub auth_methods: Vec<String>,
    pub iss_parameter_supported: bool,
    pub client_id_metadata_documents: bool,
}

/// The metadata of the authorization server `issuer`, from the well-known URIs the MCP
/// specification lists (OAuth, then OpenID Connect; path-inserted, then path-appended).
///
/// # Errors
/// None found, or a document for another issuer (RFC 8414 §3.3), or one without the
/// endpoints a flow needs.
pub(crate) fn auth_server(
    resolver: &Resolver,
    issuer: &str,
    cancel: &CancelToken,
) -> Result<AuthServer, String> {
    let u = Url::parse(issuer).ok_or_else(|| format!("issuer {issuer:?} is not http://"))?;
    let (o, p) = (&u.origin, u.bare_path());
    let candidates = if p.is_empty() {
        vec![
            format!("{o}/.well-known/oauth-authorization-server"),
            format!("{o}/.well-known/openid-configuration"),
        ]
    } else {
        vec![
            format!("{o}/.well-known/oauth-authorization-server{p}"),
            format!("{o}/.well-known/openid-configuration{p}"),
            format!("{o}{p}/.well-known/openid-configuration"),
        ]
    };
    let doc = first_json(resolver, &candidates, cancel)
        .map_err(|e| format!("the authorization server's metadata: {e}"))?;
    let said = doc["issuer"].as_str().unwrap_or_default();
    if said != issuer {
        return Err(format!(
            "the authorization server's metadata is for issuer {said:?}, not {issuer:?}: refused"
        ));
    }
    let endpoint = |k: &str| -> Result<String, String> {
        doc[k]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("the authorization server's metadata has no {k}"))
    };
    Ok(AuthServer {
        issuer: issuer.to_owned(),
        authorization_endpoint: endpoint("authorization_endpoint")?,
        token_endpoint: endpoint("token_endpoint")?,
        registration_endpoint: doc["registration_endpoint"].as_str().map(str::to_owned),
        code_challenge_methods: strings(&doc["code_challenge_methods_supported"]),
        auth_methods: strings(&doc["token_endpoint_auth_methods_supported"]),
        iss_parameter_supported: doc["authorization_response_iss_parameter_supported"]
            .as_bool()
            .unwrap_or(false),
        client_id_metadata_documents: doc["client_id_metadata_document_supported"]
            .as_bool()
            .unwrap_or(false),
    })
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

/// The first of `urls` answering 200 with a JSON object.
fn first_json(resolver: &Resolver, urls: &[String], cancel: &CancelToken) -> Result<Value, String> {
    let mut why = Vec::new();
    for url in urls {
        match fetch(
            resolver,
            "GET",
            url,
            &[("Accept", "application/json")],
            &[],
            cancel,
        ) {
            Ok(f) if f.status == 200 => match serde_json::from_slice::<Value>(&f.body) {
                Ok(v) if v.is_object() => return Ok(v),
                _ => why.push(format!("{url}: not a JSON object")),
            },
            Ok(f) => why.push(format!("{url}: HTTP {}", f.status)),
            // A refusal by the network policy is final: the next candidate is on the
            // same host.
            Err(e) => return Err(e),
        }
    }
    Err(format!("none found ({})", why.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_challenges_are_parsed_with_quoted_and_bare_values() {
        let c = Challenge::parse(
            r#"Bearer error="insufficient_scope", scope="mcp:a mcp:b", resource_metadata="http://h/.well-known/x", error_description="a \"quoted\", comma""#,
        )
        .expect("a bearer challenge");
        assert_eq!(c.error.as_deref(), Some("insufficient_scope"));
        assert_eq!(c.scope.as_deref(), Some("mcp:a mcp:b"));
        assert_eq!(
            c.resource_metadata.as_deref(),
            Some("http://h/.well-known/x")
        );
        let c = Challenge::parse("bearer realm=x,scope=s").expect("a bearer challenge");
        assert_eq!(c.scope.as_deref(), Some("s"));
        assert_eq!(Challenge::parse("Bearer"), Some(Challenge::default()));
        assert_eq!(Challenge::parse("Basic realm=x"), None);
        assert_eq!(Challenge::parse("Bearer ,,=,x"), Some(Challenge::default()));
    }
}
