//! How much memory this machine can still give a process, so that work too large for it
//! is refused with a message before it starts rather than aborting half-way.

use crate::error::{Error, Result};

/// Bytes this machine can still give a process: `MemAvailable` plus free swap, from
/// `/proc/meminfo` (`None` where that file does not exist or cannot be read).
pub fn available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |key: &str| -> Option<u64> {
        let line = info.lines().find(|l| l.starts_with(key))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    Some((kib("MemAvailable:")? + kib("SwapFree:").unwrap_or(0)) * 1024)
}

/// Work below this size is let through unasked: reading `/proc/meminfo` costs about
/// 10 µs, a share of a one-sentence embedding (1.4 ms), and no machine lacks it.
const UNCHECKED: usize = 64 << 20;

/// Refuses work estimated to need `need` bytes (`None`: more than can be counted) when
/// the machine has less available, saying both figures; `what` names the work.
pub fn check(need: Option<usize>, what: &str) -> Result<()> {
    if need.is_some_and(|n| n < UNCHECKED) {
        return Ok(());
    }
    let Some(have) = available() else {
        return Ok(());
    };
    let need = match need {
        Some(n) if (n as u64) <= have => return Ok(()),
        Some(n) => format!("about {:.1} GB", n as f64 / 1e9),
        None => "more memory than can be counted".to_string(),
    };
    Err(Error::Memory {
        what: what.to_string(),
        need,
        available_gb: have as f64 / 1e9,
    })
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_work_passes_and_uncountable_work_is_refused_where_memory_is_known() {
        assert!(check(Some(1), "one byte").is_ok());
        if available().is_some() {
            let e = check(None, "the cache").unwrap_err().to_string();
            assert!(e.contains("the cache") && e.contains("GB available"), "{e}");
            assert!(check(Some(usize::MAX), "the cache").is_err());
        }
    }
}
