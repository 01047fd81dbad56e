//! The background controllers: Kueue, the scheduler/kubelet, the garbage collector and the
//! disruption controller, run in that order on every tick (and soon after any write).

use std::sync::{Arc, Weak};
use std::time::Duration;

use serde_json::Value;

use crate::apiserver::{self, DeleteOpts};
use crate::cluster::{Cluster, Shared};
use crate::store::{meta_str, name_of};
use crate::{kubelet, kueue, pdb};

/// One pass of every controller.
pub(crate) fn step(cl: &mut Cluster, shared: &Weak<Shared>) {
    kueue::tick(cl);
    kubelet::tick(cl, shared);
    collect_garbage(cl);
    pdb::tick(cl);
}

/// Deletes (in the background, like the garbage collector) every object whose owners are all gone.
fn collect_garbage(cl: &mut Cluster) {
    let uids = cl.store.all_uids();
    let orphans: Vec<(usize, String, String)> = cl
        .store
        .all_objects()
        .into_iter()
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
                meta_str(&o, "namespace").to_string(),
                name_of(&o).to_string(),
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
        step(&mut shared.lock(), &weak);
    }
}
