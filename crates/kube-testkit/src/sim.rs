//! The background controllers: Kueue, the scheduler/kubelet, the garbage collector and the
//! disruption controller, run in that order on every tick (and soon after any write).

use std::sync::{Arc, Weak};
use std::time::Duration;

use serde_json::Value;

use crate::apiserver::{self, DeleteOpts};
use crate::cluster::{Cluster, Shared};
use crate::resources::id;
use crate::store::{meta_str, name_of};
use crate::{kubelet, kueue, pdb};

/// Whether a pass can be skipped: no write since the last pass that made none, no process exit
/// or setting change, no run waiting on the clock, and the last full pass under a second ago.
fn idle(cl: &Cluster) -> bool {
    cl.store.resource_version() == cl.sim.settled_rv
        && !cl.kubelet.dirty
        && !cl.sim.dirty
        && !cl.kubelet.needs_time()
        && cl
            .sim
            .last_full
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
}

/// One pass of every controller, in order, with the lock released (and the runtime yielded to)
/// between controllers so API requests are not held up by a whole pass.
pub(crate) async fn step(shared: &Arc<Shared>, weak: &Weak<Shared>) {
    let rv = {
        let mut cl = shared.lock();
        if idle(&cl) {
            return;
        }
        cl.kubelet.dirty = false;
        cl.sim.dirty = false;
        cl.sim.last_full = Some(std::time::Instant::now());
        cl.store.resource_version()
    };
    let phases: [&(dyn Fn(&mut Cluster) + Sync); 5] = [
        &kueue::tick,
        &|cl| kubelet::tick(cl, weak),
        &collect_orphaned_pods,
        &collect_garbage,
        &pdb::tick,
    ];
    for phase in phases {
        phase(&mut shared.lock());
        tokio::task::yield_now().await;
    }
    // A pass that wrote something is followed by another, so every controller sees the writes.
    let mut cl = shared.lock();
    if cl.store.resource_version() == rv {
        cl.sim.settled_rv = rv;
    }
    cl.sim.passes += 1;
}

/// When the simulation last ran and what it had seen.
#[derive(Debug, Default)]
pub(crate) struct SimState {
    /// The resourceVersion after the last pass that wrote nothing.
    settled_rv: u64,
    /// A setting changed since the last pass.
    pub(crate) dirty: bool,
    last_full: Option<std::time::Instant>,
    /// Passes completed (skipped idle ticks not counted).
    pub(crate) passes: u64,
}

/// The pod garbage collector's orphan rule: a pod bound to a node that no longer exists gets
/// `DisruptionTarget=True` (reason `DeletionByPodGC`) and is force-deleted.
fn collect_orphaned_pods(cl: &mut Cluster) {
    let nodes: std::collections::HashSet<String> = cl
        .store
        .list(id::NODES, None)
        .map(|n| name_of(n).to_string())
        .collect();
    let orphans: Vec<Value> = cl
        .store
        .list(id::PODS, None)
        .filter(|p| {
            let node = crate::pod::node_name(p);
            !node.is_empty() && !nodes.contains(node)
        })
        .cloned()
        .collect();
    for mut p in orphans {
        let (ns, name) = (
            meta_str(&p, "namespace").to_string(),
            name_of(&p).to_string(),
        );
        if !crate::pod::is_terminal(&p) {
            crate::pod::set_condition(
                &mut p,
                "DisruptionTarget",
                "True",
                "DeletionByPodGC",
                "PodGC: node no longer exists",
                true,
            );
            let st = crate::pod::status_mut(&mut p);
            st.insert("phase".into(), serde_json::json!("Failed"));
            cl.store.update(id::PODS, p);
        }
        // Force deletion, as the pod GC does: no grace, finalizers still honoured.
        let opts = DeleteOpts {
            grace: Some(0),
            ..Default::default()
        };
        let _ = apiserver::delete(cl, id::PODS, &ns, &name, &opts);
    }
}

/// Deletes (in the background, like the garbage collector) every object whose owners are all gone.
fn collect_garbage(cl: &mut Cluster) {
    let uids = cl.store.all_uids();
    let orphans: Vec<(usize, String, String)> = cl
        .store
        .iter_all()
        .filter(|(_, o)| {
            o.pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .is_some_and(|refs| {
                    !refs.is_empty()
                        && refs.iter().all(|r| {
                            !uids.contains(r.get("uid").and_then(Value::as_str).unwrap_or_default())
                        })
                })
                && !crate::pod::is_deleting(o)
        })
        .map(|(res, o)| {
            (
                res,
                meta_str(o, "namespace").to_string(),
                name_of(o).to_string(),
            )
        })
        .collect();
    for (res, ns, name) in orphans {
        // Already gone or refused: nothing to collect.
        let _ = apiserver::delete(cl, res, &ns, &name, &DeleteOpts::default());
    }
}

/// Runs [`step`] every `tick`, and shortly after a write kicks it, until shutdown.
pub(crate) async fn run(shared: Arc<Shared>, tick: Duration) {
    let weak = Arc::downgrade(&shared);
    let mut shutdown = shared.shutdown.subscribe();
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = shared.kick.notified() => {
                // Coalesce a burst of writes into one pass.
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            _ = shutdown.changed() => break,
        }
        if shared.is_shut_down() {
            break;
        }
        let started = std::time::Instant::now();
        step(&shared, &weak).await;
        // Under load, leave the API at least as much time as a pass takes.
        let spent = started.elapsed().min(Duration::from_millis(100));
        if spent > Duration::from_millis(5) {
            tokio::time::sleep(spent).await;
        }
    }
}
