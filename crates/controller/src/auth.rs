//! Who is calling, and what they may do (reference federation-k8s §2.3–2.4).
//!
//! Null-auth (no `auth` config): a valid token attributes the caller; anything else is the
//! anonymous admin. Enforcing: a valid token wins; a present-but-invalid credential is rejected
//! and never downgraded; a direct loopback or trusted-CIDR peer (no `X-Forwarded-For`, a real
//! port) is the anonymous admin; `auth.optional` admits the rest as anonymous; otherwise
//! UNAUTHENTICATED.

use axum::http::HeaderMap;
use iris_auth::{Keypair, Role, Verifier};
use iris_rpc::{Code, RpcError};
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// Auth settings (`auth.*`).
#[derive(Clone, Debug)]
pub struct AuthConfig {
    /// Issuer of our tokens: the cluster `name`, or `iris`.
    pub issuer: String,
    pub keypair: Keypair,
    pub previous_public_keys: Vec<ed25519_dalek::VerifyingKey>,
    /// Enforcing mode (`trusted_cidrs` and/or token verification configured).
    pub enforcing: bool,
    pub trusted_cidrs: Vec<String>,
    pub admin_users: Vec<String>,
    pub user_roles: BTreeMap<String, String>,
    pub optional: bool,
    /// `auth.federation_peers`: parent cluster name → its public key. Tokens from these issuers
    /// with `aud=federation` authenticate as that parent with the federation-peer role.
    pub federation_peers: BTreeMap<String, ed25519_dalek::VerifyingKey>,
    /// `auth.allowed_submitters`: whose jobs a parent may hand to us.
    pub allowed_submitters: Vec<String>,
    /// `auth.iap`: verify the identity-aware proxy's signed header.
    pub iap: Option<IapConfig>,
}

/// `auth.iap`: the proxy's assertion verifier and the role of users nobody provisioned.
#[derive(Clone, Debug)]
pub struct IapConfig {
    pub verifier: iris_auth::iap::IapVerifier,
    /// `auth.iap.unprovisioned_role` (default `dashboard`).
    pub unprovisioned_role: Role,
}

/// The authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub user_id: String,
    pub role: Role,
    /// For task tokens: the job the task belongs to.
    pub job_id: Option<String>,
    /// True for the anonymous admin (loopback, trusted CIDR, null-auth).
    pub anonymous: bool,
}

impl Identity {
    pub fn anonymous_admin() -> Self {
        Identity {
            user_id: "anonymous".into(),
            role: Role::Admin,
            job_id: None,
            anonymous: true,
        }
    }
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// For a capability token: the one endpoint it reaches.
    pub fn endpoint_scope(&self) -> Option<&str> {
        (self.role == Role::Endpoint)
            .then(|| self.user_id.strip_prefix(ENDPOINT_SUBJECT_PREFIX))
            .flatten()
    }
}

/// The audience of capability tokens (`MintEndpointToken`): they reach `/proxy` only.
pub const PROXY_AUDIENCE: &str = "iris-proxy";
/// A capability token's subject is this prefix and its endpoint's name.
pub const ENDPOINT_SUBJECT_PREFIX: &str = "endpoint:";

tokio::task_local! {
    static CALLER: Identity;
}

/// Runs `f` with `id` as the caller visible to handlers through [`caller`].
pub async fn with_caller<F: std::future::Future>(id: Identity, f: F) -> F::Output {
    CALLER.scope(id, f).await
}

/// The caller of the RPC being handled (the anonymous admin outside a request).
pub fn caller() -> Identity {
    CALLER
        .try_with(|c| c.clone())
        .unwrap_or_else(|_| Identity::anonymous_admin())
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The verifier for the control plane: our issuer (and `iris`) with current + previous keys.
pub fn control_plane_verifier(cfg: &AuthConfig) -> Verifier {
    let mut v = Verifier::new(&["iris", PROXY_AUDIENCE]);
    for iss in [cfg.issuer.as_str(), "iris"] {
        v.trust(iss, cfg.keypair.verifying_key());
        for k in &cfg.previous_public_keys {
            v.trust(iss, *k);
        }
    }
    v
}

/// The verifier for inbound federation tokens, if any parent is configured.
pub fn federation_verifier(cfg: &AuthConfig) -> Option<Verifier> {
    if cfg.federation_peers.is_empty() {
        return None;
    }
    let mut v = Verifier::new(&["federation"]);
    for (iss, key) in &cfg.federation_peers {
        v.trust(iss, *key);
    }
    Some(v)
}

/// A federation token for one outgoing call to a peer (reference §2.1: aud `federation`, this
/// cluster as subject, role federation-peer, 5 minutes).
pub fn federation_token(cfg: &AuthConfig) -> Option<String> {
    cfg.keypair
        .mint(
            &cfg.issuer,
            "federation",
            &cfg.issuer,
            "federation-peer",
            300,
            now_secs(),
            BTreeMap::new(),
        )
        .map_err(|e| tracing::error!(error = %e, "minting a federation token"))
        .ok()
}

fn bearer(headers: &HeaderMap) -> Option<Result<String, RpcError>> {
    let v = headers.get("authorization")?;
    let s = match v.to_str() {
        Ok(s) => s,
        Err(_) => {
            return Some(Err(RpcError::new(
                Code::Unauthenticated,
                "authorization header is not valid text",
            )))
        }
    };
    match s
        .strip_prefix("Bearer ")
        .or_else(|| s.strip_prefix("bearer "))
    {
        Some(t) if !t.trim().is_empty() => Some(Ok(t.trim().to_string())),
        _ => Some(Err(RpcError::new(
            Code::Unauthenticated,
            "authorization header must be `Bearer <token>`",
        ))),
    }
}

fn resolve_role(cfg: &AuthConfig, sub: &str, claimed: &str) -> Role {
    if sub == "system:worker" {
        return Role::Worker;
    }
    if let Some(r) = cfg.user_roles.get(sub).and_then(|r| Role::parse(r)) {
        return r;
    }
    if cfg.admin_users.iter().any(|a| a == sub) {
        return Role::Admin;
    }
    Role::parse(claimed).unwrap_or(Role::User)
}

fn identity_from_token(
    cfg: &AuthConfig,
    verifier: &Verifier,
    federation: Option<&Verifier>,
    token: &str,
) -> Result<Identity, RpcError> {
    let c = match verifier.verify(token, now_secs()) {
        Ok(c) => c,
        Err(e) => {
            // No token satisfies both verifiers: the federation one only knows parents' keys and
            // only accepts `aud=federation`.
            if let Some(Ok(f)) = federation.map(|f| f.verify(token, now_secs())) {
                return Ok(Identity {
                    user_id: f.iss,
                    role: Role::FederationPeer,
                    job_id: None,
                    anonymous: false,
                });
            }
            return Err(RpcError::new(
                Code::Unauthenticated,
                format!("invalid token: {e}"),
            ));
        }
    };
    if c.aud == PROXY_AUDIENCE {
        // A capability token: bound to the one endpoint its `endpoint` claim names (as the
        // reference's are), with no other authority. One without the claim is not ours.
        return match (c.scope.as_deref(), c.endpoint.as_deref()) {
            (Some("proxy"), Some(e)) if !e.is_empty() => Ok(Identity {
                user_id: format!("{ENDPOINT_SUBJECT_PREFIX}{e}"),
                role: Role::Endpoint,
                job_id: None,
                anonymous: false,
            }),
            _ => Err(RpcError::new(
                Code::Unauthenticated,
                "invalid token: a proxy token must name its endpoint",
            )),
        };
    }
    let role = resolve_role(cfg, &c.sub, &c.role);
    Ok(Identity {
        user_id: c.sub,
        role,
        job_id: c.job_id,
        anonymous: false,
    })
}

/// The identity-aware proxy layer: a present assertion must verify (never downgraded).
fn identity_from_iap(cfg: &AuthConfig, headers: &HeaderMap) -> Result<Identity, RpcError> {
    let Some(iap) = &cfg.iap else {
        return Err(RpcError::new(
            Code::Unauthenticated,
            "IAP is not configured",
        ));
    };
    let raw = headers
        .get(iris_auth::iap::HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let id = iap.verifier.verify(raw.trim(), now_secs()).map_err(|e| {
        RpcError::new(
            Code::Unauthenticated,
            format!("invalid {} header: {e}", iris_auth::iap::HEADER),
        )
    })?;
    let role = if let Some(r) = cfg.user_roles.get(&id.email).and_then(|r| Role::parse(r)) {
        r
    } else if cfg.admin_users.iter().any(|a| a == &id.email) {
        Role::Admin
    } else {
        iap.unprovisioned_role
    };
    Ok(Identity {
        user_id: id.email,
        role,
        job_id: None,
        anonymous: false,
    })
}

/// Whether the transport peer may be trusted as the anonymous admin.
fn trusted_peer(cfg: &AuthConfig, headers: &HeaderMap, peer: Option<SocketAddr>) -> bool {
    if headers.contains_key("x-forwarded-for") || headers.contains_key("forwarded") {
        return false;
    }
    let Some(peer) = peer else { return false };
    if peer.port() == 0 {
        return false;
    }
    let ip = peer.ip();
    ip.is_loopback()
        || cfg
            .trusted_cidrs
            .iter()
            .any(|c| iris_auth::cidr_contains(c, ip).unwrap_or(false))
}

/// Authenticates a request.
pub fn authenticate(
    cfg: Option<&AuthConfig>,
    verifier: Option<&Verifier>,
    federation: Option<&Verifier>,
    headers: &HeaderMap,
    peer: Option<SocketAddr>,
) -> Result<Identity, RpcError> {
    let (Some(cfg), Some(verifier)) = (cfg, verifier) else {
        return Ok(Identity::anonymous_admin());
    };
    let token = bearer(headers);
    if !cfg.enforcing {
        // Null-auth: tokens attribute callers when valid; nothing is refused.
        if let Some(Ok(t)) = token {
            if let Ok(id) = identity_from_token(cfg, verifier, federation, &t) {
                return Ok(id);
            }
        }
        return Ok(Identity::anonymous_admin());
    }
    match token {
        Some(Ok(t)) => identity_from_token(cfg, verifier, federation, &t),
        Some(Err(e)) => Err(e),
        None if cfg.iap.is_some() && headers.contains_key(iris_auth::iap::HEADER) => {
            identity_from_iap(cfg, headers)
        }
        None if trusted_peer(cfg, headers, peer) || cfg.optional => Ok(Identity::anonymous_admin()),
        None => Err(RpcError::new(
            Code::Unauthenticated,
            "authentication required: send `authorization: Bearer <token>` (set MARIN_CLUSTER_TOKEN, or run `iris login --token T`)",
        )),
    }
}

/// Method-level authorization by role. Per-object rules (ownership) are checked in handlers.
pub fn authorize(id: &Identity, service: &str, method: &str) -> Result<(), RpcError> {
    let deny = |why: &str| {
        Err(RpcError::new(
            Code::PermissionDenied,
            format!(
                "{method} requires {why} (you are {} with role {})",
                id.user_id,
                id.role.name()
            ),
        ))
    };
    let log_read = service == "finelog.logging.LogService" && method == "FetchLogs";
    let inspect_read = service == iris_proto::INSPECT_SERVICE; // it only has reads
    let stats = service == iris_proto::STATS_SERVICE;
    let stats_read = stats
        && matches!(
            method,
            "Query" | "ListNamespaces" | "GetTableSchema" | "GetTableStatus" | "ListRelayStatus"
        );
    match id.role {
        Role::Admin => Ok(()),
        Role::Endpoint => deny("a control-plane token; endpoint tokens only reach /proxy"),
        Role::Dashboard => {
            if log_read
                || inspect_read
                || stats_read
                || iris_auth::DASHBOARD_METHODS.contains(&method)
            {
                Ok(())
            } else {
                deny("a user or admin role; the dashboard role is read-only")
            }
        }
        Role::Worker => match method {
            "Register" | "RenewWorkerToken" | "PushLogs" | "ListEndpoints" | "FetchLogs" => Ok(()),
            "RegisterTable" | "WriteRows" if stats => Ok(()),
            _ => deny("a user or admin role"),
        },
        Role::FederationPeer => match method {
            "LaunchJob" | "TerminateJob" | "FederationSync" | "ListBackends" | "FetchLogs" => {
                Ok(())
            }
            _ => deny("a user or admin role; federation peers may only hand off, cancel and sync"),
        },
        Role::User | Role::Task => match method {
            "ExecuteRawQuery" | "SetUserBudget" | "BeginCheckpoint" => deny("the admin role"),
            "DropTable" | "AbortTableMigration" | "ReportRelayStatus" if stats => {
                deny("the admin role")
            }
            "Register" | "RenewWorkerToken" | "PushLogs" => deny("the worker role"),
            "FederationSync" => deny("the federation-peer role"),
            _ => Ok(()),
        },
    }
}

/// Owner-or-admin for an existing job: refuses without revealing whether the job exists.
pub fn check_owner(id: &Identity, job_id: &str, action: &str) -> Result<(), RpcError> {
    if id.is_admin() {
        return Ok(());
    }
    let user = job_id
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or("");
    let owns = match (&id.role, &id.job_id) {
        (Role::Task, Some(j)) => job_id == j || job_id.starts_with(&format!("{j}/")),
        (Role::Task, None) => false,
        _ => user == id.user_id,
    };
    if owns {
        Ok(())
    } else {
        Err(RpcError::new(
            Code::PermissionDenied,
            format!("{action} {job_id}: permission denied: only the job's owner or an admin may do this"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(enforcing: bool) -> AuthConfig {
        AuthConfig {
            issuer: "c1".into(),
            keypair: Keypair::generate(),
            previous_public_keys: Vec::new(),
            enforcing,
            trusted_cidrs: vec!["10.0.0.0/8".into()],
            admin_users: vec!["root".into()],
            user_roles: BTreeMap::from([("viewer".to_string(), "dashboard".to_string())]),
            optional: false,
            federation_peers: BTreeMap::new(),
            allowed_submitters: Vec::new(),
            iap: None,
        }
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().expect("header"));
        }
        h
    }

    fn token(c: &AuthConfig, sub: &str, role: &str) -> String {
        c.keypair
            .mint("c1", "iris", sub, role, 600, now_secs(), BTreeMap::new())
            .expect("mint")
    }

    #[test]
    fn enforcing_chain() {
        let c = cfg(true);
        let v = control_plane_verifier(&c);
        let remote: SocketAddr = "192.0.2.7:5555".parse().expect("addr");
        let lo: SocketAddr = "127.0.0.1:5555".parse().expect("addr");
        // Nothing from a remote peer: unauthenticated.
        assert_eq!(
            authenticate(Some(&c), Some(&v), None, &headers(&[]), Some(remote)).map_err(|e| e.code),
            Err(Code::Unauthenticated)
        );
        // Loopback direct peer: anonymous admin; behind a proxy: not.
        assert!(
            authenticate(Some(&c), Some(&v), None, &headers(&[]), Some(lo))
                .expect("ok")
                .is_admin()
        );
        assert!(authenticate(
            Some(&c),
            Some(&v),
            None,
            &headers(&[("x-forwarded-for", "1.2.3.4")]),
            Some(lo)
        )
        .is_err());
        assert!(authenticate(
            Some(&c),
            Some(&v),
            None,
            &headers(&[]),
            Some("127.0.0.1:0".parse().expect("addr"))
        )
        .is_err());
        // Trusted CIDR.
        assert!(authenticate(
            Some(&c),
            Some(&v),
            None,
            &headers(&[]),
            Some("10.2.3.4:999".parse().expect("addr"))
        )
        .is_ok());
        // A valid token wins; an invalid one is never downgraded, even from loopback.
        let t = token(&c, "alice", "user");
        let id = authenticate(
            Some(&c),
            Some(&v),
            None,
            &headers(&[("authorization", &format!("Bearer {t}"))]),
            Some(remote),
        )
        .expect("ok");
        assert_eq!((id.user_id.as_str(), id.role), ("alice", Role::User));
        assert!(authenticate(
            Some(&c),
            Some(&v),
            None,
            &headers(&[("authorization", "Bearer junk")]),
            Some(lo)
        )
        .is_err());
        // Config roles override.
        let t = token(&c, "root", "user");
        assert!(authenticate(
            Some(&c),
            Some(&v),
            None,
            &headers(&[("authorization", &format!("Bearer {t}"))]),
            Some(remote)
        )
        .expect("ok")
        .is_admin());
        let t = token(&c, "viewer", "user");
        assert_eq!(
            authenticate(
                Some(&c),
                Some(&v),
                None,
                &headers(&[("authorization", &format!("Bearer {t}"))]),
                Some(remote)
            )
            .expect("ok")
            .role,
            Role::Dashboard
        );
    }

    #[test]
    fn null_auth_never_refuses() {
        let c = cfg(false);
        let v = control_plane_verifier(&c);
        let remote: SocketAddr = "192.0.2.7:5555".parse().expect("addr");
        assert!(authenticate(
            Some(&c),
            Some(&v),
            None,
            &headers(&[("authorization", "Bearer junk")]),
            Some(remote)
        )
        .expect("ok")
        .is_admin());
        let t = token(&c, "alice", "user");
        assert_eq!(
            authenticate(
                Some(&c),
                Some(&v),
                None,
                &headers(&[("authorization", &format!("Bearer {t}"))]),
                Some(remote)
            )
            .expect("ok")
            .user_id,
            "alice"
        );
        assert!(authenticate(None, None, None, &headers(&[]), None)
            .expect("ok")
            .is_admin());
    }

    #[test]
    fn roles_and_ownership() {
        let alice = Identity {
            user_id: "alice".into(),
            role: Role::User,
            job_id: None,
            anonymous: false,
        };
        assert!(authorize(&alice, "iris.cluster.ControllerService", "LaunchJob").is_ok());
        assert!(authorize(&alice, "iris.cluster.ControllerService", "ExecuteRawQuery").is_err());
        let dash = Identity {
            role: Role::Dashboard,
            ..alice.clone()
        };
        assert!(authorize(&dash, "iris.cluster.ControllerService", "ListJobs").is_ok());
        assert!(authorize(&dash, "iris.cluster.ControllerService", "LaunchJob").is_err());
        let ep = Identity {
            role: Role::Endpoint,
            ..alice.clone()
        };
        assert!(authorize(&ep, "iris.cluster.ControllerService", "ListJobs").is_err());
        assert!(check_owner(&alice, "/alice/train", "cancel").is_ok());
        assert!(check_owner(&alice, "/bob/train", "cancel").is_err());
        let task = Identity {
            role: Role::Task,
            job_id: Some("/alice/train".into()),
            ..alice.clone()
        };
        assert!(check_owner(&task, "/alice/train/child", "submit").is_ok());
        assert!(check_owner(&task, "/alice/other", "submit").is_err());
    }
}
