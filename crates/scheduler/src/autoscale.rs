//! Scale-group autoscaling decisions: how many slices a group should have for its demand, which
//! idle slices to stop, and when a group that failed to start slices must wait.
//!
//! Pure like the rest of this crate: the caller passes the clock (`now_ms`) and the observed
//! state, and acts on the [`Decision`] itself (starting and stopping slices is I/O).
//!
//! The rule is the reference's (`target = min(required + buffer_slices, max_slices)`; add what
//! the demand or the buffer lacks beyond the slices already starting; stop ready slices idle for
//! the group's idle threshold while more are ready than the target). Where it differs, on
//! purpose: a group whose slice failed to start backs off exponentially (5 s doubling to 5 min,
//! shown as `backoff_until` with the error) instead of the reference's decaying health score, so
//! an operator sees when it will try again and why.

use crate::model::ResourcesExt;
use iris_types::Resources;

/// First wait after a failed slice start; doubles with each consecutive failure.
pub const BACKOFF_BASE_MS: i64 = 5_000;
/// Longest wait between attempts to start a slice.
pub const BACKOFF_MAX_MS: i64 = 300_000;
/// A slice whose workers have not all registered by then failed to start.
pub const BOOT_TIMEOUT_MS: i64 = 120_000;

/// A scale group's limits, from its config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupPolicy {
    /// Workers (VMs) per slice.
    pub num_vms: u32,
    /// Slices kept beyond the demand.
    pub buffer_slices: u32,
    /// The most slices the group may have.
    pub max_slices: u32,
    /// How long a ready slice must run nothing before it may be stopped.
    pub idle_threshold_ms: i64,
    /// Routing order among groups (lower first).
    pub priority: i64,
}

/// Where a slice is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    /// Started; its workers have not all registered yet.
    Booting,
    /// Every worker registered and healthy.
    Ready,
}

impl Lifecycle {
    /// The reference's lowercase state name.
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Booting => "booting",
            Lifecycle::Ready => "ready",
        }
    }
}

/// One slice of a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slice {
    /// Slice id.
    pub id: String,
    /// Its workers' ids.
    pub workers: Vec<String>,
    /// Booting or ready.
    pub lifecycle: Lifecycle,
    /// When it was started.
    pub created_at_ms: i64,
    /// Since when none of its workers has run anything (`None` while one does).
    pub quiet_since_ms: Option<i64>,
}

/// What the autoscaler remembers about a group between evaluations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupState {
    /// Its slices, oldest first.
    pub slices: Vec<Slice>,
    /// Slice starts that failed in a row (reset when a slice becomes ready).
    pub consecutive_failures: u32,
    /// No slice is started before this time (0: no wait).
    pub backoff_until_ms: i64,
    /// Why the last slice start failed.
    pub last_error: String,
    /// When a slice was last started / stopped (0: never).
    pub last_scale_up_ms: i64,
    pub last_scale_down_ms: i64,
    /// Slices the last evaluation's demand needed, and the most it ever needed.
    pub current_demand: u32,
    pub peak_demand: u32,
}

/// What became of a slice when its workers were looked at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SliceChange {
    /// Every worker of the booting slice registered: it is ready.
    Ready { slice: String, workers: usize },
    /// Not all of its workers registered within [`BOOT_TIMEOUT_MS`]: it failed to start.
    BootTimedOut {
        slice: String,
        workers: Vec<String>,
        why: String,
    },
    /// Workers of the ready slice were declared lost (their rows are gone): the slice goes.
    Lost {
        slice: String,
        workers: Vec<String>,
        lost: Vec<String>,
    },
}

impl GroupState {
    fn count(&self, l: Lifecycle) -> u32 {
        self.slices.iter().filter(|s| s.lifecycle == l).count() as u32
    }

    /// Slices started whose workers have not all registered yet.
    pub fn booting(&self) -> u32 {
        self.count(Lifecycle::Booting)
    }

    /// Moves the slices on from what is seen of their workers at `now_ms`: `live` (registered
    /// and healthy) and `present` (still has a row; a worker that is only unhealthy for now
    /// keeps its slice). A booting slice whose workers are all live is ready (and the group's
    /// failures are forgiven); one that is not by [`BOOT_TIMEOUT_MS`] failed to start (a
    /// failure, backing off); a ready one that lost a worker goes. Slices that go are removed
    /// here; the caller stops them.
    pub fn observe_workers(
        &mut self,
        live: impl Fn(&str) -> bool,
        present: impl Fn(&str) -> bool,
        now_ms: i64,
    ) -> Vec<SliceChange> {
        let mut changes = Vec::new();
        let mut kept = Vec::new();
        for mut s in std::mem::take(&mut self.slices) {
            let up = s.workers.iter().filter(|w| live(w)).count();
            let lost: Vec<String> = s.workers.iter().filter(|w| !present(w)).cloned().collect();
            match s.lifecycle {
                Lifecycle::Booting if up == s.workers.len() => {
                    s.lifecycle = Lifecycle::Ready;
                    s.quiet_since_ms = None;
                    self.consecutive_failures = 0;
                    self.backoff_until_ms = 0;
                    changes.push(SliceChange::Ready {
                        slice: s.id.clone(),
                        workers: s.workers.len(),
                    });
                }
                Lifecycle::Booting if now_ms - s.created_at_ms > BOOT_TIMEOUT_MS => {
                    let why = format!(
                        "{up} of {} workers registered within {}s",
                        s.workers.len(),
                        BOOT_TIMEOUT_MS / 1000
                    );
                    self.record_failure(why.clone(), now_ms);
                    changes.push(SliceChange::BootTimedOut {
                        slice: s.id,
                        workers: s.workers,
                        why,
                    });
                    continue;
                }
                Lifecycle::Ready if !lost.is_empty() => {
                    changes.push(SliceChange::Lost {
                        slice: s.id,
                        workers: s.workers,
                        lost,
                    });
                    continue;
                }
                _ => {}
            }
            kept.push(s);
        }
        self.slices = kept;
        changes
    }

    /// Records which slices ran something at `now_ms`: a slice is quiet from the first
    /// evaluation that finds none of its workers `busy`.
    pub fn observe_activity(&mut self, busy: impl Fn(&str) -> bool, now_ms: i64) {
        for s in &mut self.slices {
            if s.workers.iter().any(|w| busy(w)) {
                s.quiet_since_ms = None;
            } else if s.quiet_since_ms.is_none() {
                s.quiet_since_ms = Some(now_ms);
            }
        }
    }

    /// Records a failed slice start: the wait before the next one doubles.
    pub fn record_failure(&mut self, error: String, now_ms: i64) {
        self.consecutive_failures += 1;
        self.backoff_until_ms = now_ms + backoff_ms(self.consecutive_failures);
        self.last_error = error;
    }

    /// True when slice `s` has been idle for the group's threshold at `now_ms`.
    pub fn is_idle(&self, policy: &GroupPolicy, s: &Slice, now_ms: i64) -> bool {
        s.lifecycle == Lifecycle::Ready
            && s.quiet_since_ms
                .is_some_and(|q| now_ms - q >= policy.idle_threshold_ms)
    }
}

/// The wait after `failures` consecutive failed starts (`failures >= 1`).
pub fn backoff_ms(failures: u32) -> i64 {
    let doublings = failures.saturating_sub(1).min(16);
    (BACKOFF_BASE_MS << doublings).min(BACKOFF_MAX_MS)
}

/// Whether a group can take more demand now, as `GetAutoscalerStatus` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Availability {
    /// `available`, `backoff`, `cooldown` or `at_max_slices`.
    pub status: &'static str,
    /// Why, for the states that need one (empty otherwise).
    pub reason: String,
    /// Until when a `backoff` lasts (0 otherwise).
    pub until_ms: i64,
}

/// The group's availability at `now_ms`.
pub fn availability(policy: &GroupPolicy, state: &GroupState, now_ms: i64) -> Availability {
    let total = state.slices.len() as u32;
    if now_ms < state.backoff_until_ms {
        return Availability {
            status: "backoff",
            reason: format!(
                "backing off after {} failed slice start(s), next try in {}s: {}",
                state.consecutive_failures,
                (state.backoff_until_ms - now_ms + 999) / 1000,
                state.last_error
            ),
            until_ms: state.backoff_until_ms,
        };
    }
    if total >= policy.max_slices {
        let booting = state.count(Lifecycle::Booting) > 0;
        return Availability {
            status: if booting { "cooldown" } else { "at_max_slices" },
            reason: if booting {
                "at max_slices with in-flight capacity".into()
            } else {
                String::new()
            },
            until_ms: 0,
        };
    }
    Availability {
        status: "available",
        reason: String::new(),
        until_ms: 0,
    }
}

/// What to do with one group this evaluation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// `min(required + buffer_slices, max_slices)`.
    pub target: u32,
    /// Slices to start, with the reason each is logged under.
    pub add: Vec<String>,
    /// Idle ready slices to stop (longest idle first), with the reason.
    pub remove: Vec<(String, String)>,
    /// Why slices that are needed are not started (backoff), if so.
    pub blocked: Option<String>,
}

/// Decides one group's scaling at `now_ms` for what its demand needs beyond its ready workers.
/// No slice is stopped while pending work waits for room a live worker has (the tick has not
/// placed it yet).
pub fn decide(policy: &GroupPolicy, state: &GroupState, need: &Need, now_ms: i64) -> Decision {
    let required = need.slices;
    let ready = state.count(Lifecycle::Ready);
    let booting = state.count(Lifecycle::Booting);
    let total = ready + booting;
    let target = (required + policy.buffer_slices).min(policy.max_slices);
    let needed = required
        .saturating_sub(booting)
        .max(target.saturating_sub(total));
    let mut d = Decision {
        target,
        ..Decision::default()
    };
    if needed > 0 && total < policy.max_slices {
        if now_ms < state.backoff_until_ms {
            d.blocked = Some(availability(policy, state, now_ms).reason);
            return d;
        }
        let n = needed.min(policy.max_slices - total);
        d.add = (1..=n)
            .map(|i| {
                format!(
                    "target={target} (demand={required}+buffer={}), total={total}, pending={booting} (scaling {i}/{n})",
                    policy.buffer_slices
                )
            })
            .collect();
        return d;
    }
    if ready > target && need.absorbed == 0 {
        let mut idle: Vec<&Slice> = state
            .slices
            .iter()
            .filter(|s| state.is_idle(policy, s, now_ms))
            .collect();
        idle.sort_by_key(|s| (s.quiet_since_ms, s.id.clone()));
        d.remove = idle
            .into_iter()
            .take((ready - target) as usize)
            .map(|s| {
                (
                    s.id.clone(),
                    format!("idle slice (target={target}, ready={ready})"),
                )
            })
            .collect();
    }
    d
}

/// A pending unit of demand routed to a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Demand {
    /// One task.
    Task(Resources),
    /// A coscheduled job: `size` tasks on distinct hosts, `each` asking for this.
    Gang { size: u32, each: Resources },
}

impl Demand {
    /// What one of its tasks asks for.
    pub fn resources(&self) -> &Resources {
        match self {
            Demand::Task(r) => r,
            Demand::Gang { each, .. } => each,
        }
    }
}

/// What a group's demand needs beyond its live workers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Need {
    /// New slices.
    pub slices: u32,
    /// The demand units (indices) the live workers cannot take.
    pub unabsorbed: Vec<usize>,
    /// Demand units the live workers' room takes.
    pub absorbed: usize,
}

impl Need {
    /// A need of `slices` new slices, none of it for room already live.
    pub fn slices(slices: u32) -> Need {
        Need {
            slices,
            ..Need::default()
        }
    }
}

/// Slices of `policy`'s group (each VM offering `vm`) needed for `demand` beyond the room its
/// live workers have (`free`, one entry per worker): tasks are packed first-fit into that room,
/// then into new VMs; a gang that no set of live workers can take starts whole slices.
pub fn required_slices(
    policy: &GroupPolicy,
    vm: &Resources,
    free: &[Resources],
    demand: &[Demand],
) -> Need {
    let mut unabsorbed = Vec::new();
    let mut absorbed = 0;
    let mut live: Vec<Resources> = free.to_vec();
    let mut fresh: Vec<Resources> = Vec::new();
    let mut gang_slices = 0u32;
    let per_slice = policy.num_vms.max(1);
    for (i, d) in demand.iter().enumerate() {
        match d {
            Demand::Task(r) => {
                if let Some(b) = live.iter_mut().find(|b| r.fits_in(b)) {
                    take(b, r);
                    absorbed += 1;
                    continue;
                }
                unabsorbed.push(i);
                if let Some(b) = fresh.iter_mut().find(|b| r.fits_in(b)) {
                    take(b, r);
                } else if r.fits_in(vm) {
                    let mut b = vm.clone();
                    take(&mut b, r);
                    fresh.push(b);
                }
            }
            Demand::Gang { size, each } => {
                let hosts: Vec<usize> = live
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| each.fits_in(b))
                    .map(|(i, _)| i)
                    .take(*size as usize)
                    .collect();
                if hosts.len() as u32 == *size {
                    for h in hosts {
                        take(&mut live[h], each);
                    }
                    absorbed += 1;
                    continue;
                }
                unabsorbed.push(i);
                if each.fits_in(vm) {
                    gang_slices += size.div_ceil(per_slice);
                }
            }
        }
    }
    Need {
        slices: (fresh.len() as u32).div_ceil(per_slice) + gang_slices,
        unabsorbed,
        absorbed,
    }
}

/// Takes a task's request out of a worker's room (requests are never negative: admission
/// refuses them).
pub fn take(room: &mut Resources, r: &Resources) {
    room.sub(r);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(buffer: u32, max: u32) -> GroupPolicy {
        GroupPolicy {
            num_vms: 1,
            buffer_slices: buffer,
            max_slices: max,
            idle_threshold_ms: 1_000,
            priority: 100,
        }
    }

    fn slice(id: &str, lifecycle: Lifecycle, quiet: Option<i64>) -> Slice {
        Slice {
            id: id.into(),
            workers: vec![format!("worker-{id}")],
            lifecycle,
            created_at_ms: 0,
            quiet_since_ms: quiet,
        }
    }

    fn cpu(millis: i64) -> Resources {
        Resources::cpu_mem(millis, 1 << 30)
    }

    /// A VM's room: `millis` of cpu and plenty of memory.
    fn room(millis: i64) -> Resources {
        Resources::cpu_mem(millis, 64 << 30)
    }

    #[test]
    fn a_burst_scales_up_to_max_slices_and_no_further() {
        let p = policy(0, 3);
        let mut s = GroupState::default();
        let d = decide(&p, &s, &Need::slices(5), 0);
        assert_eq!(d.target, 3);
        assert_eq!(d.add.len(), 3, "{d:?}");
        assert_eq!(
            d.add[0],
            "target=3 (demand=5+buffer=0), total=0, pending=0 (scaling 1/3)"
        );
        s.slices = vec![
            slice("a", Lifecycle::Ready, None),
            slice("b", Lifecycle::Booting, None),
            slice("c", Lifecycle::Booting, None),
        ];
        assert!(
            decide(&p, &s, &Need::slices(5), 1).add.is_empty(),
            "at max_slices"
        );
        assert_eq!(availability(&p, &s, 1).status, "cooldown");
        s.slices[1].lifecycle = Lifecycle::Ready;
        s.slices[2].lifecycle = Lifecycle::Ready;
        assert_eq!(availability(&p, &s, 1).status, "at_max_slices");
    }

    #[test]
    fn slices_already_starting_count_against_the_demand() {
        let p = policy(0, 5);
        let s = GroupState {
            slices: vec![slice("a", Lifecycle::Booting, None)],
            ..GroupState::default()
        };
        assert_eq!(decide(&p, &s, &Need::slices(2), 0).add.len(), 1);
        assert!(decide(&p, &s, &Need::slices(1), 0).add.is_empty());
    }

    #[test]
    fn the_buffer_is_kept_without_demand() {
        let p = policy(1, 2);
        let d = decide(&p, &GroupState::default(), &Need::slices(0), 0);
        assert_eq!(d.add.len(), 1);
        assert_eq!(d.target, 1);
    }

    #[test]
    fn idle_slices_beyond_the_target_stop_longest_idle_first_after_the_threshold() {
        let p = policy(0, 3);
        let mut s = GroupState {
            slices: vec![
                slice("a", Lifecycle::Ready, None),
                slice("b", Lifecycle::Ready, None),
                slice("c", Lifecycle::Ready, None),
            ],
            ..GroupState::default()
        };
        s.observe_activity(|w| w == "worker-a", 100);
        s.observe_activity(|w| w == "worker-a" || w == "worker-c", 200);
        assert_eq!(
            s.slices[1].quiet_since_ms,
            Some(100),
            "quiet from its first quiet look"
        );
        assert_eq!(s.slices[2].quiet_since_ms, None, "busy again");
        s.observe_activity(|w| w == "worker-a", 1_050);
        assert!(
            decide(&p, &s, &Need::slices(0), 900).remove.is_empty(),
            "not idle long enough"
        );
        let d = decide(&p, &s, &Need::slices(0), 1_100);
        let ids: Vec<&str> = d.remove.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["b"], "a is busy, c quiet only since 1050");
        assert_eq!(d.remove[0].1, "idle slice (target=0, ready=3)");
        let d = decide(&p, &s, &Need::slices(0), 2_100);
        let ids: Vec<&str> = d.remove.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["b", "c"], "longest idle first");
        // Pending work waiting for a live worker's room keeps every slice.
        let waiting = Need {
            absorbed: 1,
            ..Need::default()
        };
        assert!(decide(&p, &s, &waiting, 2_100).remove.is_empty());
        // With demand for two, one idle slice stays beside the busy one.
        assert_eq!(decide(&p, &s, &Need::slices(2), 2_100).remove.len(), 1);
    }

    #[test]
    fn slices_become_ready_time_out_or_go_with_a_lost_worker() {
        let mut s = GroupState {
            slices: vec![
                slice("up", Lifecycle::Booting, None),
                slice("slow", Lifecycle::Booting, None),
                slice("ready", Lifecycle::Ready, None),
                slice("sick", Lifecycle::Ready, None),
            ],
            consecutive_failures: 2,
            backoff_until_ms: 50,
            ..GroupState::default()
        };
        let live = |w: &str| w == "worker-up" || w == "worker-ready";
        let present = |w: &str| w != "worker-ready";
        // Before the boot timeout the slow one keeps booting; the sick one (unhealthy, still
        // present) keeps its place.
        let changes = s.observe_workers(live, present, 1_000);
        assert_eq!(
            changes,
            [
                SliceChange::Ready {
                    slice: "up".into(),
                    workers: 1
                },
                SliceChange::Lost {
                    slice: "ready".into(),
                    workers: vec!["worker-ready".into()],
                    lost: vec!["worker-ready".into()]
                },
            ]
        );
        assert_eq!(
            (s.consecutive_failures, s.backoff_until_ms),
            (0, 0),
            "a ready slice forgives"
        );
        let ids: Vec<&str> = s.slices.iter().map(|x| x.id.as_str()).collect();
        assert_eq!(ids, ["up", "slow", "sick"]);
        let changes = s.observe_workers(live, present, BOOT_TIMEOUT_MS + 1);
        assert!(
            matches!(&changes[..], [SliceChange::BootTimedOut { slice, why, .. }]
                if slice == "slow" && why == "0 of 1 workers registered within 120s"),
            "{changes:?}"
        );
        assert_eq!(s.consecutive_failures, 1, "a timed-out start is a failure");
        assert_eq!(s.booting(), 0);
    }

    #[test]
    fn a_failed_start_backs_off_doubling_to_a_cap_and_says_why() {
        let p = policy(0, 3);
        let mut s = GroupState::default();
        s.record_failure("cannot create /x: permission denied".into(), 1_000);
        assert_eq!(s.backoff_until_ms, 6_000);
        let d = decide(&p, &s, &Need::slices(1), 2_000);
        assert!(d.add.is_empty());
        let why = d.blocked.expect("blocked");
        assert!(
            why.contains("1 failed slice start") && why.contains("permission denied"),
            "{why}"
        );
        let a = availability(&p, &s, 2_000);
        assert_eq!((a.status, a.until_ms), ("backoff", 6_000));
        assert_eq!(
            decide(&p, &s, &Need::slices(1), 6_000).add.len(),
            1,
            "tries again after the wait"
        );
        s.record_failure("again".into(), 6_000);
        assert_eq!(s.backoff_until_ms, 16_000);
        assert_eq!(backoff_ms(30), BACKOFF_MAX_MS);
    }

    #[test]
    fn demand_packs_into_live_room_then_new_vms_per_slice() {
        let mut p = policy(0, 10);
        let vm = room(4_000);
        // Two 1-core tasks fit the live worker's 2 free cores: no new slice.
        let two = required_slices(&p, &vm, &[room(2_000)], &vec![Demand::Task(cpu(1_000)); 2]);
        assert_eq!((two.slices, two.absorbed), (0, 2));
        // Nine more: 1 in the live room... 8 cores need 2 new 4-core VMs; a 3rd task of 3 cores
        // needs a third.
        let mut d = vec![Demand::Task(cpu(1_000)); 10];
        d.push(Demand::Task(cpu(3_000)));
        let need = required_slices(&p, &vm, &[room(2_000)], &d);
        assert_eq!(need.slices, 3);
        assert_eq!(
            need.unabsorbed,
            (2..11).collect::<Vec<_>>(),
            "the first two fit the live room"
        );
        p.num_vms = 2;
        assert_eq!(
            required_slices(&p, &vm, &[room(2_000)], &d).slices,
            2,
            "two VMs a slice"
        );
        // A task no VM of the group can hold needs none of its slices.
        let too_big = required_slices(&p, &vm, &[], &[Demand::Task(cpu(8_000))]);
        assert_eq!((too_big.slices, too_big.unabsorbed), (0, vec![0]));
    }

    #[test]
    fn a_gang_takes_live_hosts_or_whole_slices() {
        let mut p = policy(0, 10);
        p.num_vms = 2;
        let vm = cpu(4_000);
        let gang = Demand::Gang {
            size: 4,
            each: cpu(4_000),
        };
        let fits = required_slices(&p, &vm, &vec![vm.clone(); 4], std::slice::from_ref(&gang));
        assert_eq!((fits.slices, fits.absorbed), (0, 1));
        assert_eq!(
            required_slices(&p, &vm, &vec![vm.clone(); 3], &[gang]).slices,
            2
        );
    }
}
