//! Keys, tokens and identities (reference: federation-k8s §2).
//!
//! One Ed25519 signing key per cluster. Tokens are JWTs (`alg` EdDSA) whose `kid` is the RFC 7638
//! thumbprint of the public key; the signer always sets `iss`, `aud`, `iat` and `exp`, and the
//! verifier requires all four (60 s leeway) and resolves keys by issuer, then kid — never from the
//! token itself.

pub mod iap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{SigningKey, VerifyingKey};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use sha2::Digest;
use std::collections::BTreeMap;

/// Leeway on `exp`/`iat`, seconds.
pub const LEEWAY_SECS: u64 = 60;

/// Errors from key handling and token checks. Messages never echo secrets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("invalid key: {0}")]
    BadKey(String),
    #[error("invalid token: {0}")]
    BadToken(String),
    #[error("token issuer '{0}' is not trusted here")]
    UnknownIssuer(String),
    #[error("token signature does not match any key of issuer '{0}'")]
    BadSignature(String),
    #[error("token has expired")]
    Expired,
    #[error("token audience is not accepted here")]
    BadAudience,
    #[error("signing: {0}")]
    Signing(String),
}

/// A cluster's signing key.
#[derive(Clone)]
pub struct Keypair {
    signing: SigningKey,
    kid: String,
    encoding: EncodingKey,
}

impl std::fmt::Debug for Keypair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keypair(kid={})", self.kid)
    }
}

/// RFC 7638 thumbprint of an Ed25519 public key.
pub fn thumbprint(public: &VerifyingKey) -> String {
    let x = B64.encode(public.as_bytes());
    let jwk = format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{x}"}}"#);
    B64.encode(sha2::Sha256::digest(jwk.as_bytes()))
}

impl Keypair {
    /// A fresh random key.
    pub fn generate() -> Self {
        let signing = SigningKey::generate(&mut rand::rngs::OsRng);
        Self::from_signing(signing).unwrap_or_else(|_| unreachable_key())
    }

    fn from_signing(signing: SigningKey) -> Result<Self, AuthError> {
        let pem = signing
            .to_pkcs8_pem(Default::default())
            .map_err(|e| AuthError::BadKey(e.to_string()))?;
        let encoding = EncodingKey::from_ed_pem(pem.as_bytes())
            .map_err(|e| AuthError::BadKey(e.to_string()))?;
        let kid = thumbprint(&signing.verifying_key());
        Ok(Keypair {
            signing,
            kid,
            encoding,
        })
    }

    /// Loads a PKCS#8 PEM private key.
    pub fn from_pem(pem: &str) -> Result<Self, AuthError> {
        let signing = SigningKey::from_pkcs8_pem(pem.trim()).map_err(|e| {
            AuthError::BadKey(format!("not an Ed25519 PKCS#8 PEM private key: {e}"))
        })?;
        Self::from_signing(signing)
    }

    /// The private key as PKCS#8 v1 PEM (private key only: the form Python's `cryptography`
    /// and OpenSSL write and read).
    pub fn private_pem(&self) -> Result<String, AuthError> {
        use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
        use ed25519_dalek::pkcs8::EncodePrivateKey as _;
        let bytes = ed25519_dalek::pkcs8::KeypairBytes {
            secret_key: self.signing.to_bytes(),
            public_key: None,
        };
        bytes
            .to_pkcs8_pem(LineEnding::LF)
            .map(|z| z.to_string())
            .map_err(|e| AuthError::BadKey(e.to_string()))
    }

    /// The public key as SPKI PEM.
    pub fn public_pem(&self) -> Result<String, AuthError> {
        self.signing
            .verifying_key()
            .to_public_key_pem(Default::default())
            .map_err(|e| AuthError::BadKey(e.to_string()))
    }

    pub fn kid(&self) -> &str {
        &self.kid
    }

    pub fn verifying_key(&self) -> VerifyingKey {
        self.signing.verifying_key()
    }

    /// Mints a token. `extra` claims cannot override `iss`, `aud`, `iat`, `exp`.
    // Every argument is a distinct claim; a builder would only rename them.
    #[allow(clippy::too_many_arguments)]
    pub fn mint(
        &self,
        iss: &str,
        aud: &str,
        sub: &str,
        role: &str,
        ttl_secs: u64,
        now_secs: u64,
        extra: BTreeMap<String, serde_json::Value>,
    ) -> Result<String, AuthError> {
        let mut claims = serde_json::Map::new();
        for (k, v) in extra {
            if !matches!(k.as_str(), "iss" | "aud" | "iat" | "exp") {
                claims.insert(k, v);
            }
        }
        claims.insert("iss".into(), iss.into());
        claims.insert("aud".into(), aud.into());
        claims.insert("sub".into(), sub.into());
        claims.insert("role".into(), role.into());
        claims.insert("iat".into(), now_secs.into());
        claims.insert("exp".into(), (now_secs + ttl_secs).into());
        if !claims.contains_key("jti") {
            let mut b = [0u8; 12];
            rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut b);
            claims.insert(
                "jti".into(),
                format!("iris_k_{role}_{}", hex::encode(b)).into(),
            );
        }
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(self.kid.clone());
        header.typ = Some("JWT".into());
        jsonwebtoken::encode(&header, &claims, &self.encoding)
            .map_err(|e| AuthError::Signing(e.to_string()))
    }
}

#[cold]
fn unreachable_key() -> Keypair {
    // Encoding a freshly generated Ed25519 key as PKCS#8 cannot fail; if it ever does, a second
    // fresh key is the only sensible answer.
    let signing = SigningKey::generate(&mut rand::rngs::OsRng);
    let pem = signing
        .to_pkcs8_pem(Default::default())
        .map(|z| z.to_string())
        .unwrap_or_default();
    let encoding =
        EncodingKey::from_ed_pem(pem.as_bytes()).unwrap_or_else(|_| EncodingKey::from_secret(b""));
    let kid = thumbprint(&signing.verifying_key());
    Keypair {
        signing,
        kid,
        encoding,
    }
}

/// Parses an SPKI PEM public key.
pub fn public_from_pem(pem: &str) -> Result<VerifyingKey, AuthError> {
    VerifyingKey::from_public_key_pem(pem.trim())
        .map_err(|e| AuthError::BadKey(format!("not an Ed25519 public key PEM: {e}")))
}

/// Verified claims.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Claims {
    pub iss: String,
    pub aud: String,
    #[serde(default)]
    pub sub: String,
    #[serde(default)]
    pub role: String,
    pub iat: u64,
    pub exp: u64,
    #[serde(default)]
    pub jti: String,
    #[serde(default)]
    pub job_id: Option<String>,
    #[serde(default)]
    pub scope: Option<String>,
    #[serde(default)]
    pub endpoint: Option<String>,
}

/// Verifies tokens against configured keys, by issuer.
#[derive(Clone, Default)]
pub struct Verifier {
    issuers: BTreeMap<String, Vec<(String, VerifyingKey)>>,
    audiences: Vec<String>,
}

impl Verifier {
    pub fn new(audiences: &[&str]) -> Self {
        Verifier {
            issuers: BTreeMap::new(),
            audiences: audiences.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Trusts `key` for tokens issued by `issuer`.
    pub fn trust(&mut self, issuer: &str, key: VerifyingKey) {
        self.issuers
            .entry(issuer.to_string())
            .or_default()
            .push((thumbprint(&key), key));
    }

    /// The JWKS document for every trusted key.
    pub fn jwks(&self) -> serde_json::Value {
        let mut keys = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for ks in self.issuers.values() {
            for (kid, k) in ks {
                if seen.insert(kid.clone()) {
                    keys.push(serde_json::json!({"kty": "OKP", "crv": "Ed25519", "x": B64.encode(k.as_bytes()), "kid": kid, "alg": "EdDSA", "use": "sig"}));
                }
            }
        }
        serde_json::json!({ "keys": keys })
    }

    /// Verifies a token; `now_secs` is the current time.
    pub fn verify(&self, token: &str, now_secs: u64) -> Result<Claims, AuthError> {
        if token.len() > 16 * 1024 {
            return Err(AuthError::BadToken("token is too large".into()));
        }
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| AuthError::BadToken(e.to_string()))?;
        if header.alg != Algorithm::EdDSA {
            return Err(AuthError::BadToken(format!(
                // debug-ok: the algorithm's name (jsonwebtoken gives it no Display).
                "algorithm {:?} is not accepted (EdDSA only)",
                header.alg
            )));
        }
        // Read the (unverified) issuer only to choose keys; every claim is re-checked after the
        // signature verifies.
        let payload = token
            .split('.')
            .nth(1)
            .ok_or_else(|| AuthError::BadToken("not a JWT".into()))?;
        let raw = B64
            .decode(payload)
            .map_err(|_| AuthError::BadToken("payload is not base64url".into()))?;
        let unverified: serde_json::Value = serde_json::from_slice(&raw)
            .map_err(|_| AuthError::BadToken("payload is not JSON".into()))?;
        let iss = unverified
            .get("iss")
            .and_then(|v| v.as_str())
            .ok_or_else(|| AuthError::BadToken("missing iss".into()))?;
        let keys = self
            .issuers
            .get(iss)
            .ok_or_else(|| AuthError::UnknownIssuer(iss.to_string()))?;
        let ordered: Vec<&VerifyingKey> = match &header.kid {
            Some(kid) if keys.iter().any(|(k, _)| k == kid) => keys
                .iter()
                .filter(|(k, _)| k == kid)
                .map(|(_, v)| v)
                .collect(),
            _ => keys.iter().map(|(_, v)| v).collect(),
        };
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.leeway = LEEWAY_SECS;
        validation.set_required_spec_claims(&["iss", "aud", "exp", "iat"]);
        validation.set_issuer(&[iss]);
        validation.set_audience(&self.audiences);
        validation.validate_exp = false; // checked below against the caller's clock
        let mut last = AuthError::BadSignature(iss.to_string());
        for key in ordered {
            // jsonwebtoken takes the raw 32-byte public key for EdDSA.
            let dk = DecodingKey::from_ed_der(key.as_bytes());
            match jsonwebtoken::decode::<Claims>(token, &dk, &validation) {
                Ok(data) => {
                    let c = data.claims;
                    if c.exp + LEEWAY_SECS < now_secs {
                        return Err(AuthError::Expired);
                    }
                    if c.iat > now_secs + LEEWAY_SECS {
                        return Err(AuthError::BadToken("token is issued in the future".into()));
                    }
                    if (c.aud == "iris-proxy") != (c.scope.as_deref() == Some("proxy")) {
                        return Err(AuthError::BadAudience);
                    }
                    return Ok(c);
                }
                Err(e) => {
                    last = match e.kind() {
                        jsonwebtoken::errors::ErrorKind::InvalidSignature => {
                            AuthError::BadSignature(iss.to_string())
                        }
                        jsonwebtoken::errors::ErrorKind::InvalidAudience => AuthError::BadAudience,
                        _ => AuthError::BadToken(e.to_string()),
                    };
                }
            }
        }
        Err(last)
    }
}

/// Roles (reference §2.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Admin,
    User,
    Dashboard,
    Worker,
    Task,
    Endpoint,
    FederationPeer,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "admin" => Some(Role::Admin),
            "user" => Some(Role::User),
            "dashboard" => Some(Role::Dashboard),
            "worker" => Some(Role::Worker),
            "task" => Some(Role::Task),
            "endpoint" => Some(Role::Endpoint),
            "federation-peer" => Some(Role::FederationPeer),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::User => "user",
            Role::Dashboard => "dashboard",
            Role::Worker => "worker",
            Role::Task => "task",
            Role::Endpoint => "endpoint",
            Role::FederationPeer => "federation-peer",
        }
    }
}

/// The dashboard role's read-only allowlist.
/// The dashboard's session cookie: a browser that logged in there presents its token with it, to
/// the dashboard and to the controller's `/proxy` (same host, so the same cookie jar).
pub const SESSION_COOKIE: &str = "iris_session";

/// The session token among a request's `Cookie` header values.
pub fn session_token<'a>(cookie_headers: impl IntoIterator<Item = &'a str>) -> Option<String> {
    cookie_headers
        .into_iter()
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == SESSION_COOKIE)
        .map(|(_, v)| v.to_string())
}

pub const DASHBOARD_METHODS: &[&str] = &[
    "GetJobStatus",
    "GetJobState",
    "ListJobs",
    "GetTaskStatus",
    "ListTasks",
    "GetProcessStatus",
    "ListWorkers",
    "GetWorkerStatus",
    "ListEndpoints",
    "GetAutoscalerStatus",
    "GetSchedulerState",
    "GetKubernetesClusterStatus",
    "ListBackends",
    "ListPeers",
    "GetCurrentUser",
    "ListUsers",
    "GetUserBudget",
    "ListUserBudgets",
];

/// Whether `addr` lies in `cidr` (`a.b.c.d/n` or an IPv6 prefix).
pub fn cidr_contains(cidr: &str, addr: std::net::IpAddr) -> Result<bool, String> {
    let (net, bits) = cidr
        .split_once('/')
        .ok_or_else(|| format!("'{cidr}' is not a CIDR (a.b.c.d/n)"))?;
    let bits: u32 = bits
        .parse()
        .map_err(|_| format!("'{cidr}': bad prefix length"))?;
    let net: std::net::IpAddr = net.parse().map_err(|_| format!("'{cidr}': bad address"))?;
    Ok(match (net, addr) {
        (std::net::IpAddr::V4(n), std::net::IpAddr::V4(a)) => {
            if bits > 32 {
                return Err(format!("'{cidr}': prefix over 32"));
            }
            let mask = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - bits)
            };
            u32::from(n) & mask == u32::from(a) & mask
        }
        (std::net::IpAddr::V6(n), std::net::IpAddr::V6(a)) => {
            if bits > 128 {
                return Err(format!("'{cidr}': prefix over 128"));
            }
            let mask = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - bits)
            };
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    })
}

/// `auth.allowed_submitters` matching: `*`, `*@domain` (case-insensitive domain), or exact.
pub fn submitter_allowed(patterns: &[String], who: &str) -> bool {
    patterns.iter().any(|p| {
        if p == "*" {
            return who != "local_admin";
        }
        if let Some(domain) = p.strip_prefix("*@") {
            return who
                .rsplit_once('@')
                .map(|(_, d)| d.eq_ignore_ascii_case(domain))
                .unwrap_or(false);
        }
        p == who
    })
}

#[cfg(test)]
mod tests;
