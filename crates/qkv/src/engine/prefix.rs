//! Automatic prefix caching (vLLM's): finished and prefilled sequences' keys and values
//! are kept in blocks of [`PrefixCache::BLOCK`] positions, each keyed by a hash of every
//! token up to its end, so a later prompt that starts with the same tokens (a chat's
//! next turn, a shared system prompt) restores those positions instead of computing
//! them again. The blocks form a tree (a block's key covers its parent's); the cache is
//! bounded in bytes and evicts the least recently used leaves first, so a kept block's
//! ancestors are always kept too.
//!
//! A block is restored by copying its rows into the new sequence's own cache: a copy of
//! a 2 000-token history costs what reading it once costs, where computing it costs a
//! forward over 2 000 tokens.

use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};

use crate::attention::{KvCache, KvSpan};
use crate::error::Result;
use crate::models::{Position, Transformer};

/// One block: `BLOCK` tokens after its parent's, and their keys and values.
struct Block {
    parent: Option<u64>,
    tokens: Vec<usize>,
    kv: KvSpan,
    /// the clock at its last use
    used: u64,
    /// cached blocks that continue it
    children: usize,
}

/// What the cache has done, for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Prompt tokens looked up.
    pub looked_up: u64,
    /// Of them, tokens restored from the cache.
    pub hit: u64,
    /// Blocks evicted to stay within the budget.
    pub evicted: u64,
    /// Blocks and bytes held now.
    pub blocks: usize,
    pub bytes: usize,
}

/// Cached keys and values of token prefixes, within a budget of bytes.
pub struct PrefixCache {
    budget: usize,
    blocks: HashMap<u64, Block>,
    /// blocks without children, by (last use, key): the eviction order
    leaves: BTreeSet<(u64, u64)>,
    clock: u64,
    stats: PrefixStats,
}

impl PrefixCache {
    /// Positions a block holds (vLLM's default block size).
    pub const BLOCK: usize = 16;

    /// An empty cache that holds at most `budget` bytes of keys, values and tokens.
    pub fn new(budget: usize) -> Self {
        PrefixCache {
            budget,
            blocks: HashMap::new(),
            leaves: BTreeSet::new(),
            clock: 0,
            stats: PrefixStats::default(),
        }
    }

    pub fn stats(&self) -> PrefixStats {
        self.stats
    }

    /// Restores into the empty one-row `cache` the longest cached prefix of
    /// `tokens[..usable]` (whole blocks) → the positions restored.
    pub fn restore(
        &mut self,
        tokens: &[usize],
        usable: usize,
        cache: &mut KvCache,
    ) -> Result<usize> {
        self.stats.looked_up += tokens.len() as u64;
        let mut parent = None;
        let mut chain = Vec::new();
        for block in tokens[..usable.min(tokens.len())].chunks_exact(Self::BLOCK) {
            let key = key(parent, block);
            match self.blocks.get(&key) {
                Some(b) if b.parent == parent && b.tokens == block => chain.push(key),
                _ => break,
            }
            parent = Some(key);
        }
        for key in &chain {
            cache.push_span(&self.blocks[key].kv)?;
            self.touch(*key);
        }
        let restored = chain.len() * Self::BLOCK;
        self.stats.hit += restored as u64;
        Ok(restored)
    }

    /// Keeps the whole blocks of `tokens[..usable]` whose keys and values `cache` (one
    /// row, at least `usable` positions, `tokens[i]` at position i) holds; blocks
    /// already kept are only marked used. Stops at the first block the budget cannot
    /// make room for.
    pub fn insert(&mut self, tokens: &[usize], usable: usize, cache: &KvCache) -> Result<()> {
        let usable = usable.min(tokens.len()).min(cache.len());
        let mut parent = None;
        for (i, block) in tokens[..usable].chunks_exact(Self::BLOCK).enumerate() {
            let key = key(parent, block);
            match self.blocks.get(&key) {
                Some(b) if b.parent == parent && b.tokens == block => self.touch(key),
                // a hash collision with another prefix: keep the one already there
                Some(_) => return Ok(()),
                None => {
                    let kv = cache.span(i * Self::BLOCK, Self::BLOCK)?;
                    let bytes = block_bytes(&kv);
                    if !self.make_room(bytes, parent) {
                        return Ok(());
                    }
                    self.clock += 1;
                    if let Some(p) = parent {
                        let pb = self.blocks.get_mut(&p).expect("the chain's parent is kept");
                        if pb.children == 0 {
                            self.leaves.remove(&(pb.used, p));
                        }
                        pb.children += 1;
                    }
                    self.blocks.insert(
                        key,
                        Block {
                            parent,
                            tokens: block.to_vec(),
                            kv,
                            used: self.clock,
                            children: 0,
                        },
                    );
                    self.leaves.insert((self.clock, key));
                    self.stats.blocks += 1;
                    self.stats.bytes += bytes;
                }
            }
            parent = Some(key);
        }
        Ok(())
    }

    /// Marks a kept block used now.
    fn touch(&mut self, key: u64) {
        self.clock += 1;
        let b = self.blocks.get_mut(&key).expect("a kept block");
        if b.children == 0 {
            self.leaves.remove(&(b.used, key));
            self.leaves.insert((self.clock, key));
        }
        b.used = self.clock;
    }

    /// Evicts least recently used leaves, never `keep` (the block a new one continues),
    /// until `bytes` more fit; false when they cannot.
    fn make_room(&mut self, bytes: usize, keep: Option<u64>) -> bool {
        if bytes > self.budget {
            return false;
        }
        while self.stats.bytes + bytes > self.budget {
            let Some(&(used, key)) = self.leaves.iter().find(|&&(_, k)| Some(k) != keep) else {
                return false;
            };
            self.leaves.remove(&(used, key));
            let b = self.blocks.remove(&key).expect("a leaf is kept");
            self.stats.bytes -= block_bytes(&b.kv);
            self.stats.blocks -= 1;
            self.stats.evicted += 1;
            if let Some(p) = b.parent {
                let pb = self
                    .blocks
                    .get_mut(&p)
                    .expect("a kept block's parent is kept");
                pb.children -= 1;
                if pb.children == 0 {
                    self.leaves.insert((pb.used, p));
                }
            }
        }
        true
    }
}

/// A block's key: its parent's key and its own tokens.
fn key(parent: Option<u64>, tokens: &[usize]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// What a block holds in memory: its rows and its tokens.
fn block_bytes(kv: &KvSpan) -> usize {
    kv.bytes() + PrefixCache::BLOCK * std::mem::size_of::<usize>()
}

/// How many leading positions of a sequence whose prompt has `prompt_len` tokens (and
/// whose cache holds `cached` positions) are the same whatever calls computed them, so
/// that a prefix cache may keep and restore them. All of them, except with a RoPE
/// scaling that depends on a call's length (dynamic, LongRoPE): a prompt longer than
/// the trained length is computed with other frequencies than its shorter prefixes, so
/// none of it is shared; otherwise the positions below the trained length.
pub fn reusable_positions(model: &Transformer, prompt_len: usize, cached: usize) -> usize {
    let threshold = match &model.arch.position {
        Position::Rope { scaling, .. } => scaling.call_threshold(),
        _ => None,
    };
    match threshold {
        Some(t) if prompt_len > t => 0,
        Some(t) => cached.min(t),
        None => cached,
    }
}
