//! Job, task and attempt identifiers (reference §1).
//!
//! Wire forms: job `/<user>/<job>[/<child>…]`, task `<job>/<index>`, attempt `<task>:<N>`.

use std::fmt;

/// Why a name was refused. Messages name the rule and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("job name {} must start with '/' (e.g. /alice/train)", crate::quoted(.0))]
    NoLeadingSlash(String),
    #[error("job name {} needs at least a user and a job component (e.g. /alice/train)", crate::quoted(.0))]
    TooShort(String),
    #[error("job name {} has an empty or whitespace-only component", crate::quoted(.0))]
    EmptyComponent(String),
    #[error("task id {} must end in a task index (e.g. /alice/train/0)", crate::quoted(.0))]
    NotATask(String),
    #[error("attempt id {} must be <task>:<attempt number> (e.g. /alice/train/0:1)", crate::quoted(.0))]
    NotAnAttempt(String),
    #[error("child job name {} must not be an integer (integers name tasks)", crate::quoted(.0))]
    IntegerChild(String),
}

/// A validated job name such as `/alice/train` or `/alice/train/eval`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobName(String);

impl JobName {
    /// Parses and validates a wire job name.
    pub fn parse(s: &str) -> Result<Self, IdError> {
        let rest = s
            .strip_prefix('/')
            .ok_or_else(|| IdError::NoLeadingSlash(s.to_string()))?;
        let parts: Vec<&str> = rest.split('/').collect();
        if parts.len() < 2 {
            return Err(IdError::TooShort(s.to_string()));
        }
        if parts.iter().any(|p| p.trim().is_empty()) {
            return Err(IdError::EmptyComponent(s.to_string()));
        }
        Ok(JobName(s.to_string()))
    }

    /// Builds `/<user>/<name>` for a root job.
    pub fn root(user: &str, name: &str) -> Result<Self, IdError> {
        Self::parse(&format!("/{user}/{name}"))
    }

    /// Builds `<self>/<name>` for a child job; integer names are refused.
    pub fn child(&self, name: &str) -> Result<Self, IdError> {
        if name.parse::<i64>().is_ok() {
            return Err(IdError::IntegerChild(name.to_string()));
        }
        Self::parse(&format!("{}/{name}", self.0))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn components(&self) -> impl Iterator<Item = &str> {
        self.0[1..].split('/')
    }

    /// The owning user (first component).
    pub fn user(&self) -> &str {
        self.components().next().unwrap_or_default()
    }

    /// Depth: a root job is 1, each child adds one.
    pub fn depth(&self) -> u32 {
        (self.components().count() as u32).saturating_sub(1)
    }

    pub fn is_root(&self) -> bool {
        self.depth() == 1
    }

    /// The parent job, `None` for a root job.
    pub fn parent(&self) -> Option<JobName> {
        if self.is_root() {
            return None;
        }
        let idx = self.0.rfind('/')?;
        Some(JobName(self.0[..idx].to_string()))
    }

    /// The root job of this tree (`/<user>/<root>`).
    pub fn root_job(&self) -> JobName {
        let mut it = self.components();
        let user = it.next().unwrap_or_default();
        let root = it.next().unwrap_or_default();
        JobName(format!("/{user}/{root}"))
    }

    /// Task `index` of this job.
    pub fn task(&self, index: u32) -> TaskId {
        TaskId {
            job: self.clone(),
            index,
        }
    }

    /// Whether `other` is this job or one of its descendants.
    pub fn contains(&self, other: &JobName) -> bool {
        other.0 == self.0 || other.0.starts_with(&format!("{}/", self.0))
    }
}

impl fmt::Display for JobName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl fmt::Debug for JobName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The job part of a task id (`/u/job/3` → `/u/job`), without parsing or validating it (a
/// string without a `/` is returned whole): for hot paths over ids the store already validated.
pub fn job_of_task(task_id: &str) -> &str {
    task_id.rsplit_once('/').map_or(task_id, |(job, _)| job)
}

/// A task: `<job>/<index>`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId {
    pub job: JobName,
    pub index: u32,
}

impl TaskId {
    /// Parses `<job>/<index>`; the job part must itself be a valid job name.
    pub fn parse(s: &str) -> Result<Self, IdError> {
        let (job, idx) = s
            .rsplit_once('/')
            .ok_or_else(|| IdError::NotATask(s.to_string()))?;
        let index: u32 = idx.parse().map_err(|_| IdError::NotATask(s.to_string()))?;
        let job = JobName::parse(job).map_err(|_| IdError::NotATask(s.to_string()))?;
        Ok(TaskId { job, index })
    }

    pub fn attempt(&self, attempt: u32) -> AttemptId {
        AttemptId {
            task: self.clone(),
            attempt,
        }
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.job, self.index)
    }
}
impl fmt::Debug for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// An attempt: `<task>:<N>` (split at the last `:`).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AttemptId {
    pub task: TaskId,
    pub attempt: u32,
}

impl AttemptId {
    pub fn parse(s: &str) -> Result<Self, IdError> {
        let (task, n) = s
            .rsplit_once(':')
            .ok_or_else(|| IdError::NotAnAttempt(s.to_string()))?;
        let attempt: u32 = n
            .parse()
            .map_err(|_| IdError::NotAnAttempt(s.to_string()))?;
        let task = TaskId::parse(task).map_err(|_| IdError::NotAnAttempt(s.to_string()))?;
        Ok(AttemptId { task, attempt })
    }
}

impl fmt::Display for AttemptId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.task, self.attempt)
    }
}
impl fmt::Debug for AttemptId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Whether `name` may name a job's secret. It becomes a file name on the worker, so: letters,
/// digits, `_`, `.` and `-`, starting with a letter, digit or `_` (no separator, no `..`).
pub fn valid_secret_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
}

/// Validates a user name: non-empty after trimming, no `/`.
pub fn validate_user(user: &str) -> Result<String, String> {
    let u = user.trim();
    if u.is_empty() {
        return Err("user must not be empty (pass --user NAME or set IRIS_USER)".into());
    }
    if u.contains('/') {
        return Err(format!("user {} must not contain '/'", crate::quoted(u)));
    }
    Ok(u.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names_are_plain_file_names() {
        for ok in ["HF_TOKEN", "service.key", "_x-1", "9"] {
            assert!(valid_secret_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", ".hidden", "-x", "a/b", "a b", "é"] {
            assert!(!valid_secret_name(bad), "{bad}");
        }
    }

    #[test]
    fn job_names() {
        let j = JobName::parse("/alice/train").expect("valid");
        assert_eq!(j.user(), "alice");
        assert_eq!(j.depth(), 1);
        assert!(j.is_root());
        assert_eq!(j.parent(), None);
        let c = j.child("eval").expect("valid child");
        assert_eq!(c.as_str(), "/alice/train/eval");
        assert_eq!(c.depth(), 2);
        assert_eq!(c.parent(), Some(j.clone()));
        assert_eq!(c.root_job(), j);
        assert!(j.contains(&c));
        assert!(!c.contains(&j));
        assert!(!j.contains(&JobName::parse("/alice/trainer").expect("valid")));
        assert!(matches!(j.child("3"), Err(IdError::IntegerChild(_))));
    }

    #[test]
    fn bad_job_names() {
        for bad in [
            "alice/train",
            "/alice",
            "/",
            "//x",
            "/alice/ /x",
            "/alice/train/",
        ] {
            assert!(JobName::parse(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn task_and_attempt_ids() {
        let t = TaskId::parse("/alice/train/3").expect("valid");
        assert_eq!(t.index, 3);
        assert_eq!(t.job.as_str(), "/alice/train");
        assert!(TaskId::parse("/alice/3").is_err());
        assert!(TaskId::parse("/alice/train/x").is_err());
        let a = AttemptId::parse("/alice/train/0:2").expect("valid");
        assert_eq!(a.attempt, 2);
        assert_eq!(a.to_string(), "/alice/train/0:2");
        assert!(AttemptId::parse("/alice/train/0").is_err());
        assert!(AttemptId::parse("/alice/train/0:x").is_err());
    }

    #[test]
    fn users() {
        assert_eq!(validate_user(" bob ").as_deref(), Ok("bob"));
        assert!(validate_user("").is_err());
        assert!(validate_user("a/b").is_err());
    }
}
