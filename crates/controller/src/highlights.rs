//! `root_cause_highlights` for a failed task: the few log lines most likely to name the failure,
//! picked from the tail of its logs so `iris task describe` can show them under "Root cause".

/// How many of the task's most recent log lines are examined.
pub(crate) const LOG_TAIL: usize = 200;
/// Most lines returned.
const MAX_LINES: usize = 20;

/// Words that mark a line as naming a failure (matched case-sensitively as substrings).
const SIGNALS: &[&str] = &[
    "Traceback (most recent call last)",
    "Fatal Python error",
    "Segmentation fault",
    "core dumped",
    "Aborted",
    "OOMKilled",
    "Killed",
    "CUDA error",
    "DEADLINE_EXCEEDED",
    "RESOURCE_EXHAUSTED",
    "panicked at",
];

/// A token such as `ValueError`, `ValueError:` or `java.io.IOException` names an error type.
fn names_error_type(line: &str) -> bool {
    line.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.'))
        .map(|t| t.rsplit('.').next().unwrap_or(t))
        .any(|t| t.ends_with("Error") || t.ends_with("Exception"))
}

fn is_signal(line: &str) -> bool {
    let body = line.trim_start();
    SIGNALS.iter().any(|s| line.contains(s))
        || names_error_type(line)
        || line.to_ascii_lowercase().contains("out of memory")
        || (body.starts_with("File \"") && body.contains("\", line "))
}

/// A progress-bar frame (`45%|####5     | 450/1000`) or an HTTP access-log line.
fn is_noise(line: &str) -> bool {
    let bar = line
        .find("%|")
        .map(|i| line[i + 2..].contains('|'))
        .unwrap_or(false);
    let access = line.contains(" HTTP/1.") && (line.contains("\"GET ") || line.contains("\"POST "));
    bar || access
}

/// Drops noise and consecutive repeats, then keeps the lines that name a failure, or the
/// remaining tail when none does; at most [`MAX_LINES`], the most recent ones.
pub(crate) fn root_cause(lines: &[String]) -> Vec<String> {
    let mut kept: Vec<&str> = Vec::new();
    for l in lines {
        if is_noise(l) || kept.last() == Some(&l.as_str()) {
            continue;
        }
        kept.push(l);
    }
    let signals: Vec<&str> = kept.iter().copied().filter(|l| is_signal(l)).collect();
    let chosen = if signals.is_empty() { kept } else { signals };
    chosen[chosen.len().saturating_sub(MAX_LINES)..]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(lines: &[&str]) -> Vec<String> {
        lines.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn keeps_the_traceback_and_drops_chatter() {
        let logs = v(&[
            "starting",
            "step 1 loss=0.5",
            "Loading:  45%|####5     | 450/1000 [00:12<00:15,  3.21it/s]",
            "Traceback (most recent call last):",
            "  File \"train.py\", line 3, in <module>",
            "    main()",
            "ValueError: bad shape",
        ]);
        assert_eq!(
            root_cause(&logs),
            v(&[
                "Traceback (most recent call last):",
                "  File \"train.py\", line 3, in <module>",
                "ValueError: bad shape"
            ])
        );
    }

    #[test]
    fn falls_back_to_the_tail_without_repeats_or_noise() {
        let logs = v(&["a", "b", "b", "127.0.0.1 - \"GET /x HTTP/1.1\" 200", "c"]);
        assert_eq!(root_cause(&logs), v(&["a", "b", "c"]));
        assert!(root_cause(&[]).is_empty());
    }

    #[test]
    fn returns_at_most_twenty_of_the_latest() {
        let logs: Vec<String> = (0..50).map(|i| format!("RuntimeError {i}")).collect();
        let got = root_cause(&logs);
        assert_eq!(got.len(), 20);
        assert_eq!(got[0], "RuntimeError 30");
        assert_eq!(got[19], "RuntimeError 49");
    }

    #[test]
    fn error_words_must_be_type_names() {
        assert!(is_signal("java.io.IOException: closed"));
        assert!(is_signal("CUDA out of memory. Tried to allocate"));
        assert!(!is_signal("no errors so far"));
        assert!(!is_signal("Terror in the night"));
    }
}
