//! Placeholder until the family lands: loading reports it as unsupported.

use std::path::Path;

use super::Model;
use crate::error::{Error, Result};
use crate::io::Checkpoint;

pub fn load(_dir: &Path, _ckpt: &Checkpoint) -> Result<Model> {
    Err(Error::Unsupported(
        "marian models are not implemented yet".into(),
    ))
}
