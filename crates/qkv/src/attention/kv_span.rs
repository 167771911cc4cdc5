//! A run of positions cut out of a one-row KV cache, every layer's keys and values in
//! the cache's own type, and put back at the end of another cache of the same shape: a
//! prefix cache keeps finished sequences' positions this way and restores them in front
//! of a later prompt that starts with the same tokens.

use super::cache::{KvCache, Rows};
use crate::error::{Error, Result};

/// Positions `start..start + len` of a one-row cache: per layer, keys `[G, len, Dk]` and
/// values `[G, len, Dv]` (the cache's heads-major order).
#[derive(Clone, Debug)]
pub struct KvSpan {
    layers: Vec<(Rows, Rows)>,
    len: usize,
}

impl KvSpan {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes its rows take.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|(k, v)| k.len() * k.width() + v.len() * v.width())
            .sum()
    }
}

impl KvCache {
    /// A copy of positions `start..start + len` of this one-row cache, all of them
    /// real tokens.
    pub fn span(&self, start: usize, len: usize) -> Result<KvSpan> {
        if self.batch() != 1 || start + len > self.len() {
            return Err(Error::invalid(
                "kv cache",
                format!(
                    "positions {start}..{} of a {}-row cache of {}: a span is cut from one row's cached positions",
                    start + len,
                    self.batch(),
                    self.len()
                ),
            ));
        }
        Ok(KvSpan {
            layers: self.layers.iter().map(|l| l.span(start, len)).collect(),
            len,
        })
    }

    /// Appends `span`'s positions after this one-row cache's, as real tokens; a span of
    /// another shape or type is refused and the cache left unchanged.
    pub fn push_span(&mut self, span: &KvSpan) -> Result<()> {
        if span.layers.len() != self.layers.len() {
            return Err(Error::invalid(
                "kv cache",
                format!(
                    "a span of {} layers for a cache of {}",
                    span.layers.len(),
                    self.layers.len()
                ),
            ));
        }
        // every layer checked first, so a refusal changes nothing
        for (layer, (k, v)) in self.layers.iter().zip(&span.layers) {
            layer.check_span(k, v, span.len)?;
        }
        for (layer, (k, v)) in self.layers.iter_mut().zip(&span.layers) {
            layer.push_span(k, v, span.len);
        }
        self.extend_real(span.len);
        Ok(())
    }
}
