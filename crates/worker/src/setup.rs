//! Which of an attempt's setup commands (`RuntimeEntrypoint.setup_commands`: the submitter's
//! resolved setup scripts, then the client's runtime-deps script) the worker runs before the
//! command, decided before anything runs.
//!
//! The published client sends a `uv sync` script with every job unless it was submitted with
//! `--no-sync`. A workspace without a `pyproject.toml` has nothing to sync, so such a step is
//! skipped (with a line in the task's log when the submitter asked for extras or packages) and
//! the command runs in the worker's own environment; so is a step that only works inside the
//! venv when no venv will exist. A sync step on a worker without `uv` fails the attempt up front
//! with the fix, rather than with bash's "command not found" halfway through.
//!
//! Pure: the caller says what the workdir and the worker's `PATH` hold.

/// One setup command's fate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Run(String),
    /// Not run; the notice, if any, goes into the task's log.
    Skip(Option<String>),
}

use iris_backend::task_env::runs_uv_sync as syncs;

/// Whether a script does its work only inside an existing `$IRIS_VENV` (the published client's
/// runtime-deps step is `if [ -d "$IRIS_VENV" ]; then … fi`).
fn needs_venv(script: &str) -> bool {
    script
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with("cd "))
        .is_some_and(|l| l.starts_with(r#"if [ -d "$IRIS_VENV" ]"#))
}

/// The steps to take, in order, or the reason the attempt cannot set up on this worker.
/// `has_venv`: the workdir already holds the venv (`$IRIS_VENV`) before setup.
pub fn plan(
    commands: &[String],
    has_pyproject: bool,
    has_venv: bool,
    uv_on_path: bool,
) -> Result<Vec<Step>, String> {
    let commands: Vec<&String> = commands.iter().filter(|c| !c.trim().is_empty()).collect();
    let total = commands.len();
    let mut venv = has_venv;
    let mut steps = Vec::new();
    for (i, script) in commands.into_iter().enumerate() {
        let n = i + 1;
        if syncs(script) {
            if !has_pyproject {
                // Said in the task's log only when the submitter asked for something in
                // particular; the published client's plain default sync is skipped quietly.
                let asked = script.contains("--extra ") || script.contains("--package ");
                steps.push(Step::Skip(asked.then(|| {
                    format!(
                        "[iris setup] step {n}/{total} skipped: it runs `uv sync` and the \
                         workspace has no pyproject.toml, so there is nothing to sync; the \
                         command runs in the worker's environment"
                    )
                })));
                continue;
            }
            if !uv_on_path {
                return Err(format!(
                    "setup step {n}/{total} runs `uv sync`, and uv is not on this worker's PATH: \
                     install uv on the worker (https://docs.astral.sh/uv/) or submit with \
                     --no-sync to run the command without setup"
                ));
            }
            venv = true;
        } else if needs_venv(script) && !venv {
            steps.push(Step::Skip(None));
            continue;
        }
        steps.push(Step::Run(script.clone()));
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SYNC: &str = "set -e\ncd \"$IRIS_WORKDIR\"\nuv sync --all-packages --no-dev\n";
    const SYNC_EXTRA: &str =
        "set -e\ncd \"$IRIS_WORKDIR\"\nuv sync --all-packages --no-dev --extra gpu\n";
    const DEPS: &str = "cd \"$IRIS_WORKDIR\" 2>/dev/null || true\nif [ -d \"$IRIS_VENV\" ]; then\n  uv pip install cloudpickle || true\nfi\n";

    #[test]
    fn without_pyproject_the_sync_and_the_venv_steps_are_skipped_and_others_run() {
        let cmds = vec![
            SYNC_EXTRA.to_string(),
            "echo custom".to_string(),
            DEPS.to_string(),
        ];
        let steps = plan(&cmds, false, false, true).expect("plans");
        assert!(
            matches!(&steps[0], Step::Skip(Some(m)) if m.contains("step 1/3") && m.contains("pyproject.toml")),
            "{steps:?}"
        );
        assert_eq!(steps[1], Step::Run("echo custom".into()));
        assert_eq!(steps[2], Step::Skip(None));
        // The plain default sync is skipped without a notice.
        let steps = plan(&[SYNC.into(), DEPS.into()], false, false, true).expect("plans");
        assert_eq!(steps, vec![Step::Skip(None), Step::Skip(None)]);
    }

    #[test]
    fn with_pyproject_everything_runs_in_order() {
        let steps = plan(&[SYNC.into(), DEPS.into()], true, false, true).expect("plans");
        assert_eq!(steps, vec![Step::Run(SYNC.into()), Step::Run(DEPS.into())]);
        // A venv shipped in the workdir lets the venv step run without a sync.
        assert_eq!(
            plan(&[DEPS.into()], false, true, false),
            Ok(vec![Step::Run(DEPS.into())])
        );
    }

    #[test]
    fn uv_missing_is_refused_before_anything_runs_and_names_the_fix() {
        let e = plan(&[SYNC.into()], true, false, false).expect_err("no uv");
        assert!(
            e.contains("not on this worker's PATH") && e.contains("--no-sync"),
            "{e}"
        );
        // Without a pyproject the sync is skipped, so a missing uv does not matter.
        assert!(plan(&[SYNC.into()], false, false, false).is_ok());
        assert_eq!(
            plan(&["echo hi".into()], true, false, false),
            Ok(vec![Step::Run("echo hi".into())])
        );
    }

    #[test]
    fn blank_scripts_are_dropped_and_uv_sync_is_matched_as_words() {
        assert_eq!(plan(&["  \n".into()], true, false, true), Ok(vec![]));
        assert!(!syncs("echo uv synchronize; ./uvx sync"));
        assert!(!syncs("# uv sync in a comment"));
        assert!(syncs("cd x && uv sync --frozen"));
        assert!(needs_venv(DEPS));
        assert!(!needs_venv("echo hi\nif [ -d \"$IRIS_VENV\" ]; then x; fi"));
    }
}
