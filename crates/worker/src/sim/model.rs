//! The rules of a simulated worker, with no I/O: how long an attempt "runs" and how it ends
//! (drawn from the attempt's uid, so a rerun of the same workload draws the same), and how a
//! worker answers a desired set (the same contract as the process worker: new attempts start,
//! stop intents end live ones, attempts no longer desired are forgotten, unknown uids are
//! reported MISSING). Time is milliseconds since the fleet started.

use iris_proto::cluster::worker as w;
use iris_types::TaskState;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};

/// How long attempts run, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Span {
    Fixed(u64),
    /// Uniform in `[min, max]`.
    Uniform(u64, u64),
    /// Exponential with this mean.
    Exponential(u64),
}

impl Span {
    /// `5s`, `250ms`, `2m` (fixed); `1s..10s` (uniform); `exp:5s` (exponential with that mean).
    pub fn parse(s: &str) -> Result<Span, String> {
        let s = s.trim();
        if let Some(mean) = s.strip_prefix("exp:") {
            return Ok(Span::Exponential(parse_ms(mean)?));
        }
        if let Some((a, b)) = s.split_once("..") {
            let (lo, hi) = (parse_ms(a)?, parse_ms(b)?);
            if lo > hi {
                return Err(format!(
                    "'{s}': the lower bound is above the upper bound (write MIN..MAX)"
                ));
            }
            return Ok(Span::Uniform(lo, hi));
        }
        Ok(Span::Fixed(parse_ms(s)?))
    }

    /// The duration for a draw `u` in `[0, 1)`.
    fn at(self, u: f64) -> u64 {
        match self {
            Span::Fixed(ms) => ms,
            Span::Uniform(lo, hi) => lo + ((hi - lo) as f64 * u) as u64,
            Span::Exponential(mean) => (-(mean as f64) * (1.0 - u).ln()) as u64,
        }
    }
}

/// `250ms`, `5s`, `2m`, or a bare number of seconds.
fn parse_ms(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1000.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000.0)
    } else {
        (s, 1000.0)
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v >= 0.0 && v.is_finite() => Ok((v * scale) as u64),
        _ => Err(format!(
            "'{s}' is not a duration (write 250ms, 5s, 2m, MIN..MAX or exp:MEAN)"
        )),
    }
}

/// What simulated attempts do.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    pub duration: Span,
    /// Share of attempts that exit 1, in percent.
    pub fail_percent: u32,
    /// Share of attempts killed by SIGSEGV (exit 139), in percent.
    pub crash_percent: u32,
}

impl Profile {
    pub fn validate(&self) -> Result<(), String> {
        if self.fail_percent + self.crash_percent > 100 {
            return Err(format!(
                "--fail-percent {} plus --crash-percent {} is over 100",
                self.fail_percent, self.crash_percent
            ));
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Succeed,
    Fail,
    Crash,
}

fn hash(uid: &str, salt: u8) -> u64 {
    // SipHash with fixed zero keys: the same uid draws the same on every run.
    let mut h = std::hash::DefaultHasher::new();
    salt.hash(&mut h);
    uid.hash(&mut h);
    h.finish()
}

/// An attempt's duration (ms) and outcome, drawn from its uid.
pub fn draw(profile: &Profile, uid: &str) -> (u64, Outcome) {
    let u = (hash(uid, 1) >> 11) as f64 / (1u64 << 53) as f64;
    let pick = (hash(uid, 2) % 100) as u32;
    let outcome = if pick < profile.fail_percent {
        Outcome::Fail
    } else if pick < profile.fail_percent + profile.crash_percent {
        Outcome::Crash
    } else {
        Outcome::Succeed
    };
    (profile.duration.at(u), outcome)
}

#[derive(Debug)]
struct Attempt {
    task_id: String,
    attempt_id: i32,
    ends_at: u64,
    outcome: Outcome,
    state: TaskState,
    exit_code: i32,
    error: String,
}

impl Attempt {
    fn settle(&mut self, now: u64) {
        if self.state != TaskState::Running || now < self.ends_at {
            return;
        }
        (self.state, self.exit_code, self.error) = match self.outcome {
            Outcome::Succeed => (TaskState::Succeeded, 0, String::new()),
            Outcome::Fail => (TaskState::Failed, 1, "Exit code: 1".into()),
            Outcome::Crash => (
                TaskState::Failed,
                139,
                "Exit code 139: killed by SIGSEGV".into(),
            ),
        };
    }

    fn observation(&self, uid: &str) -> w::AttemptObservation {
        w::AttemptObservation {
            attempt_uid: uid.to_string(),
            state: self.state.code(),
            exit_code: self.exit_code,
            error: self.error.clone(),
            container_id: format!("sim-{uid}"),
            ..Default::default()
        }
    }
}

/// One simulated worker's attempts.
#[derive(Debug, Default)]
pub struct SimWorker {
    attempts: HashMap<String, Attempt>,
}

/// What a reconcile answered, and when the attempts it started will end (so the fleet can tell
/// the controller then, as a process worker does when its child exits).
pub struct Answer {
    pub observed: Vec<w::AttemptObservation>,
    pub ends_at: Vec<u64>,
}

impl SimWorker {
    /// Answers a desired set at time `now`.
    pub fn reconcile(
        &mut self,
        desired: Vec<w::DesiredAttempt>,
        now: u64,
        profile: &Profile,
    ) -> Answer {
        let wanted: HashSet<&str> = desired.iter().map(|d| d.attempt_uid.as_str()).collect();
        // Not desired any more: a live one is stopped, a finished one forgotten; with no
        // process behind it, either way it is gone.
        self.attempts.retain(|uid, _| wanted.contains(uid.as_str()));
        // A newer attempt of a task supersedes an older live one, whichever order the
        // controller listed them in: settle that before anything is observed.
        for d in &desired {
            let Some(w::desired_attempt::Intent::Run(spec)) = &d.intent else {
                continue;
            };
            let Some(run) = &spec.request else { continue };
            if self.attempts.contains_key(&d.attempt_uid) {
                continue;
            }
            for a in self.attempts.values_mut() {
                if a.task_id == run.task_id && a.attempt_id < run.attempt_id {
                    a.settle(now);
                    if !a.state.is_terminal() {
                        a.state = TaskState::Killed;
                        a.exit_code = 143;
                    }
                }
            }
        }
        let mut observed = Vec::with_capacity(desired.len());
        let mut ends_at = Vec::new();
        for d in desired {
            use w::desired_attempt::Intent;
            match d.intent {
                Some(Intent::Run(spec)) => {
                    if !self.attempts.contains_key(&d.attempt_uid) {
                        let Some(run) = spec.request else {
                            observed.push(missing(d.attempt_uid));
                            continue;
                        };
                        let (ms, outcome) = draw(profile, &d.attempt_uid);
                        ends_at.push(now + ms);
                        self.attempts.insert(
                            d.attempt_uid.clone(),
                            Attempt {
                                task_id: run.task_id,
                                attempt_id: run.attempt_id,
                                ends_at: now + ms,
                                outcome,
                                state: TaskState::Running,
                                exit_code: 0,
                                error: String::new(),
                            },
                        );
                    }
                }
                Some(Intent::Stop(_)) => match self.attempts.get_mut(&d.attempt_uid) {
                    Some(a) => {
                        a.settle(now);
                        if !a.state.is_terminal() {
                            a.state = TaskState::Killed;
                            a.exit_code = 143;
                        }
                    }
                    None => {
                        observed.push(missing(d.attempt_uid));
                        continue;
                    }
                },
                None => continue,
            }
            if let Some(a) = self.attempts.get_mut(&d.attempt_uid) {
                a.settle(now);
                observed.push(a.observation(&d.attempt_uid));
            }
        }
        Answer { observed, ends_at }
    }

    /// Attempts still running at `now`.
    pub fn running(&self, now: u64) -> usize {
        self.attempts
            .values()
            .filter(|a| a.state == TaskState::Running && now < a.ends_at)
            .count()
    }

    /// The controller declared this worker lost: everything it ran is gone.
    pub fn fence(&mut self) {
        self.attempts.clear();
    }
}

fn missing(uid: String) -> w::AttemptObservation {
    w::AttemptObservation {
        attempt_uid: uid,
        state: TaskState::Missing.code(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iris_proto::job;

    fn profile(duration: Span, fail: u32, crash: u32) -> Profile {
        Profile {
            duration,
            fail_percent: fail,
            crash_percent: crash,
        }
    }

    fn run(uid: &str, task: &str, attempt: i32) -> w::DesiredAttempt {
        w::DesiredAttempt {
            attempt_uid: uid.into(),
            intent: Some(w::desired_attempt::Intent::Run(w::AttemptSpec {
                request: Some(job::RunTaskRequest {
                    task_id: task.into(),
                    attempt_id: attempt,
                    ..Default::default()
                }),
            })),
        }
    }

    fn cached(uid: &str) -> w::DesiredAttempt {
        w::DesiredAttempt {
            attempt_uid: uid.into(),
            intent: Some(w::desired_attempt::Intent::Run(w::AttemptSpec {
                request: None,
            })),
        }
    }

    fn stop(uid: &str) -> w::DesiredAttempt {
        w::DesiredAttempt {
            attempt_uid: uid.into(),
            intent: Some(w::desired_attempt::Intent::Stop(
                w::StopReason::Cancelled as i32,
            )),
        }
    }

    fn states(a: &Answer) -> Vec<(String, TaskState)> {
        a.observed
            .iter()
            .map(|o| {
                (
                    o.attempt_uid.clone(),
                    TaskState::from_code(o.state).unwrap_or(TaskState::Unspecified),
                )
            })
            .collect()
    }

    #[test]
    fn spans_parse_and_refuse_with_the_fix() {
        assert_eq!(Span::parse("5s"), Ok(Span::Fixed(5000)));
        assert_eq!(Span::parse("250ms"), Ok(Span::Fixed(250)));
        assert_eq!(Span::parse("2m"), Ok(Span::Fixed(120_000)));
        assert_eq!(Span::parse("1.5"), Ok(Span::Fixed(1500)));
        assert_eq!(Span::parse("1s..10s"), Ok(Span::Uniform(1000, 10_000)));
        assert_eq!(Span::parse("exp:5s"), Ok(Span::Exponential(5000)));
        let e = Span::parse("10s..1s").unwrap_err();
        assert!(e.contains("MIN..MAX"), "{e}");
        let e = Span::parse("soon").unwrap_err();
        assert!(e.contains("250ms, 5s"), "{e}");
        assert!(profile(Span::Fixed(1), 60, 50).validate().is_err());
    }

    #[test]
    fn draws_are_repeatable_and_follow_the_mix() {
        let p = profile(Span::Uniform(1000, 3000), 10, 5);
        let mut counts = [0usize; 3];
        for i in 0..10_000 {
            let uid = format!("uid-{i}");
            let (ms, o) = draw(&p, &uid);
            assert_eq!(draw(&p, &uid), (ms, o));
            assert!((1000..=3000).contains(&ms), "{ms}");
            counts[o as usize] += 1;
        }
        // 85 / 10 / 5 percent, within sampling noise.
        assert!((8200..8800).contains(&counts[0]), "{counts:?}");
        assert!((800..1200).contains(&counts[1]), "{counts:?}");
        assert!((350..650).contains(&counts[2]), "{counts:?}");
        let e = profile(Span::Exponential(1000), 0, 0);
        let mean: f64 = (0..10_000)
            .map(|i| draw(&e, &format!("u{i}")).0 as f64)
            .sum::<f64>()
            / 10_000.0;
        assert!((900.0..1100.0).contains(&mean), "{mean}");
    }

    #[test]
    fn an_attempt_runs_for_its_duration_then_ends_as_drawn() {
        let p = profile(Span::Fixed(1000), 0, 0);
        let mut w = SimWorker::default();
        let a = w.reconcile(vec![run("u1", "/j/0", 0)], 0, &p);
        assert_eq!(states(&a), vec![("u1".into(), TaskState::Running)]);
        assert_eq!(a.ends_at, vec![1000]);
        assert_eq!(w.running(500), 1);
        let a = w.reconcile(vec![cached("u1")], 999, &p);
        assert_eq!(states(&a), vec![("u1".into(), TaskState::Running)]);
        let a = w.reconcile(vec![cached("u1")], 1000, &p);
        assert_eq!(states(&a), vec![("u1".into(), TaskState::Succeeded)]);
        assert!(a.ends_at.is_empty());
        // No longer desired: forgotten.
        let a = w.reconcile(vec![], 1001, &p);
        assert!(a.observed.is_empty());
        assert_eq!(w.running(1001), 0);

        let crash = profile(Span::Fixed(10), 0, 100);
        let mut w = SimWorker::default();
        w.reconcile(vec![run("u2", "/j/1", 0)], 0, &crash);
        let a = w.reconcile(vec![cached("u2")], 10, &crash);
        assert_eq!(a.observed[0].exit_code, 139);
        assert_eq!(a.observed[0].state, TaskState::Failed.code());
        assert!(a.observed[0].error.contains("SIGSEGV"));
    }

    #[test]
    fn stops_supersedes_unknown_uids_and_fences() {
        let p = profile(Span::Fixed(60_000), 0, 0);
        let mut w = SimWorker::default();
        w.reconcile(vec![run("a0", "/j/0", 0), run("b0", "/j/1", 0)], 0, &p);
        // Stopped: KILLED with SIGTERM's code.
        let a = w.reconcile(vec![stop("a0"), cached("b0")], 5, &p);
        assert_eq!(
            states(&a),
            vec![
                ("a0".into(), TaskState::Killed),
                ("b0".into(), TaskState::Running)
            ]
        );
        assert_eq!(a.observed[0].exit_code, 143);
        // A newer attempt of /j/1 supersedes b0.
        let a = w.reconcile(vec![cached("b0"), run("b1", "/j/1", 1)], 6, &p);
        assert_eq!(
            states(&a),
            vec![
                ("b0".into(), TaskState::Killed),
                ("b1".into(), TaskState::Running)
            ]
        );
        // A uid this worker never saw, with no spec to start it from, or to stop.
        let a = w.reconcile(vec![cached("zz"), stop("yy"), cached("b1")], 7, &p);
        assert_eq!(
            states(&a),
            vec![
                ("zz".into(), TaskState::Missing),
                ("yy".into(), TaskState::Missing),
                ("b1".into(), TaskState::Running)
            ]
        );
        w.fence();
        assert_eq!(w.running(8), 0);
        let a = w.reconcile(vec![cached("b1")], 9, &p);
        assert_eq!(states(&a), vec![("b1".into(), TaskState::Missing)]);
    }
}
