//! Attention maps of one input through a checkpoint, by one attribution method: the
//! weights (or another method's credit) of chosen layers and heads, with the tokens
//! they relate. `select` picks the maps from a forward's attentions, `document` is
//! what `qkv attention --json` writes, with the target of `target`, and `viewer` the
//! offline HTML page that shows it.

pub mod document;
pub mod select;
pub mod target;
pub mod viewer;
