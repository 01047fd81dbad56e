//! Endpoints: names tasks register services under, who may reach them through `/proxy`, and
//! how a name is written in a proxy URL. Pure: the registry lives in the store, the proxy in the
//! controller.

use std::fmt;

/// Who may reach an endpoint through the controller's `/proxy` (the wire's `EndpointAccess`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Access {
    /// A full cluster identity is required: the endpoint's owner, or an admin.
    #[default]
    Private,
    /// A capability URL minted for it (`/proxy/t/<token>/…`) is enough; owners and admins reach
    /// it as they reach a private one.
    Link,
}

impl Access {
    /// The wire code (`ENDPOINT_ACCESS_PRIVATE = 0`, `ENDPOINT_ACCESS_LINK = 2`).
    pub fn code(self) -> i32 {
        match self {
            Access::Private => 0,
            Access::Link => 2,
        }
    }

    /// From the wire code; `None` for a value the protocol reserves or does not define.
    pub fn from_code(code: i32) -> Option<Access> {
        match code {
            0 => Some(Access::Private),
            2 => Some(Access::Link),
            _ => None,
        }
    }

    /// The stored and displayed name.
    pub fn name(self) -> &'static str {
        match self {
            Access::Private => "private",
            Access::Link => "link",
        }
    }

    pub fn parse(s: &str) -> Option<Access> {
        match s {
            "private" => Some(Access::Private),
            "link" => Some(Access::Link),
            _ => None,
        }
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Names under this prefix are the controller's own services (the log server); tasks may not
/// register them.
pub const SYSTEM_PREFIX: &str = "/system/";

/// The metadata key whose value (seconds, a positive number) replaces the proxy's default
/// upstream timeout for one endpoint.
pub const PROXY_TIMEOUT_KEY: &str = "proxy_timeout_seconds";

/// Longest endpoint name accepted.
pub const MAX_NAME_LEN: usize = 512;

/// Checks an endpoint name a task registers; the error says what is wrong and how to fix it.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("name is empty: give the endpoint a name such as `coordinator` (the client prefixes the job's namespace)".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "name is {} bytes long; the limit is {MAX_NAME_LEN}",
            name.len()
        ));
    }
    if let Some(c) = name.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "name {} contains {}; endpoint names may not contain spaces or control characters",
            crate::quoted(name),
            crate::quoted(&c.to_string())
        ));
    }
    if name.starts_with(SYSTEM_PREFIX) {
        return Err(format!(
            "name {} is under {SYSTEM_PREFIX}, which is reserved for the controller's own services",
            crate::quoted(name)
        ));
    }
    Ok(())
}

/// Checks an endpoint address: `host:port`, or a URL with a host (`http://host:port/base`;
/// the proxy forwards to `http` and `https` ones and to bare `host:port`).
pub fn check_address(address: &str) -> Result<(), String> {
    let bad = || {
        Err(format!(
            "address {} is not host:port or a URL with a host; register where the service listens, e.g. 10.0.0.5:8080 or http://10.0.0.5:8080", crate::quoted(address)
        ))
    };
    if address.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return bad();
    }
    match address.split_once("://") {
        Some((scheme, rest)) => {
            let authority = rest.split('/').next().unwrap_or("");
            if scheme.is_empty() || authority.is_empty() || authority.starts_with(':') {
                return bad();
            }
            Ok(())
        }
        None => match address.rsplit_once(':') {
            Some((host, port))
                if !host.is_empty()
                    && !host.contains('/')
                    && port.parse::<u16>().is_ok_and(|p| p > 0) =>
            {
                Ok(())
            }
            _ => bad(),
        },
    }
}

/// The base URL `/proxy` forwards to, or `None` when the address is not HTTP (a JAX coordinator
/// or other raw TCP service is discoverable, but not proxied).
pub fn proxy_base(address: &str) -> Option<String> {
    match address.split_once("://") {
        Some(("http" | "https", _)) => Some(address.trim_end_matches('/').to_string()),
        Some(_) => None,
        None => Some(format!("http://{address}")),
    }
}

/// The per-endpoint proxy timeout in seconds from its metadata, when set to a positive number.
pub fn proxy_timeout_secs<'a>(
    mut metadata: impl Iterator<Item = (&'a str, &'a str)>,
) -> Option<f64> {
    metadata
        .find(|(k, _)| *k == PROXY_TIMEOUT_KEY)
        .and_then(|(_, v)| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
}

/// How a name is written as one URL path segment: outer slashes dropped, inner ones as '.'
/// (`/alice/train/coord` → `alice.train.coord`).
pub fn encode_proxy_name(name: &str) -> String {
    name.trim_matches('/').replace('/', ".")
}

/// The names a proxy URL segment may stand for, most likely first: the '.'-encoded form of a
/// job-scoped name (with its leading slash), then the same without it.
pub fn decode_proxy_name(segment: &str) -> [String; 2] {
    let slashed = segment.replace('.', "/");
    [format!("/{slashed}"), slashed]
}

/// The namespace a task's relative endpoint names go under: `/<user>/<root job>` (shared by the
/// whole job tree, so a parent finds its children's endpoints).
pub fn namespace_of(job_id: &str) -> String {
    let mut parts = job_id.trim_start_matches('/').split('/');
    match (parts.next(), parts.next()) {
        (Some(user), Some(root)) => format!("/{user}/{root}"),
        (Some(user), None) => format!("/{user}"),
        _ => String::new(),
    }
}

/// The user owning a job-scoped name or id (its first path component).
pub fn owner_of(name: &str) -> &str {
    name.trim_start_matches('/').split('/').next().unwrap_or("")
}

/// A `/proxy` request's target, parsed from the path after `/proxy/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProxyTarget {
    /// `/proxy/<name>/<rest>`: the caller's own identity decides.
    Named { segment: String, rest: String },
    /// `/proxy/t/<token>/<name>/<rest>`: a capability URL.
    Token {
        token: String,
        segment: String,
        rest: String,
    },
    /// `/proxy/t/cluster=<peer>/<token>/<name>/<rest>`: a capability URL a peer minted, relayed
    /// to that peer unchanged.
    Relay { peer: String, rest: String },
}

/// Parses the path after `/proxy/` (no query). `None` when no endpoint is named.
pub fn parse_proxy_path(path: &str) -> Option<ProxyTarget> {
    fn split(s: &str) -> (&str, &str) {
        s.split_once('/').unwrap_or((s, ""))
    }
    let (first, rest) = split(path);
    if first.is_empty() {
        return None;
    }
    if first != "t" {
        return Some(ProxyTarget::Named {
            segment: first.to_string(),
            rest: rest.to_string(),
        });
    }
    let (token, rest) = split(rest);
    if let Some(peer) = token.strip_prefix("cluster=") {
        if peer.is_empty() || rest.is_empty() {
            return None;
        }
        return Some(ProxyTarget::Relay {
            peer: peer.to_string(),
            rest: rest.to_string(),
        });
    }
    let (segment, rest) = split(rest);
    if token.is_empty() || segment.is_empty() {
        return None;
    }
    Some(ProxyTarget::Token {
        token: token.to_string(),
        segment: segment.to_string(),
        rest: rest.to_string(),
    })
}

/// The credential a `/proxy` caller presented, as authentication established it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProxyCaller<'a> {
    /// A cluster identity: a user (or a task acting for its user), or an admin.
    User { user: &'a str, admin: bool },
    /// A capability token bound to one endpoint name.
    Capability { endpoint: &'a str },
    /// A federation parent relaying its user's request (it checked the user itself).
    Peer,
}

/// Why `/proxy` refused a request, before anything reached a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProxyDenied {
    /// The caller is neither the endpoint's owner nor an admin.
    NotOwner,
    /// A capability token for another endpoint.
    WrongEndpoint,
    /// A capability token for a private endpoint.
    NotLinkAccess,
}

impl fmt::Display for ProxyDenied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProxyDenied::NotOwner => "only the endpoint's owner or an admin may reach it",
            ProxyDenied::WrongEndpoint => "this capability URL was minted for another endpoint",
            ProxyDenied::NotLinkAccess => {
                "this endpoint is private: capability URLs reach only endpoints registered with link access"
            }
        })
    }
}

/// May `caller` reach the endpoint `name` (owned by the user `owner`, with `access`)?
pub fn proxy_allowed(
    caller: &ProxyCaller<'_>,
    name: &str,
    owner: &str,
    access: Access,
) -> Result<(), ProxyDenied> {
    match caller {
        ProxyCaller::User { admin: true, .. } | ProxyCaller::Peer => Ok(()),
        ProxyCaller::User { user, .. } if *user == owner => Ok(()),
        ProxyCaller::User { .. } => Err(ProxyDenied::NotOwner),
        ProxyCaller::Capability { endpoint } if *endpoint != name => {
            Err(ProxyDenied::WrongEndpoint)
        }
        ProxyCaller::Capability { .. } if access != Access::Link => Err(ProxyDenied::NotLinkAccess),
        ProxyCaller::Capability { .. } => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_proxy_urls() {
        let n = "/alice/train/coord";
        let seg = encode_proxy_name(n);
        assert_eq!(seg, "alice.train.coord");
        assert_eq!(decode_proxy_name(&seg)[0], n);
        assert_eq!(decode_proxy_name("plain")[1], "plain");
    }

    #[test]
    fn names_and_addresses_are_checked_with_the_fix() {
        assert!(check_name("/alice/train/coord").is_ok());
        for bad in ["", "a b", "/system/log-server", "a\nb"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_name(&"x".repeat(600)).is_err());
        for ok in [
            "127.0.0.1:80",
            "http://h:1",
            "https://h/path",
            "[::1]:8",
            "grpc://h:1",
        ] {
            assert!(check_address(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "host", "h:0", "h:99999", "http://", ":80", "a b:1", "x/y:80",
        ] {
            let e = check_address(bad).expect_err(bad);
            assert!(e.contains("address"), "{e}");
        }
    }

    #[test]
    fn only_http_addresses_are_proxied() {
        assert_eq!(proxy_base("h:1").as_deref(), Some("http://h:1"));
        assert_eq!(proxy_base("https://h/x/").as_deref(), Some("https://h/x"));
        assert_eq!(proxy_base("grpc://h:1"), None);
    }

    #[test]
    fn namespaces_are_the_root_job() {
        assert_eq!(namespace_of("/alice/train"), "/alice/train");
        assert_eq!(namespace_of("/alice/train/sub/0"), "/alice/train");
        assert_eq!(owner_of("/alice/train/coord"), "alice");
    }

    #[test]
    fn proxy_paths_parse() {
        assert_eq!(
            parse_proxy_path("alice.train.coord/a/b"),
            Some(ProxyTarget::Named {
                segment: "alice.train.coord".into(),
                rest: "a/b".into()
            })
        );
        assert_eq!(
            parse_proxy_path("t/TOK/alice.x/"),
            Some(ProxyTarget::Token {
                token: "TOK".into(),
                segment: "alice.x".into(),
                rest: "".into()
            })
        );
        assert_eq!(
            parse_proxy_path("t/cluster=gpu/TOK/alice.x/v1"),
            Some(ProxyTarget::Relay {
                peer: "gpu".into(),
                rest: "TOK/alice.x/v1".into()
            })
        );
        for bad in ["", "/x", "t/TOK", "t//x", "t/cluster=/a", "t/cluster=p"] {
            assert_eq!(parse_proxy_path(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn who_may_reach_an_endpoint() {
        let n = "/alice/job/web";
        let alice = ProxyCaller::User {
            user: "alice",
            admin: false,
        };
        let bob = ProxyCaller::User {
            user: "bob",
            admin: false,
        };
        let root = ProxyCaller::User {
            user: "root",
            admin: true,
        };
        let cap = ProxyCaller::Capability { endpoint: n };
        let other = ProxyCaller::Capability {
            endpoint: "/alice/job/db",
        };
        for access in [Access::Private, Access::Link] {
            assert_eq!(proxy_allowed(&alice, n, "alice", access), Ok(()));
            assert_eq!(proxy_allowed(&root, n, "alice", access), Ok(()));
            assert_eq!(
                proxy_allowed(&bob, n, "alice", access),
                Err(ProxyDenied::NotOwner)
            );
            assert_eq!(
                proxy_allowed(&other, n, "alice", access),
                Err(ProxyDenied::WrongEndpoint)
            );
        }
        assert_eq!(proxy_allowed(&cap, n, "alice", Access::Link), Ok(()));
        assert_eq!(
            proxy_allowed(&cap, n, "alice", Access::Private),
            Err(ProxyDenied::NotLinkAccess)
        );
    }
}
