//! What the fuzz targets share: a per-process scratch folder, the committed fixtures,
//! the tiny fixture models they run inputs through, and the checks on a tokenizer.

use std::path::{Path, PathBuf};
use std::sync::{Once, OnceLock};

use qkv::models::{Input, ModelKind, TokenBatch, Transformer};
use qkv::text::Tokenizer;

/// Once per process: a one-thread rayon pool (libFuzzer runs one input at a time and
/// the machine is shared), and the scratch folder removed at exit.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build_global();
        remove_stale_scratch();
        extern "C" fn remove_scratch() {
            let _ = std::fs::remove_dir_all(scratch_root());
        }
        // SAFETY: registers a plain `extern "C" fn` with no captured state.
        unsafe {
            atexit(remove_scratch);
        }
    });
}

/// Removes the scratch folders of processes that are gone: libFuzzer leaves through
/// `_Exit` after a crash, a timeout, or in `-fork` children, skipping `atexit`.
fn remove_stale_scratch() {
    let Some(base) = scratch_root().parent().map(Path::to_path_buf) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(&base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("qkv-fuzz-")) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

extern "C" {
    fn atexit(f: extern "C" fn()) -> i32;
}

/// `/dev/shm/qkv-fuzz-<pid>` (the temp folder where /dev/shm is missing): this
/// process's scratch space, removed when the process exits normally.
pub fn scratch_root() -> PathBuf {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    base.join(format!("qkv-fuzz-{}", std::process::id()))
}

/// A folder `name` inside this process's scratch space, created on first use.
pub fn scratch(name: &str) -> PathBuf {
    let dir = scratch_root().join(name);
    std::fs::create_dir_all(&dir).expect("creating the fuzz scratch folder");
    dir
}

/// `crates/qkv/tests/fixtures/<rel>` of this checkout.
pub fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../crates/qkv/tests/fixtures")
        .join(rel)
}

/// Writes `bytes` to `path` (replacing it).
pub fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).expect("writing a fuzz input to the scratch folder");
}

/// Links `target` as `link` (replacing what is there).
pub fn link(target: &Path, link: &Path) {
    let _ = std::fs::remove_file(link);
    std::os::unix::fs::symlink(target, link).expect("linking a fixture into the scratch folder");
}

/// A fixture model folder, loaded once: any error is a broken checkout.
pub fn fixture_model(rel: &str) -> Transformer {
    qkv::models::load(&fixture(rel))
        .unwrap_or_else(|e| panic!("fixture model {rel} does not load: {e}"))
        .model
}

/// Runs `tokens` through `model` the way `qkv forward` does: an encoder's hidden
/// states (with `token_types`), a decoder's logits, or an encoder-decoder's logits
/// with `tokens` as the source and `decoder` as the target.
pub fn forward(
    model: &Transformer,
    tokens: &TokenBatch,
    token_types: Option<&[usize]>,
    decoder: Option<&TokenBatch>,
) -> qkv::Result<qkv::Tensor> {
    match model.kind() {
        ModelKind::Encoder => model.hidden_states(tokens, token_types),
        ModelKind::Decoder => {
            let input = Input {
                target: Some(tokens),
                ..Default::default()
            };
            Ok(model.forward(&input, false)?.logits)
        }
        ModelKind::EncoderDecoder => {
            let input = Input {
                source: Some(tokens),
                target: Some(decoder.unwrap_or(tokens)),
                token_types: None,
            };
            Ok(model.forward(&input, false)?.logits)
        }
    }
}

/// With `QKV_FUZZ_VERBOSE` set, prints why an input stopped early (to check that the
/// seeds reach the code behind the parsers: `QKV_FUZZ_VERBOSE=1 <target> -runs=0 corpus`).
pub fn note(what: &str, error: &dyn std::fmt::Display) {
    static ON: OnceLock<bool> = OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("QKV_FUZZ_VERBOSE").is_some()) {
        eprintln!("qkv-fuzz: {what}: {error}");
    }
}

/// A tokenizer that loaded: `text`, encoded with and without special tokens, gets one
/// label per token, decodes, and streams into the decoded text (byte fallback may
/// garble a run of bytes cut inside a character, already-shown characters included:
/// then the rest is U+FFFD). A tokenizer may still refuse a text (an unknown character
/// without an unk token); it must not panic.
pub fn encode_label_decode_stream(tok: &Tokenizer, text: &str) {
    for special in [true, false] {
        let ids = match tok.encode(text, special) {
            Ok(ids) => ids,
            Err(e) => {
                note("encode", &e);
                continue;
            }
        };
        if let Ok(labels) = tok.labels(&ids, &[0]) {
            assert_eq!(labels.len(), ids.len(), "one label per token");
        }
        let decoded = tok.decode(&ids);
        let mut stream = tok.stream();
        let pieces: qkv::Result<Vec<Option<String>>> =
            ids.iter().map(|&id| stream.push(id)).collect();
        if let (Ok(decoded), Ok(pieces), Ok(rest)) = (decoded, pieces, stream.finish()) {
            let joined: String = pieces.into_iter().chain([rest]).flatten().collect();
            if decoded.ends_with('\u{FFFD}') {
                assert!(joined.ends_with('\u{FFFD}'), "{joined:?} vs {decoded:?}");
            } else {
                assert_eq!(joined, decoded, "streamed pieces vs decode");
            }
        }
    }
    // ids no vocabulary holds
    let _ = tok.labels(&[usize::MAX, 1 << 40, 7], &[]);
    let _ = tok.decode(&[u32::MAX as usize, 3]);
}
