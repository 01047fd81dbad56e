//! The peer-side `auth.allowed_submitters` check (§2.2).

/// The identity a loopback or CIDR-trusted caller gets; it never federates implicitly.
pub const LOCAL_ADMIN: &str = "local_admin";

/// Whether `user` may submit through a federation handoff under `patterns`.
///
/// Each pattern is one of:
/// * `*`: any user (except `local_admin`);
/// * `*@domain`: any `name@domain`, the domain compared case-insensitively;
/// * anything else: that exact identity, case-sensitively.
///
/// An empty list admits nobody, and so does an empty user. `local_admin` is admitted only
/// by a literal `local_admin` entry. Surrounding whitespace in patterns is ignored.
pub fn submitter_admitted(patterns: &[String], user: &str) -> bool {
    if user.is_empty() {
        return false;
    }
    patterns.iter().map(|p| p.trim()).any(|p| {
        if user == LOCAL_ADMIN {
            return p == LOCAL_ADMIN;
        }
        if p == "*" {
            return true;
        }
        if let Some(domain) = p.strip_prefix("*@") {
            return match user.rsplit_once('@') {
                Some((name, d)) => !name.is_empty() && !domain.is_empty() && domain_eq(d, domain),
                None => false,
            };
        }
        p == user
    })
}

fn domain_eq(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b) || a.to_lowercase() == b.to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admitted(patterns: &[&str], user: &str) -> bool {
        let patterns: Vec<String> = patterns.iter().map(|p| p.to_string()).collect();
        submitter_admitted(&patterns, user)
    }

    #[test]
    fn star_admits_anyone_but_local_admin() {
        assert!(admitted(&["*"], "alice@example.com"));
        assert!(admitted(&["*"], "svc-bot"));
        assert!(!admitted(&["*"], "local_admin"));
        assert!(!admitted(&["*"], ""));
    }

    #[test]
    fn domain_patterns_ignore_case_of_the_domain_only() {
        let p = ["*@Example.COM"];
        assert!(admitted(&p, "alice@example.com"));
        assert!(admitted(&p, "Bob@EXAMPLE.com"));
        assert!(!admitted(&p, "alice@example.org"));
        assert!(!admitted(&p, "alice@sub.example.com"));
        assert!(!admitted(&p, "@example.com"));
        assert!(!admitted(&p, "example.com"));
        assert!(!admitted(&["*@"], "alice@"));
    }

    #[test]
    fn exact_identities_are_case_sensitive() {
        let p = ["alice@example.com", " bob "];
        assert!(admitted(&p, "alice@example.com"));
        assert!(!admitted(&p, "Alice@example.com"));
        assert!(admitted(&p, "bob"));
        assert!(!admitted(&p, "carol"));
    }

    #[test]
    fn empty_list_admits_nobody() {
        assert!(!admitted(&[], "alice@example.com"));
        assert!(!admitted(&[], "local_admin"));
    }

    #[test]
    fn local_admin_needs_a_literal_entry() {
        assert!(admitted(&["local_admin"], "local_admin"));
        assert!(!admitted(&["*", "*@local"], "local_admin"));
    }
}
