//! Job and task states with Iris's numeric codes (reference §2.1), and priority bands.

use std::fmt;

macro_rules! coded_enum {
    ($(#[$m:meta])* $name:ident { $($variant:ident = $code:literal => $friendly:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($variant = $code),+ }

        impl $name {
            /// Every state, in code order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The wire / DB code.
            pub fn code(self) -> i32 { self as i32 }

            /// Parses a wire / DB code.
            pub fn from_code(code: i32) -> Option<Self> {
                match code { $($code => Some($name::$variant),)+ _ => None }
            }

            /// The lower-case friendly name (`running`, `worker_failed`).
            pub fn friendly(self) -> &'static str {
                match self { $($name::$variant => $friendly),+ }
            }

            /// Parses a friendly name, case-insensitively; also accepts the
            /// proto spelling (`TASK_STATE_RUNNING`, `JOB_STATE_RUNNING`).
            pub fn from_friendly(s: &str) -> Option<Self> {
                let l = s.trim().to_ascii_lowercase();
                let l = l.strip_prefix("job_state_").or_else(|| l.strip_prefix("task_state_")).unwrap_or(&l);
                match l { $($friendly => Some($name::$variant),)+ _ => None }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.friendly()) }
        }
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.friendly()) }
        }
    };
}

coded_enum!(
    /// Job states (`JOB_STATE_*`).
    JobState {
        Unspecified = 0 => "unspecified",
        Pending = 1 => "pending",
        Building = 2 => "building",
        Running = 3 => "running",
        Succeeded = 4 => "succeeded",
        Failed = 5 => "failed",
        Killed = 6 => "killed",
        WorkerFailed = 7 => "worker_failed",
        Unschedulable = 8 => "unschedulable",
    }
);

coded_enum!(
    /// Task (and attempt) states (`TASK_STATE_*`).
    TaskState {
        Unspecified = 0 => "unspecified",
        Pending = 1 => "pending",
        Building = 2 => "building",
        Running = 3 => "running",
        Succeeded = 4 => "succeeded",
        Failed = 5 => "failed",
        Killed = 6 => "killed",
        WorkerFailed = 7 => "worker_failed",
        Unschedulable = 8 => "unschedulable",
        Assigned = 9 => "assigned",
        Preempted = 10 => "preempted",
        CoschedFailed = 11 => "cosched_failed",
        Missing = 12 => "missing",
    }
);

impl JobState {
    /// Terminal job states: SUCCEEDED, FAILED, KILLED, WORKER_FAILED, UNSCHEDULABLE.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded
                | JobState::Failed
                | JobState::Killed
                | JobState::WorkerFailed
                | JobState::Unschedulable
        )
    }
}

impl JobState {
    /// Live: PENDING, BUILDING or RUNNING (neither terminal nor unspecified).
    pub fn is_live(self) -> bool {
        matches!(
            self,
            JobState::Pending | JobState::Building | JobState::Running
        )
    }
}

impl TaskState {
    /// Terminal task states (4,5,6,7,8,10,11).
    pub fn is_terminal(self) -> bool {
        match self {
            TaskState::Succeeded
            | TaskState::Failed
            | TaskState::Killed
            | TaskState::WorkerFailed
            | TaskState::Unschedulable
            | TaskState::Preempted
            | TaskState::CoschedFailed => true,
            TaskState::Unspecified
            | TaskState::Pending
            | TaskState::Building
            | TaskState::Running
            | TaskState::Assigned
            | TaskState::Missing => false,
        }
    }

    /// Active: holds a worker slot (ASSIGNED, BUILDING, RUNNING).
    pub fn is_active(self) -> bool {
        matches!(
            self,
            TaskState::Assigned | TaskState::Building | TaskState::Running
        )
    }

    /// Executing: BUILDING or RUNNING.
    pub fn is_executing(self) -> bool {
        matches!(self, TaskState::Building | TaskState::Running)
    }
}

/// Priority band.
///
/// Declaration order is rank order, and so is the derived `Ord`: `System` is the highest
/// priority and the *smallest* value (`Band::System < Band::Batch`), so sorting ascending puts
/// the most important work first. Wire codes are not in rank order: PRODUCTION=1,
/// INTERACTIVE=2, BATCH=3, SYSTEM=4 (0 = INHERIT); see [`Band::code`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Band {
    /// Cluster infrastructure; preempts everything else.
    System,
    /// Production work; preempts `Interactive` and `Batch`.
    Production,
    /// The default band; preempts `Batch`.
    Interactive,
    /// Best-effort work; never preempts.
    Batch,
}

impl Band {
    /// All bands, highest first.
    pub const ALL: [Band; 4] = [
        Band::System,
        Band::Production,
        Band::Interactive,
        Band::Batch,
    ];

    /// Wire code.
    pub fn code(self) -> i32 {
        match self {
            Band::Production => 1,
            Band::Interactive => 2,
            Band::Batch => 3,
            Band::System => 4,
        }
    }

    /// From wire code; 0 (INHERIT) and unknown codes give `None`.
    pub fn from_code(code: i32) -> Option<Band> {
        match code {
            1 => Some(Band::Production),
            2 => Some(Band::Interactive),
            3 => Some(Band::Batch),
            4 => Some(Band::System),
            _ => None,
        }
    }

    /// Rank: 0 is the highest priority.
    pub fn rank(self) -> u8 {
        match self {
            Band::System => 0,
            Band::Production => 1,
            Band::Interactive => 2,
            Band::Batch => 3,
        }
    }

    /// True if `self` has strictly higher priority than `other` (never within a band).
    pub fn outranks(self, other: Band) -> bool {
        self.rank() < other.rank()
    }

    /// Lower-case name, as shown to users.
    pub fn name(self) -> &'static str {
        match self {
            Band::System => "system",
            Band::Production => "production",
            Band::Interactive => "interactive",
            Band::Batch => "batch",
        }
    }

    /// Parses `system|production|interactive|batch` (case-insensitive, `PRIORITY_BAND_` prefix allowed).
    pub fn parse(s: &str) -> Result<Band, String> {
        let l = s.trim().to_ascii_lowercase();
        let l = l.strip_prefix("priority_band_").unwrap_or(&l);
        match l {
            "system" => Ok(Band::System),
            "production" => Ok(Band::Production),
            "interactive" => Ok(Band::Interactive),
            "batch" => Ok(Band::Batch),
            _ => Err(format!(
                "unknown priority {}: expected one of system, production, interactive, batch",
                crate::quoted(s)
            )),
        }
    }
}

impl fmt::Display for Band {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for s in TaskState::ALL {
            assert_eq!(TaskState::from_code(s.code()), Some(*s));
            assert_eq!(TaskState::from_friendly(s.friendly()), Some(*s));
        }
        for s in JobState::ALL {
            assert_eq!(JobState::from_code(s.code()), Some(*s));
        }
        assert_eq!(TaskState::CoschedFailed.code(), 11);
        assert_eq!(
            TaskState::from_friendly("TASK_STATE_WORKER_FAILED"),
            Some(TaskState::WorkerFailed)
        );
        for b in Band::ALL {
            assert_eq!(Band::from_code(b.code()), Some(b));
            assert_eq!(Band::parse(b.name()), Ok(b));
        }
        assert!(Band::parse("urgent").is_err());
    }

    #[test]
    fn band_order() {
        assert!(Band::System.outranks(Band::Production));
        assert!(Band::Interactive.outranks(Band::Batch));
        assert!(!Band::Batch.outranks(Band::Batch));
        assert!(!Band::Batch.outranks(Band::Interactive));
        // `Ord` is rank order: the highest band is the smallest.
        let mut sorted = vec![
            Band::Batch,
            Band::System,
            Band::Interactive,
            Band::Production,
        ];
        sorted.sort();
        assert_eq!(sorted, Band::ALL);
        for a in Band::ALL {
            for b in Band::ALL {
                assert_eq!(a < b, a.outranks(b), "{a} vs {b}");
            }
        }
    }

    #[test]
    fn terminal_sets() {
        let terminal: Vec<i32> = TaskState::ALL
            .iter()
            .filter(|s| s.is_terminal())
            .map(|s| s.code())
            .collect();
        assert_eq!(terminal, vec![4, 5, 6, 7, 8, 10, 11]);
    }
}
