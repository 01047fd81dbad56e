//! `iris cluster init-keys` and `iris user token mint`.

use anyhow::Context;
use clap::Args;
use std::collections::BTreeMap;

#[derive(Args)]
pub struct InitKeysArgs {
    /// Write the private key here (mode 0600) and print its `file:` reference.
    #[arg(long)]
    pub out_file: Option<std::path::PathBuf>,
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
    #[arg(long, default_value = "user", value_parser = ["user", "admin", "dashboard"])]
    pub role: String,
}

/// Resolves a secret reference (`file:PATH`, `env:VAR`) to its text.
pub fn resolve_secret(reference: &str) -> anyhow::Result<String> {
    if let Some(p) = reference.strip_prefix("file:") {
        return std::fs::read_to_string(p).with_context(|| format!("reading signing key {p}"));
    }
    if let Some(v) = reference.strip_prefix("env:") {
        return std::env::var(v).with_context(|| format!("signing key: environment variable {v} is not set"));
    }
    anyhow::bail!("signing key {reference:?}: use file:PATH or env:VAR")
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
    let n: u64 = num.parse().map_err(|_| anyhow::anyhow!("--ttl {s:?}: expected a number with s, m, h or d (e.g. 7d)"))?;
    if n == 0 {
        anyhow::bail!("--ttl must be positive");
    }
    Ok(n * mult)
}

pub fn init_keys(a: InitKeysArgs) -> anyhow::Result<i32> {
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
        .with_context(|| format!("creating {} (refusing to overwrite an existing key)", p.display()))?;
    f.write_all(pem.as_bytes())?;
    Ok(())
}

pub fn mint(a: MintArgs) -> anyhow::Result<i32> {
    let user = iris_types::ids::validate_user(&a.user).map_err(anyhow::Error::msg)?;
    let ttl = parse_ttl(&a.ttl)?;
    let key = iris_auth::Keypair::from_pem(&resolve_secret(&a.signing_key)?).map_err(anyhow::Error::msg)?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let token = key.mint(&a.issuer, "iris", &user, &a.role, ttl, now, BTreeMap::new()).map_err(anyhow::Error::msg)?;
    println!("{token}");
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
