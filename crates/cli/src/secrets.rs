//! `job run --secret NAME SOURCE` and `--secret-behavior`: the secrets a job carries, resolved on
//! the submitter's machine as the published CLI resolves them. A source is `env:VAR` or
//! `file:PATH` (value trimmed); a bare literal is refused so a secret never sits in shell history.
//! With `inherit` (the default) the submitter's own HF, W&B and CoreWeave credentials and, inside
//! a task, its delivered secrets are forwarded too; explicit ones win. The worker writes them as
//! files under `$RIGGING_SECRETS_DIR`; the controller keeps them out of every display.

use anyhow::Context;
use std::collections::BTreeMap;

/// Credentials forwarded from the submitter's environment under `inherit`.
const FORWARDED: [&str; 4] = ["HF_TOKEN", "WANDB_API_KEY", "CW_KEY_ID", "CW_KEY_SECRET"];

use iris_types::ids::valid_secret_name as valid_name;

/// One source's value (`None`: absent).
fn fetch(source: &str) -> anyhow::Result<Option<String>> {
    if let Some(var) = source.strip_prefix("env:") {
        anyhow::ensure!(
            !var.is_empty(),
            "{source}: the env reference names no variable"
        );
        return Ok(std::env::var(var).ok().map(|v| v.trim().to_string()));
    }
    if let Some(path) = source.strip_prefix("file:") {
        anyhow::ensure!(
            !path.is_empty(),
            "{source}: the file reference names no path"
        );
        return match std::fs::read_to_string(path) {
            Ok(v) => Ok(Some(v.trim().to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(anyhow::anyhow!("reading {path}: {e}")),
        };
    }
    if source.starts_with("gcp-secret://") {
        anyhow::bail!("gcp-secret:// sources are not read by this CLI; use env:VAR or file:PATH");
    }
    anyhow::bail!(
        "not a secret reference: use env:VAR or file:PATH (a literal value is not accepted)"
    )
}

/// The job's secrets from `--secret` pairs (`[NAME, SOURCE, NAME, SOURCE, …]`) and the behavior.
pub fn for_submission(
    pairs: &[String],
    behavior: &str,
) -> anyhow::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    if behavior == "inherit" {
        for name in FORWARDED {
            if let Some(v) = std::env::var(name).ok().filter(|v| !v.trim().is_empty()) {
                out.insert(name.to_string(), v.trim().to_string());
            }
        }
        // Inside a task: forward the secrets delivered to it.
        if let Some(dir) = std::env::var_os("RIGGING_SECRETS_DIR") {
            if let Ok(rd) = std::fs::read_dir(&dir) {
                for e in rd.flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if valid_name(&name) && e.path().is_file() {
                        if let Ok(v) = std::fs::read_to_string(e.path()) {
                            out.insert(name, v.trim().to_string());
                        }
                    }
                }
            }
        }
    }
    for pair in pairs.chunks(2) {
        let [name, source] = pair else {
            anyhow::bail!("--secret: expected NAME SOURCE");
        };
        anyhow::ensure!(
            valid_name(name),
            "--secret {name}: a secret name uses letters, digits, `_`, `.` and `-`, starting with a letter, digit or `_`"
        );
        let value = fetch(source)
            .with_context(|| format!("--secret {name}"))?
            .ok_or_else(|| anyhow::anyhow!("--secret {name}: {source} is not set"))?;
        anyhow::ensure!(!value.is_empty(), "--secret {name}: {source} is empty");
        out.insert(name.clone(), value);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_resolve_and_bad_ones_name_the_fix() {
        let dir = tempfile::tempdir().expect("dir");
        let f = dir.path().join("k");
        std::fs::write(&f, "from-file\n").expect("write");
        let pairs = vec!["FILE_KEY".to_string(), format!("file:{}", f.display())];
        let got = for_submission(&pairs, "isolate").expect("resolves");
        assert_eq!(got["FILE_KEY"], "from-file");
        let e = for_submission(&["K".into(), "hunter2".into()], "isolate").expect_err("literal");
        assert!(format!("{e:#}").contains("env:VAR or file:PATH"), "{e:#}");
        let e = for_submission(&["../x".into(), "env:HOME".into()], "isolate").expect_err("name");
        assert!(e.to_string().contains("secret name"), "{e}");
        let e = for_submission(
            &["K".into(), "env:IRIS_TEST_SURELY_UNSET_VARIABLE".into()],
            "isolate",
        )
        .expect_err("unset");
        assert!(e.to_string().contains("is not set"), "{e}");
    }
}
