//! Attention flow (Abnar & Zuidema 2020), as the authors' `compute_flows` computes it:
//! the nodes are every token of every layer's input, (L+1)·T of them; the edge from
//! token t after layer l to token s before it has capacity Â_l[t, s]; the flow of input
//! token s into token t after layer l is the value of a maximum flow between the two
//! nodes, and each row is divided by its sum.
//!
//! Maximum flows by Dinic's algorithm (the value is the same whatever the algorithm;
//! the authors' code uses networkx's Edmonds–Karp).

use super::residual::{matrix, residual_means};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// The longest input [`flow`] takes: it runs L·T² maximum flows over graphs of up to
/// L·T² edges, which at 12 layers and 48 tokens is some seconds.
pub const MAX_FLOW_TOKENS: usize = 48;

/// Flow through every layer: `maps` `[H, T, T]` per layer → `[T, T]` per layer, rows
/// summing to 1 (see the module docs).
pub fn flow(maps: &[Tensor]) -> Result<Vec<Tensor>> {
    let (t, steps) = residual_means(maps)?;
    if t > MAX_FLOW_TOKENS {
        return Err(Error::invalid(
            "maps",
            format!("attention flow over {t} tokens: it takes at most {MAX_FLOW_TOKENS} (its cost grows as T⁴); use rollout for longer texts"),
        ));
    }
    let mut out = Vec::with_capacity(steps.len());
    for layer in 1..=steps.len() {
        // the graph of the layers up to this one: flow from its tokens runs down only
        let graph = Graph::layered(t, &steps[..layer]);
        let mut rows = vec![0f64; t * t];
        for (tok, row) in rows.chunks_exact_mut(t).enumerate() {
            for (s, x) in row.iter_mut().enumerate() {
                *x = graph.clone().max_flow(layer * t + tok, s);
            }
            let sum: f64 = row.iter().sum();
            if sum > 0.0 {
                row.iter_mut().for_each(|x| *x /= sum);
            }
        }
        out.push(matrix(t, &rows));
    }
    Ok(out)
}

/// A flow network with residual capacities: edge e and its reverse e ^ 1.
#[derive(Clone)]
struct Graph {
    /// per node, its edges (indices into `to` and `cap`)
    adj: Vec<Vec<usize>>,
    to: Vec<usize>,
    cap: Vec<f64>,
}

impl Graph {
    /// Nodes layer·T + token for layers 0..=steps.len(); the edge (l, t) → (l−1, s) has
    /// capacity steps[l−1][t·T + s] (zero-capacity edges, a causal map's upper triangle,
    /// are left out).
    fn layered(t: usize, steps: &[Vec<f64>]) -> Self {
        let mut g = Graph {
            adj: vec![Vec::new(); (steps.len() + 1) * t],
            to: Vec::new(),
            cap: Vec::new(),
        };
        for (l, step) in steps.iter().enumerate() {
            for (tok, row) in step.chunks_exact(t).enumerate() {
                for (s, &c) in row.iter().enumerate() {
                    if c > 0.0 {
                        g.edge((l + 1) * t + tok, l * t + s, c);
                    }
                }
            }
        }
        g
    }

    fn edge(&mut self, from: usize, to: usize, cap: f64) {
        self.adj[from].push(self.to.len());
        self.to.push(to);
        self.cap.push(cap);
        self.adj[to].push(self.to.len());
        self.to.push(from);
        self.cap.push(0.0);
    }

    /// Dinic: breadth-first levels over edges with capacity left, then blocking flows
    /// along strictly increasing levels, until the sink is out of reach.
    fn max_flow(mut self, source: usize, sink: usize) -> f64 {
        // residual capacities below this are spent (rounding of f64 sums)
        const SPENT: f64 = 1e-15;
        let n = self.adj.len();
        let mut total = 0.0;
        loop {
            let mut level = vec![usize::MAX; n];
            level[source] = 0;
            let mut queue = std::collections::VecDeque::from([source]);
            while let Some(u) = queue.pop_front() {
                for &e in &self.adj[u] {
                    let v = self.to[e];
                    if self.cap[e] > SPENT && level[v] == usize::MAX {
                        level[v] = level[u] + 1;
                        queue.push_back(v);
                    }
                }
            }
            if level[sink] == usize::MAX {
                return total;
            }
            let mut next = vec![0usize; n];
            loop {
                let pushed = self.push(source, sink, f64::INFINITY, &level, &mut next, SPENT);
                if pushed <= SPENT {
                    break;
                }
                total += pushed;
            }
        }
    }

    /// One augmenting path of the level graph from `u`, at most `limit`; `next[u]`: the
    /// first of u's edges not yet found blocked.
    fn push(
        &mut self,
        u: usize,
        sink: usize,
        limit: f64,
        level: &[usize],
        next: &mut [usize],
        spent: f64,
    ) -> f64 {
        if u == sink {
            return limit;
        }
        while next[u] < self.adj[u].len() {
            let e = self.adj[u][next[u]];
            let v = self.to[e];
            if self.cap[e] > spent && level[v] == level[u] + 1 {
                let got = self.push(v, sink, limit.min(self.cap[e]), level, next, spent);
                if got > spent {
                    self.cap[e] -= got;
                    self.cap[e ^ 1] += got;
                    return got;
                }
            }
            next[u] += 1;
        }
        0.0
    }
}
