//! First-fit search over a ranked worker list in O(log n) per query in the common case.
//!
//! A segment tree keeps, for every range of the ranked list, the component-wise maximum of
//! free cpu/memory/gpu/tpu over the open workers in it. A range whose maxima cannot satisfy a
//! request holds no fitting worker and is skipped, so the leftmost fitting worker (= first fit in
//! rank order) is found without scanning every worker that does not fit.
//!
//! The tree may be *stale high*: free capacity only shrinks and closed workers stay closed
//! during the placement pass, so a stored maximum is never below the truth and pruning stays
//! sound. Leaves are re-read from [`Capacity`] when visited and fixed on the way.

use crate::engine::Capacity;
use iris_types::{Dim, Resources};

/// `[cpu, memory, gpu, tpu, open]`.
type Node = [i64; 5];

const CLOSED: Node = [i64::MIN, i64::MIN, i64::MIN, i64::MIN, 0];

/// The request in node form: requested dimensions, 0 elsewhere.
pub(crate) fn request_node(req: &Resources) -> [i64; 4] {
    Dim::CHECKED.map(|d| req.get(d).max(0))
}

fn may_fit(node: &Node, req: &[i64; 4]) -> bool {
    node[4] > 0 && (0..4).all(|d| req[d] == 0 || node[d] >= req[d])
}

pub(crate) struct FirstFit {
    /// Worker indices in rank order.
    order: Vec<usize>,
    /// Number of leaves (a power of two).
    size: usize,
    /// Heap-ordered nodes; node 1 is the root, leaves start at `size`.
    max: Vec<Node>,
}

impl FirstFit {
    pub(crate) fn new(order: Vec<usize>, cap: &Capacity) -> FirstFit {
        let size = order.len().next_power_of_two().max(1);
        let mut max = vec![CLOSED; 2 * size];
        for (pos, &w) in order.iter().enumerate() {
            max[size + pos] = leaf(cap, w);
        }
        for node in (1..size).rev() {
            max[node] = merge(&max[2 * node], &max[2 * node + 1]);
        }
        FirstFit { order, size, max }
    }

    /// The first worker in rank order that is open and where `req` fits, with its position.
    pub(crate) fn find(&mut self, req: &Resources, cap: &Capacity) -> Option<(usize, usize)> {
        let req = request_node(req);
        self.search(1, &req, cap)
    }

    fn search(&mut self, node: usize, req: &[i64; 4], cap: &Capacity) -> Option<(usize, usize)> {
        if !may_fit(&self.max[node], req) {
            return None;
        }
        if node >= self.size {
            let pos = node - self.size;
            let w = *self.order.get(pos)?;
            let actual = leaf(cap, w);
            if actual != self.max[node] {
                self.set(node, actual);
            }
            return may_fit(&actual, req).then_some((pos, w));
        }
        self.search(2 * node, req, cap)
            .or_else(|| self.search(2 * node + 1, req, cap))
    }

    /// Re-reads worker `w`'s leaf (after an assignment to it) if `w` is in this list.
    pub(crate) fn refresh(&mut self, pos: usize, cap: &Capacity) {
        if let Some(&w) = self.order.get(pos) {
            self.set(self.size + pos, leaf(cap, w));
        }
    }

    #[cfg(test)]
    fn position(&self, w: usize) -> Option<usize> {
        self.order.iter().position(|&x| x == w)
    }

    fn set(&mut self, mut node: usize, value: Node) {
        self.max[node] = value;
        while node > 1 {
            node /= 2;
            let merged = merge(&self.max[2 * node], &self.max[2 * node + 1]);
            if merged == self.max[node] {
                break;
            }
            self.max[node] = merged;
        }
    }
}

fn leaf(cap: &Capacity, w: usize) -> Node {
    if cap.closed(w) {
        return CLOSED;
    }
    let f = &cap.free[w];
    [f.cpu_millicores, f.memory_bytes, f.gpu, f.tpu, 1]
}

fn merge(a: &Node, b: &Node) -> Node {
    [
        a[0].max(b[0]),
        a[1].max(b[1]),
        a[2].max(b[2]),
        a[3].max(b[3]),
        a[4].max(b[4]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift, so the test needs no dependency.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    fn linear(order: &[usize], req: &Resources, cap: &Capacity) -> Option<usize> {
        order.iter().copied().find(|&w| cap.can_host(w, req))
    }

    #[test]
    fn agrees_with_a_linear_scan_while_capacity_shrinks() {
        for seed in 1..40u64 {
            let mut rng = Rng(seed * 0x9E37_79B9);
            let n = 1 + rng.below(70) as usize;
            let mut cap = Capacity::for_test(
                (0..n)
                    .map(|_| Resources {
                        cpu_millicores: rng.below(9) as i64 * 1000,
                        memory_bytes: rng.below(9) as i64,
                        gpu: rng.below(3) as i64,
                        ..Resources::default()
                    })
                    .collect(),
                2 + rng.below(3) as usize,
                1 + rng.below(4) as usize,
            );
            // A ranked subset in a scrambled order.
            let mut order: Vec<usize> = (0..n).filter(|_| rng.below(4) != 0).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i as u64 + 1) as usize);
            }
            let mut ff = FirstFit::new(order.clone(), &cap);
            for _ in 0..200 {
                let req = Resources {
                    cpu_millicores: rng.below(5) as i64 * 1000,
                    memory_bytes: rng.below(5) as i64,
                    gpu: rng.below(2) as i64,
                    ..Resources::default()
                };
                let got = ff.find(&req, &cap);
                assert_eq!(got.map(|g| g.1), linear(&order, &req, &cap), "seed {seed}");
                if let Some((pos, w)) = got {
                    assert_eq!(ff.position(w), Some(pos));
                    cap.take(w, &req);
                    // Sometimes skip the refresh: stale leaves must still be handled.
                    if rng.below(2) == 0 {
                        ff.refresh(pos, &cap);
                    }
                } else if rng.below(3) == 0 {
                    // Capacity taken by someone outside this list.
                    let w = rng.below(n as u64) as usize;
                    cap.take(w, &Resources::cpu_mem(500, 1));
                }
            }
        }
    }

    #[test]
    fn empty_list_finds_nothing() {
        let cap = Capacity::for_test(vec![], 4, 4);
        let mut ff = FirstFit::new(vec![], &cap);
        assert_eq!(ff.find(&Resources::default(), &cap), None);
    }
}
