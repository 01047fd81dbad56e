//! What the node agent's containers share with the host: paths rewritten into the pod's own
//! directories, process groups, exit codes, timestamps.

/// Replaces container paths (`/app`, `/app/x`, `"/app"`) by their local directories, at path
/// boundaries only, longest container path first.
pub(crate) fn rewrite_paths(s: &str, map: &[(String, String)]) -> String {
    // One left-to-right pass, trying the mappings in the caller's order (longest first) at each
    // path boundary: a replacement is never rewritten again (a volume's directory under /tmp
    // must not be remapped by the pod's own /tmp mount).
    let starts_path =
        |c: char| !(c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | '$' | '~'));
    let ends_path = |c: char| !(c.is_alphanumeric() || matches!(c, '_' | '-' | '.'));
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    let mut prev: Option<char> = None;
    'scan: while i < s.len() {
        let rest = &s[i..];
        if prev.is_none_or(starts_path) {
            for (from, to) in map {
                if from.is_empty() || from == "/" {
                    continue;
                }
                if let Some(after) = rest.strip_prefix(from.as_str()) {
                    if after.chars().next().is_none_or(ends_path) {
                        out.push_str(to);
                        prev = from.chars().last();
                        i += from.len();
                        continue 'scan;
                    }
                }
            }
        }
        let Some(c) = rest.chars().next() else { break };
        out.push(c);
        prev = Some(c);
        i += c.len_utf8();
    }
    out
}

/// Signals process group `pgid`; a non-positive id is ignored (killpg(0) would signal the
/// caller's own group), and a group that is already gone is fine.
pub(crate) fn signal_group(pgid: i32, sig: nix::sys::signal::Signal) {
    if pgid > 0 {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), sig);
    }
}

/// A process's exit code, or 128 + the signal that ended it, as a kubelet reports it.
pub(crate) fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(9))
}

/// Now, as the API server writes times.
pub(crate) fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_at_path_boundaries() {
        let map = vec![
            ("/app".to_string(), "/tmp/p/app".to_string()),
            ("/iris/outputs".to_string(), "/tmp/p/out".to_string()),
        ];
        assert_eq!(
            rewrite_paths("set -e; cd /app; ls /app/x \"/app\" /apple /x/app $IRIS_WORKDIR /iris/outputs/a", &map),
            "set -e; cd /tmp/p/app; ls /tmp/p/app/x \"/tmp/p/app\" /apple /x/app $IRIS_WORKDIR /tmp/p/out/a"
        );
        assert_eq!(rewrite_paths("/app", &map), "/tmp/p/app");
        assert_eq!(rewrite_paths("/app/.venv", &map), "/tmp/p/app/.venv");
        // A replacement is not rewritten again by a shorter mapping it happens to start with.
        let map = vec![
            (
                "/run/rigging/secrets".to_string(),
                "/tmp/p/secrets".to_string(),
            ),
            ("/tmp".to_string(), "/tmp/p/tmp".to_string()),
        ];
        assert_eq!(
            rewrite_paths("/run/rigging/secrets/TOKEN /tmp/x", &map),
            "/tmp/p/secrets/TOKEN /tmp/p/tmp/x"
        );
    }
}
