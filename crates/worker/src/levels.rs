//! The level of a captured task log line, as the reference assigns it: a glog-style prefix in
//! the line wins (`W20260102 12:34:56 …` is WARNING whichever stream it came from), even behind a
//! multi-GPU rank tag (`[rank3] `); an unprefixed tqdm progress frame on stderr is INFO; any
//! other line takes its stream's default (stdout INFO, stderr ERROR).
//!
//! Pure: no I/O. The patterns are small enough that a byte scanner reads more plainly than a
//! regex here.

/// `finelog.logging.LogLevel` codes.
pub const DEBUG: i32 = 1;
pub const INFO: i32 = 2;
pub const WARNING: i32 = 3;
pub const ERROR: i32 = 4;
pub const CRITICAL: i32 = 5;

/// The level of one line from `stdout` (`is_stderr == false`) or `stderr`.
pub fn classify(is_stderr: bool, line: &str) -> i32 {
    let body = strip_rank_tag(line);
    if let Some(level) = prefix_level(body) {
        return level;
    }
    if is_stderr && is_progress_bar(body) {
        return INFO;
    }
    if is_stderr {
        ERROR
    } else {
        INFO
    }
}

/// The level of a setup-phase (`build`) line: its prefix's, else UNKNOWN (0), which every level
/// filter lets through, as the reference treats streams without a default.
pub fn classify_build(line: &str) -> i32 {
    prefix_level(strip_rank_tag(line)).unwrap_or(0)
}

/// The level named by a single-letter prefix followed by a digit (`I2026…`), if any.
fn prefix_level(line: &str) -> Option<i32> {
    let b = line.as_bytes();
    if b.len() < 2 || !b[1].is_ascii_digit() {
        return None;
    }
    match b[0] {
        b'D' => Some(DEBUG),
        b'I' => Some(INFO),
        b'W' => Some(WARNING),
        b'E' => Some(ERROR),
        b'C' => Some(CRITICAL),
        _ => None,
    }
}

/// Drops one leading `[rank<digits>] ` tag.
fn strip_rank_tag(line: &str) -> &str {
    let Some(rest) = line.strip_prefix("[rank") else {
        return line;
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return line;
    }
    rest[digits..].strip_prefix("] ").unwrap_or(line)
}

/// Whether the line holds a tqdm frame: a `NN%|…|` bar, or the bracketed stats
/// `[MM:SS<…, 3.21it/s]` / `[MM:SS, 1.20s/it]` that every frame carries.
fn is_progress_bar(line: &str) -> bool {
    has_percent_bar(line) || has_tqdm_stats(line)
}

fn has_percent_bar(line: &str) -> bool {
    let b = line.as_bytes();
    b.windows(2).enumerate().any(|(i, w)| {
        w == b"%|" && i > 0 && b[i - 1].is_ascii_digit() && b[i + 2..].contains(&b'|')
    })
}

/// `[` + 1–2 digits `:` 2 digits (optionally `:` 2 more), then anything but `]` up to a comma,
/// optional spaces, a rate that starts with a digit, `.` or `?`, and a `/` in the rate.
fn has_tqdm_stats(line: &str) -> bool {
    line.match_indices('[').any(|(i, _)| {
        let rest = &line[i + 1..];
        let Some(inner) = rest.split(']').next() else {
            return false;
        };
        let clock_len = clock_prefix(inner);
        if clock_len == 0 {
            return false;
        }
        let Some((_, after_comma)) = inner[clock_len..].split_once(',') else {
            return false;
        };
        let rate = after_comma.trim_start();
        let first_ok = rate
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit() || c == '.' || c == '?');
        let rate_word = rate.split([' ', ',']).next().unwrap_or("");
        first_ok && rate_word.contains('/') && !rate_word.ends_with('/')
    })
}

/// The length of a leading `M:SS`, `MM:SS` or `MM:SS:SS` clock, or 0.
fn clock_prefix(s: &str) -> usize {
    let b = s.as_bytes();
    let lead = b.iter().take_while(|c| c.is_ascii_digit()).count();
    if !(1..=2).contains(&lead) {
        return 0;
    }
    let two = |at: usize| {
        b.get(at) == Some(&b':')
            && b.get(at + 1).is_some_and(u8::is_ascii_digit)
            && b.get(at + 2).is_some_and(u8::is_ascii_digit)
    };
    if !two(lead) {
        return 0;
    }
    if two(lead + 3) {
        lead + 6
    } else {
        lead + 3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_wins_over_the_stream() {
        assert_eq!(classify(true, "I20260102 12:34:56 train step 3"), INFO);
        assert_eq!(classify(false, "W20260102 12:34:56 low disk"), WARNING);
        assert_eq!(classify(false, "E20260102 12:34:56 boom"), ERROR);
        assert_eq!(classify(true, "D20260102 12:34:56 x"), DEBUG);
        assert_eq!(classify(false, "C20260102 12:34:56 x"), CRITICAL);
        assert_eq!(classify(true, "[rank3] W20260102 12:34:56 x"), WARNING);
    }

    #[test]
    fn lookalikes_are_not_prefixes() {
        // A capital letter not followed by a digit, an unknown letter, a rank tag without digits.
        assert_eq!(classify(false, "Warning: something"), INFO);
        assert_eq!(classify(true, "Error: something"), ERROR);
        assert_eq!(classify(false, "X2026 something"), INFO);
        assert_eq!(classify(true, "[rank] I2026 x"), ERROR);
        assert_eq!(classify(false, "W"), INFO);
        assert_eq!(classify(false, ""), INFO);
    }

    #[test]
    fn tqdm_frames_on_stderr_are_info() {
        for frame in [
            "Loading:  45%|####5     | 450/1000 [00:12<00:15,  3.21it/s]",
            "450it [00:12,  3.21it/s]",
            "step [1:02:03, 1.20s/it]",
            "100%|██████████| 10/10 [00:01<00:00, 9.8it/s]",
            "  5%|5         | 1/20 [00:00<?, ?it/s]",
        ] {
            assert_eq!(classify(true, frame), INFO, "{frame}");
        }
        for not_a_frame in [
            "Traceback (most recent call last):",
            "[12:00] done, ok",
            "ratio 50% | not a bar",
        ] {
            assert_eq!(classify(true, not_a_frame), ERROR, "{not_a_frame}");
        }
    }
}
