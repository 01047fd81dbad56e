//! `iris cluster init-keys` and `iris user token mint`.

use anyhow::Context;
use clap::Args;
use std::collections::BTreeMap;

#[derive(Args)]
pub struct InitKeysArgs {
    /// Write the private key here (mode 0600) and print its `file:` reference. A file that
    /// already holds a key is read back (its public half printed), never overwritten.
    #[arg(long)]
    pub out_file: Option<std::path::PathBuf>,
    /// Replace the key in --out-file with a new one (the old one is kept beside it as
    /// `<file>.previous`; list its public key in auth.previous_public_keys during the overlap).
    #[arg(long)]
    pub rotate: bool,
    /// GCP Secret Manager (not supported by this build: use --out-file).
    #[arg(long)]
    pub gcp_secret: Option<String>,
    /// With --gcp-secret (not supported by this build).
    #[arg(long)]
    pub accessor: Option<String>,
}

#[derive(Args)]
pub struct MintArgs {
    /// The user the token identifies.
    pub user: String,
    /// Lifetime, e.g. 3600, 90m, 12h, 7d.
    #[arg(long, default_value = "7d")]
    pub ttl: String,
    /// The cluster's signing key: `file:PATH` or `env:VAR`.
    #[arg(long, env = "IRIS_SIGNING_KEY")]
    pub signing_key: String,
    /// Issuer: the cluster's `name` (default `iris`).
    #[arg(long, default_value = "iris")]
    pub issuer: String,
    #[arg(long, default_value = "user", value_parser = ["user", "admin", "dashboard", "worker"])]
    pub role: String,
}

/// Resolves a secret reference (`file:PATH`, `env:VAR`) to its text.
pub fn resolve_secret(reference: &str) -> anyhow::Result<String> {
    if let Some(p) = reference.strip_prefix("file:") {
        return std::fs::read_to_string(p).with_context(|| format!("reading signing key {p}"));
    }
    if let Some(v) = reference.strip_prefix("env:") {
        return std::env::var(v)
            .with_context(|| format!("signing key: environment variable {v} is not set"));
    }
    anyhow::bail!("signing key {reference}: use file:PATH or env:VAR")
}

/// The first of an ordered list of secret references that resolves. A reference this
/// controller cannot read (a cloud secret manager) is skipped; if none resolves, the error
/// names each reference and why.
pub fn resolve_first_secret(refs: &[String]) -> anyhow::Result<String> {
    let mut why = Vec::new();
    for r in refs {
        if r.starts_with("file:") || r.starts_with("env:") {
            match resolve_secret(r) {
                Ok(v) => return Ok(v),
                Err(e) => why.push(format!("{r}: {e:#}")),
            }
        } else {
            let scheme = r.split_once("://").map(|x| x.0).unwrap_or(r);
            why.push(format!(
                "{r}: `{scheme}` references are not read by this controller (use file:PATH or env:VAR)"
            ));
        }
    }
    anyhow::bail!(
        "auth.signing_key: no reference resolved: {}",
        why.join("; ")
    )
}

/// Parses `3600`, `90s`, `90m`, `12h`, `7d` into seconds.
pub fn parse_ttl(s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let (num, mult) = match t.chars().last() {
        Some('s') => (&t[..t.len() - 1], 1),
        Some('m') => (&t[..t.len() - 1], 60),
        Some('h') => (&t[..t.len() - 1], 3600),
        Some('d') => (&t[..t.len() - 1], 86400),
        _ => (t, 1),
    };
    let n: u64 = num.parse().map_err(|_| {
        anyhow::anyhow!("--ttl '{s}': expected a number with s, m, h or d (e.g. 7d)")
    })?;
    if n == 0 {
        anyhow::bail!("--ttl must be positive");
    }
    Ok(n * mult)
}

pub fn init_keys(a: InitKeysArgs) -> anyhow::Result<i32> {
    if a.gcp_secret.is_some() || a.accessor.is_some() {
        anyhow::bail!("--gcp-secret/--accessor: GCP Secret Manager is not supported by this build; write the key with --out-file FILE and reference it as auth.signing_key: file:FILE");
    }
    if a.rotate && a.out_file.is_none() {
        anyhow::bail!("--rotate replaces the key in --out-file FILE; pass the file");
    }
    // An existing key is the cluster's identity: read it back unless told to rotate it.
    if let Some(p) = a.out_file.as_ref().filter(|p| p.exists()) {
        if a.rotate {
            let previous = std::path::PathBuf::from(format!("{}.previous", p.display()));
            std::fs::rename(p, &previous).with_context(|| {
                format!("--rotate: moving {} to {}", p.display(), previous.display())
            })?;
            println!("previous key: {}", previous.display());
        } else {
            let pem = std::fs::read_to_string(p)
                .with_context(|| format!("reading the existing key {}", p.display()))?;
            let k = iris_auth::Keypair::from_pem(&pem).map_err(|e| {
                anyhow::anyhow!("{} exists but holds no Ed25519 private key ({e}); move it aside, or pass --rotate", p.display())
            })?;
            let abs = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
            println!(
                "signing_key: file:{} (existing key; pass --rotate to replace it)",
                abs.display()
            );
            println!("kid: {}", k.kid());
            print!("{}", k.public_pem().map_err(anyhow::Error::msg)?);
            return Ok(0);
        }
    }
    let k = iris_auth::Keypair::generate();
    let private = k.private_pem().map_err(anyhow::Error::msg)?;
    match &a.out_file {
        Some(p) => {
            write_private(p, &private)?;
            let abs = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
            println!("signing_key: file:{}", abs.display());
        }
        None => print!("{private}"),
    }
    println!("kid: {}", k.kid());
    print!("{}", k.public_pem().map_err(anyhow::Error::msg)?);
    Ok(0)
}

#[cfg(unix)]
fn write_private(p: &std::path::Path, pem: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(p)
        .with_context(|| {
            format!(
                "creating {} (refusing to overwrite an existing key)",
                p.display()
            )
        })?;
    f.write_all(pem.as_bytes())?;
    Ok(())
}

pub fn mint(a: MintArgs) -> anyhow::Result<i32> {
    let user = iris_types::ids::validate_user(&a.user).map_err(anyhow::Error::msg)?;
    let ttl = parse_ttl(&a.ttl)?;
    let key = iris_auth::Keypair::from_pem(&resolve_secret(&a.signing_key)?)
        .map_err(anyhow::Error::msg)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let token = key
        .mint(&a.issuer, "iris", &user, &a.role, ttl, now, BTreeMap::new())
        .map_err(anyhow::Error::msg)?;
    println!("{token}");
    Ok(0)
}

/// Builds the controller's auth settings from the config's `auth:` section.
pub fn auth_from_config(
    cfg: &crate::config::ClusterConfig,
) -> anyhow::Result<Option<iris_controller::auth::AuthConfig>> {
    let Some(a) = &cfg.auth else { return Ok(None) };
    let keypair = match a.signing_key.is_empty() {
        false => iris_auth::Keypair::from_pem(&resolve_first_secret(&a.signing_key)?)
            .map_err(|e| anyhow::anyhow!("auth.signing_key: {e}"))?,
        true => {
            eprintln!("WARNING: auth.signing_key is not set: using an EPHEMERAL signing key. Every token (workers', users') dies with this process; set auth.signing_key (iris cluster init-keys --out-file F) for a real deployment.");
            iris_auth::Keypair::generate()
        }
    };
    let mut previous = Vec::new();
    for (i, pem) in a.previous_public_keys.iter().enumerate() {
        previous.push(
            iris_auth::public_from_pem(pem)
                .map_err(|e| anyhow::anyhow!("auth.previous_public_keys[{i}]: {e}"))?,
        );
    }
    for (i, c) in a.trusted_cidrs.iter().enumerate() {
        iris_auth::cidr_contains(c, std::net::IpAddr::from([127, 0, 0, 1]))
            .map_err(|e| anyhow::anyhow!("auth.trusted_cidrs[{i}]: {e}"))?;
    }
    for (user, role) in &a.user_roles {
        if !matches!(role.as_str(), "admin" | "user" | "dashboard") {
            anyhow::bail!(
                "auth.user_roles.{user}: unknown role '{role}' (admin, user or dashboard)"
            );
        }
    }
    let mut federation_peers = BTreeMap::new();
    for (name, pem) in &a.federation_peers {
        if name.is_empty() || name == "local" {
            anyhow::bail!("auth.federation_peers: '{name}' is not a usable cluster name");
        }
        let key = iris_auth::public_from_pem(pem).map_err(|e| {
            anyhow::anyhow!("auth.federation_peers.{name}: {e} (paste the public PEM printed by `iris cluster init-keys` on that cluster)")
        })?;
        federation_peers.insert(name.clone(), key);
    }
    let iap = match &a.iap {
        None => None,
        Some(i) => {
            let path = i
                .jwks_file
                .as_deref()
                .filter(|p| !p.is_empty())
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "auth.iap.jwks_file: required: a JWKS file with the proxy's public keys"
                    )
                })?;
            let jwks = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("auth.iap.jwks_file: reading {path}: {e}"))?;
            let verifier = iris_auth::iap::IapVerifier::from_jwks(&i.signed_header_audience, &jwks)
                .map_err(|e| anyhow::anyhow!("auth.iap: {e}"))?;
            let role = i.unprovisioned_role.as_deref().unwrap_or("dashboard");
            let unprovisioned_role = match role {
                "admin" | "user" | "dashboard" => iris_auth::Role::parse(role),
                _ => None,
            }
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "auth.iap.unprovisioned_role: '{role}' is not admin, user or dashboard"
                )
            })?;
            Some(iris_controller::auth::IapConfig {
                verifier,
                unprovisioned_role,
            })
        }
    };
    let provider = a.provider.as_deref().unwrap_or("");
    if provider == "iap" && iap.is_none() {
        anyhow::bail!(
            "auth.provider: iap needs an auth.iap section (signed_header_audience, jwks_file)"
        );
    }
    if !matches!(provider, "" | "token" | "cidr" | "iap") {
        anyhow::bail!("auth.provider: unknown provider '{provider}' (token, cidr or iap)");
    }
    Ok(Some(iris_controller::auth::AuthConfig {
        issuer: cfg
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "iris".into()),
        keypair,
        previous_public_keys: previous,
        enforcing: !provider.is_empty() || !a.trusted_cidrs.is_empty() || iap.is_some(),
        trusted_cidrs: a.trusted_cidrs.clone(),
        admin_users: a.admin_users.clone(),
        user_roles: a.user_roles.clone(),
        optional: a.optional,
        federation_peers,
        allowed_submitters: a.allowed_submitters.clone(),
        iap,
    }))
}

/// Where `iris login --token` keeps the token.
pub fn token_path() -> std::path::PathBuf {
    dirs::config_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("iris")
        .join("token")
}

/// The token the CLI sends: `MARIN_CLUSTER_TOKEN`, else (inside a task) `IRIS_TASK_TOKEN`, else
/// the one stored by `iris login`.
pub fn cli_token() -> Option<String> {
    std::env::var("MARIN_CLUSTER_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
        .or_else(|| {
            std::env::var("IRIS_TASK_TOKEN")
                .ok()
                .filter(|t| !t.trim().is_empty())
        })
        .or_else(|| {
            std::fs::read_to_string(token_path())
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
        })
}

/// `iris login [--token T | --headless]`: stores the token (mode 0600) for later commands.
/// Without --token the token is read from standard input (the first non-empty line).
pub fn login(token: Option<String>, headless: bool) -> anyhow::Result<i32> {
    let token = match token {
        Some(t) => t,
        None => {
            use std::io::BufRead;
            eprintln!("Paste a token for this cluster (from `iris user token mint USER --signing-key ...` or your cluster admin){}:", if headless { "" } else { ", then press Enter" });
            let mut line = String::new();
            for l in std::io::stdin().lock().lines() {
                let l = l.context("reading the token from standard input")?;
                if !l.trim().is_empty() {
                    line = l.trim().to_string();
                    break;
                }
            }
            if line.is_empty() {
                anyhow::bail!("no token on standard input; pass --token TOKEN");
            }
            line
        }
    };
    let token = token.as_str();
    if token.split('.').count() != 3 {
        anyhow::bail!("--token does not look like a JWT (three dot-separated parts)");
    }
    let p = token_path();
    if let Some(dir) = p.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let _ = std::fs::remove_file(&p);
    write_private(&p, token)?;
    println!("Stored token in {}", p.display());
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls() {
        assert_eq!(parse_ttl("7d").ok(), Some(7 * 86400));
        assert_eq!(parse_ttl("90m").ok(), Some(5400));
        assert_eq!(parse_ttl("3600").ok(), Some(3600));
        assert!(parse_ttl("soon").is_err());
        assert!(parse_ttl("0").is_err());
    }
}
