//! The setup a submitted job carries, rendered client-side as the published CLI renders it: a
//! `uv sync` of the submitter's workspace (with `--extra` / `--sync-package`), then a best-effort
//! install of the runtime dependencies callables and the profiler need into that venv. The worker
//! runs them in order before the command (`RuntimeEntrypoint.setup_commands`); `--no-sync` sends
//! none.

/// Shell-quotes one word for bash (single quotes; a quote inside becomes `'\''`).
fn quote(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/=@+,".contains(c))
    {
        return word.to_string();
    }
    format!("'{}'", word.replace('\'', r"'\''"))
}

const LINK_MODE: &str = r#"--link-mode "${UV_LINK_MODE:-copy}""#;

/// The workspace sync: every member unless `packages` scopes it, never the dev group, with the
/// named extras (`extra` or `package:extra`; the package part is dropped, as uv's `--extra`
/// applies to whichever member defines it). `--frozen` when a lockfile came with the bundle.
pub fn sync_script(extras: &[String], packages: &[String]) -> String {
    let mut cmd = vec![
        "uv sync".to_string(),
        "$([ -f uv.lock ] && echo '--frozen' || echo '')".to_string(),
        LINK_MODE.to_string(),
    ];
    if packages.is_empty() {
        cmd.push("--all-packages".into());
    } else {
        cmd.extend(packages.iter().map(|p| format!("--package {}", quote(p))));
    }
    cmd.push("--no-dev".into());
    for e in extras {
        let name = e.split_once(':').map(|x| x.1).unwrap_or(e);
        cmd.push(format!("--extra {}", quote(name)));
    }
    format!(
        "set -e\ncd \"$IRIS_WORKDIR\"\necho 'syncing deps'\n{}\n",
        cmd.join(" ")
    )
}

/// Installs cloudpickle, py-spy and memray into `$IRIS_VENV` when a venv exists; a failure only
/// warns.
pub fn runtime_deps_script() -> String {
    format!(
        "cd \"$IRIS_WORKDIR\" 2>/dev/null || true\nif [ -d \"$IRIS_VENV\" ]; then\n  echo 'installing iris runtime deps'\n  uv pip install {LINK_MODE} cloudpickle py-spy memray || echo '[iris setup] runtime deps install failed; continuing'\nfi\n"
    )
}

/// `(EnvironmentConfig.setup_scripts, RuntimeEntrypoint.setup_commands)` for a submission.
pub fn for_submission(
    no_sync: bool,
    extras: &[String],
    packages: &[String],
) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    if no_sync {
        if !packages.is_empty() {
            anyhow::bail!(
                "--no-sync skips setup entirely, so it cannot be combined with --sync-package"
            );
        }
        return Ok((Vec::new(), Vec::new()));
    }
    let user = vec![sync_script(extras, packages)];
    let mut commands = user.clone();
    commands.push(runtime_deps_script());
    Ok((user, commands))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sync_carries_extras_packages_and_quotes() {
        let s = sync_script(&["gpu".into(), "marin:tpu".into()], &["core pkg".into()]);
        assert!(s.contains("--package 'core pkg'"), "{s}");
        assert!(s.contains("--extra gpu --extra tpu"), "{s}");
        assert!(
            s.contains("--no-dev") && !s.contains("--all-packages"),
            "{s}"
        );
        assert!(sync_script(&[], &[]).contains("--all-packages"));
        assert_eq!(quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn no_sync_sends_nothing_and_refuses_a_package_scope() {
        assert_eq!(
            for_submission(true, &[], &[]).expect("ok"),
            (Vec::new(), Vec::new())
        );
        let e = for_submission(true, &[], &["p".into()]).expect_err("conflict");
        assert!(e.to_string().contains("--sync-package"), "{e}");
        let (user, commands) = for_submission(false, &[], &[]).expect("ok");
        assert_eq!(user.len(), 1);
        assert_eq!(commands.len(), 2);
        assert!(commands[1].contains("cloudpickle"));
    }
}
