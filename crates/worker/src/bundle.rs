//! Workspace bundles: fetch by sha256 from the controller, verify, and unzip safely.

use anyhow::{bail, Context};
use sha2::Digest;
use std::io::Read;
use std::path::{Component, Path};

/// Largest total size a bundle may unpack to.
pub const MAX_UNPACKED_BYTES: u64 = 1 << 30;
/// Most entries a bundle may hold.
pub const MAX_ENTRIES: usize = 100_000;

/// Fetches `GET <controller>/blobs/<sha>` (3 tries), verifying the hash; caches under `cache`.
pub async fn fetch(
    http: &reqwest::Client,
    controller: &str,
    sha: &str,
    cache: &Path,
) -> anyhow::Result<Vec<u8>> {
    let cached = cache.join(sha);
    if let Ok(b) = tokio::fs::read(&cached).await {
        if hex::encode(sha2::Sha256::digest(&b)) == sha {
            return Ok(b);
        }
    }
    let url = format!("{}/blobs/{sha}", controller.trim_end_matches('/'));
    let mut last = None;
    for attempt in 0..3 {
        if attempt > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(200 * attempt)).await;
        }
        match http
            .get(&url)
            .send()
            .await
            .and_then(|r| r.error_for_status())
        {
            Ok(r) => match r.bytes().await {
                Ok(b) => {
                    let got = hex::encode(sha2::Sha256::digest(&b));
                    if got != sha {
                        last = Some(anyhow::anyhow!(
                            "bundle {sha} failed verification (got {got})"
                        ));
                        continue;
                    }
                    let _ = tokio::fs::create_dir_all(cache).await;
                    let _ = tokio::fs::write(&cached, &b).await;
                    return Ok(b.to_vec());
                }
                Err(e) => last = Some(e.into()),
            },
            Err(e) => last = Some(e.into()),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("fetching {url} failed")))
}

/// Checks a relative path from a bundle or workdir file: no absolute paths, no `..`.
pub fn safe_relative(name: &str) -> anyhow::Result<&Path> {
    let p = Path::new(name);
    if name.is_empty()
        || p.components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        bail!("refusing unsafe path '{name}' (absolute or escapes the workdir)");
    }
    Ok(p)
}

/// Unzips into `dest`, refusing path escapes, links and oversize content.
pub fn unzip(data: &[u8], dest: &Path) -> anyhow::Result<()> {
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(data))
        .context("bundle is not a valid zip archive")?;
    if z.len() > MAX_ENTRIES {
        bail!("bundle has {} entries (limit {MAX_ENTRIES})", z.len());
    }
    let mut total: u64 = 0;
    for i in 0..z.len() {
        let mut f = z.by_index(i)?;
        let name = f.name().to_string();
        let rel = safe_relative(&name)?;
        let out = dest.join(rel);
        if f.is_dir() {
            std::fs::create_dir_all(&out)?;
            continue;
        }
        if f.is_symlink() {
            bail!("refusing symlink '{name}' in bundle");
        }
        if let Some(parent) = out.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut buf = Vec::new();
        let n = (&mut f)
            .take(MAX_UNPACKED_BYTES - total + 1)
            .read_to_end(&mut buf)?;
        total += n as u64;
        if total > MAX_UNPACKED_BYTES {
            bail!("bundle unpacks to more than {MAX_UNPACKED_BYTES} bytes");
        }
        std::fs::write(&out, &buf).with_context(|| format!("writing {}", out.display()))?;
        #[cfg(unix)]
        if let Some(mode) = f.unix_mode() {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&out, std::fs::Permissions::from_mode(mode & 0o755));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn zip_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        for (n, d) in entries {
            w.start_file(*n, zip::write::SimpleFileOptions::default())
                .expect("start");
            w.write_all(d).expect("write");
        }
        w.finish().expect("finish").into_inner()
    }

    #[test]
    fn unzips_and_refuses_escapes() {
        let d = tempfile::tempdir().expect("tempdir");
        unzip(&zip_of(&[("a/b.txt", b"hi"), ("c.txt", b"x")]), d.path()).expect("ok");
        assert_eq!(
            std::fs::read(d.path().join("a/b.txt")).expect("read"),
            b"hi"
        );
        assert!(unzip(&zip_of(&[("../evil", b"x")]), d.path()).is_err());
        assert!(unzip(&zip_of(&[("/etc/evil", b"x")]), d.path()).is_err());
        assert!(unzip(b"not a zip", d.path()).is_err());
    }
}
