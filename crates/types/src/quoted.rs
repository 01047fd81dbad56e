//! Quoting user input in messages without `Debug` formatting.

use std::fmt;

/// `'text'` for user-facing messages: the text in single quotes with quotes, backslashes and
/// control characters escaped, so an empty string, a stray newline or trailing space is visible.
/// (`{:?}` would do this too, but its output is Rust's, not the message's.)
#[derive(Clone, Copy)]
pub struct Quoted<'a>(pub &'a str);

/// [`Quoted`] of `s`.
pub fn quoted(s: &str) -> Quoted<'_> {
    Quoted(s)
}

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write;
        f.write_char('\'')?;
        for c in self.0.chars() {
            match c {
                '\'' => f.write_str("\\'")?,
                '\\' => f.write_str("\\\\")?,
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                c if c.is_control() => write!(f, "\\u{{{:04x}}}", c as u32)?,
                c => f.write_char(c)?,
            }
        }
        f.write_char('\'')
    }
}

#[cfg(test)]
mod tests {
    use super::quoted;

    #[test]
    fn quotes_and_escapes() {
        assert_eq!(quoted("/alice/train").to_string(), "'/alice/train'");
        assert_eq!(quoted("").to_string(), "''");
        assert_eq!(quoted("a b\n").to_string(), "'a b\\n'");
        assert_eq!(quoted("it's").to_string(), "'it\\'s'");
        assert_eq!(quoted("\u{7}").to_string(), "'\\u{0007}'");
        assert_eq!(quoted("ü").to_string(), "'ü'");
    }
}
