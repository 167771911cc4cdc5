//! `qkv attention`: the attention weights of a checkpoint on one text, as a heatmap
//! (SVG, PNG), an offline viewer (HTML) or numbers (JSON).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use qkv::io::write_atomic;
use qkv::models::generate::{generate_seq2seq, GenerateOptions, Sampling};
use qkv::models::{Input, Loaded, ModelKind, TokenBatch, Transformer};
use qkv::text::{TokenLabel, Tokenizer};

use crate::maps::{viewer, Heads, Kind, Maps, Selection};
use crate::report::{heatmap, raster};

/// Most weights one output may hold: about 160 MB of JSON, a page a browser still opens.
const MAX_WEIGHTS: usize = 16 << 20;

/// Most bytes the forward's attention maps may take.
const MAX_MAP_BYTES: usize = 8 << 30;

/// Checkpoints from this size on get progress lines on stderr.
const BIG_MODEL_BYTES: u64 = 256 << 20;

#[derive(clap::Args)]
pub struct AttentionArgs {
    /// Hugging Face model folder
    #[arg(long)]
    model: PathBuf,
    /// Input text (needs the folder's tokenizer.json); the source of an encoder-decoder
    #[arg(
        long,
        conflicts_with = "input_ids",
        required_unless_present = "input_ids"
    )]
    text: Option<String>,
    /// Input as comma-separated token ids, e.g. 101,1996,102
    #[arg(long, value_delimiter = ',')]
    input_ids: Option<Vec<usize>>,
    /// BERT segment ids, one per input token (default: all 0)
    #[arg(long, value_delimiter = ',')]
    token_type_ids: Option<Vec<usize>>,
    /// Encoder-decoders: the target text, fed to the decoder after its start token.
    /// Without it (or --target-ids) the greedy translation is used
    #[arg(long, conflicts_with = "target_ids")]
    target: Option<String>,
    /// Encoder-decoders: the decoder's input ids, start token included
    #[arg(long, value_delimiter = ',')]
    target_ids: Option<Vec<usize>>,
    /// Encoder-decoders without a target: most tokens the greedy translation makes
    #[arg(long, default_value_t = 32)]
    max_new_tokens: usize,
    /// Which attention: encoder, decoder or cross (default: all for .html and --json;
    /// for a heatmap, cross-attention of an encoder-decoder, else the only one)
    #[arg(long, value_enum)]
    kind: Option<Kind>,
    /// Layer, from 0 (default: every layer; the last for a heatmap)
    #[arg(long)]
    layer: Option<usize>,
    /// Head, from 0, or `mean` for the average of the heads (default: every head; the
    /// mean for a heatmap)
    #[arg(long, value_parser = parse_head)]
    head: Option<Heads>,
    /// Drop special tokens ([CLS], [SEP], BOS, …) from a heatmap and renormalise each
    /// row over the rest; in the viewer, start with its toggle on
    #[arg(long)]
    hide_special: bool,
    /// Output: FILE.html (the viewer), FILE.svg or FILE.png (one heatmap)
    #[arg(long, required_unless_present = "json")]
    out: Option<PathBuf>,
    /// Also write the weights with the tokens as JSON
    #[arg(long)]
    json: Option<PathBuf>,
    /// Font for .png text (default: the system's sans-serif; characters it lacks are
    /// drawn with any installed font that has them)
    #[arg(long)]
    font: Option<PathBuf>,
    /// Print a progress line per step on stderr (on by itself for checkpoints of 256 MB
    /// and more)
    #[arg(long)]
    progress: bool,
    /// Worker threads (default: all cores)
    #[arg(long)]
    threads: Option<usize>,
}

fn parse_head(s: &str) -> std::result::Result<Heads, String> {
    match s {
        "mean" => Ok(Heads::Mean),
        n => n
            .parse()
            .map(Heads::One)
            .map_err(|_| format!("`{s}` is neither a head number nor `mean`")),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    Html,
    Svg,
    Png,
}

fn format_of(path: &Path) -> Result<Format> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    Ok(match ext.to_ascii_lowercase().as_str() {
        "html" | "htm" => Format::Html,
        "svg" => Format::Svg,
        "png" => Format::Png,
        _ => bail!(
            "--out {}: unknown extension `{ext}`: write .html (the viewer), .svg or .png",
            path.display()
        ),
    })
}

/// Fails unless `path` can be written as the output is (a new file renamed into its
/// folder, or written through to an existing device or FIFO), so that a bad output is
/// reported before the model runs. Asks the OS (`access`) rather than creating a
/// probe file, which would leave a trace beside a device such as `/dev/stdout`.
fn check_writable(flag: &str, path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let meta = std::fs::metadata(path).ok();
    if meta.as_ref().is_some_and(|m| m.is_dir()) {
        bail!("{flag} {}: is a folder", path.display());
    }
    // an existing device, FIFO or socket is written through, not replaced
    if meta.is_some_and(|m| !m.is_file()) {
        return writable(path, libc::W_OK)
            .with_context(|| format!("{flag} {}: cannot write to it", path.display()));
    }
    if !dir.is_dir() {
        bail!(
            "{flag} {}: folder {} does not exist",
            path.display(),
            dir.display()
        );
    }
    writable(dir, libc::W_OK | libc::X_OK).with_context(|| {
        format!(
            "{flag} {}: cannot write in {}",
            path.display(),
            dir.display()
        )
    })
}

/// `access(2)` for `mode`: the OS's answer (read-only file systems included) without
/// opening anything.
fn writable(path: &Path, mode: libc::c_int) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    match unsafe { libc::access(c.as_ptr(), mode) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Progress lines on stderr for big checkpoints, each with the time the last step took.
struct Steps {
    on: bool,
    since: Instant,
}

impl Steps {
    fn step(&mut self, what: &str) {
        if self.on {
            eprintln!(
                "qkv attention: {what} ({:.1} s)",
                self.since.elapsed().as_secs_f64()
            );
        }
        self.since = Instant::now();
    }
}

fn weight_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Checks `ids` fit the model: each below the vocabulary, at most its positions.
fn check_ids(what: &str, ids: &[usize], model: &Transformer) -> Result<()> {
    let info = model.info();
    if ids.is_empty() {
        bail!("{what} has no tokens");
    }
    if let Some(&bad) = ids.iter().find(|&&id| id >= info.vocab) {
        bail!(
            "{what}: token id {bad} is outside the vocabulary of {}",
            info.vocab
        );
    }
    if let Some(max) = info.max_positions {
        if ids.len() > max {
            bail!(
                "{what} is {} tokens; this model takes at most {max} (its position limit)",
                ids.len()
            );
        }
    }
    Ok(())
}

/// The encoder-decoder's decoder input: the given ids, or the start token then the
/// target text's tokens, or the start token then the greedy output.
fn decoder_input(
    args: &AttentionArgs,
    model: &Transformer,
    tok: Option<&Tokenizer>,
    source: &TokenBatch,
) -> Result<Vec<usize>> {
    if let Some(ids) = &args.target_ids {
        return Ok(ids.clone());
    }
    let start = model.special_tokens().decoder_start.context(
        "the model config defines no decoder_start_token_id; pass the decoder input with --target-ids",
    )?;
    let rest = match (&args.target, tok) {
        (Some(text), Some(tok)) => tok.encode(text, true)?,
        (Some(_), None) => {
            bail!("--target needs the folder's tokenizer.json; pass --target-ids instead")
        }
        (None, _) => {
            if args.max_new_tokens == 0 {
                bail!("--max-new-tokens must be at least 1 (or give --target)");
            }
            let opts = GenerateOptions::new(
                args.max_new_tokens,
                Sampling::Greedy,
                model.special_tokens().eos.clone(),
            );
            generate_seq2seq(model, source, &opts)?.remove(0)
        }
    };
    Ok(std::iter::once(start).chain(rest).collect())
}

/// Labels of `ids`, from the tokenizer when there is one.
fn labels(tok: Option<&Tokenizer>, ids: &[usize], model: &Transformer) -> Result<Vec<TokenLabel>> {
    let sp = model.special_tokens();
    let special: Vec<usize> = sp
        .eos
        .iter()
        .copied()
        .chain(sp.bos)
        .chain(sp.pad)
        .chain(sp.decoder_start)
        .collect();
    Ok(match tok {
        Some(t) => t.labels(ids, &special)?,
        None => TokenLabel::from_ids(ids, |id| special.contains(&id)),
    })
}

/// Bytes of every attention map of a forward over `s` source and `t` target tokens.
fn map_bytes(loaded: &Loaded, s: usize, t: usize) -> usize {
    let info = loaded.model.info();
    let h = info.heads;
    let per = |q: usize, k: usize| h.saturating_mul(q).saturating_mul(k).saturating_mul(4);
    match loaded.model.kind() {
        ModelKind::Encoder => info.layers.saturating_mul(per(s, s)),
        ModelKind::Decoder => info.layers.saturating_mul(per(t, t)),
        ModelKind::EncoderDecoder => {
            let dec = info.decoder_layers.unwrap_or(info.layers);
            info.layers
                .saturating_mul(per(s, s))
                .saturating_add(dec.saturating_mul(per(t, t).saturating_add(per(t, s))))
        }
    }
}

pub fn run(args: &AttentionArgs) -> Result<()> {
    super::set_threads(args.threads)?;
    let format = args.out.as_deref().map(format_of).transpose()?;
    if let Some(out) = &args.out {
        check_writable("--out", out)?;
    }
    if let Some(json) = &args.json {
        check_writable("--json", json)?;
    }
    let mut steps = Steps {
        on: args.progress || weight_bytes(&args.model) >= BIG_MODEL_BYTES,
        since: Instant::now(),
    };
    steps.step(&format!("loading {}", args.model.display()));
    let loaded = super::load_model(&args.model)?;
    let model = &loaded.model;
    steps.step("loaded");
    let tok = match &args.text {
        Some(_) => Some(Tokenizer::from_dir(&args.model)?),
        None => Tokenizer::optional(&args.model)?,
    };
    let ids = match (&args.text, &args.input_ids, &tok) {
        (Some(text), _, Some(tok)) => tok.encode(text, true)?,
        (_, Some(ids), _) => ids.clone(),
        _ => bail!("give --text or --input-ids"),
    };
    let seq2seq = model.kind() == ModelKind::EncoderDecoder;
    if !seq2seq && (args.target.is_some() || args.target_ids.is_some()) {
        bail!(
            "--target and --target-ids are for encoder-decoders; {} is {}",
            args.model.display(),
            loaded.model.info().architecture
        );
    }
    check_ids("the input", &ids, model)?;
    if let Some(types) = &args.token_type_ids {
        if model.kind() != ModelKind::Encoder {
            bail!(
                "--token-type-ids are for encoders (BERT); {} is {}",
                args.model.display(),
                model.info().architecture
            );
        }
        if types.len() != ids.len() {
            bail!(
                "--token-type-ids has {} ids for {} input tokens",
                types.len(),
                ids.len()
            );
        }
    }
    let batch = TokenBatch::single(ids.clone())?;
    let target = match seq2seq {
        true => {
            let t = decoder_input(args, model, tok.as_ref(), &batch)?;
            check_ids("the decoder input", &t, model)?;
            Some(t)
        }
        false => None,
    };
    let t_len = target.as_ref().map_or(ids.len(), Vec::len);
    let bytes = map_bytes(&loaded, ids.len(), t_len);
    if bytes > MAX_MAP_BYTES {
        bail!(
            "the attention maps of {} tokens would take {:.1} GB; give a shorter text",
            ids.len(),
            bytes as f64 / 1e9
        );
    }
    let target_batch = target.clone().map(TokenBatch::single).transpose()?;
    let input = match model.kind() {
        ModelKind::Encoder => Input {
            source: Some(&batch),
            token_types: args.token_type_ids.as_deref(),
            target: None,
        },
        ModelKind::Decoder => Input {
            target: Some(&batch),
            ..Default::default()
        },
        ModelKind::EncoderDecoder => Input {
            source: Some(&batch),
            target: target_batch.as_ref(),
            token_types: None,
        },
    };
    let att = model.forward(&input, true)?.attentions;
    steps.step(&format!("forward over {} tokens", ids.len()));
    let present = Kind::present(&att);
    if let Some(k) = args.kind.filter(|k| !present.contains(k)) {
        bail!(
            "--kind {}: {} has no {}",
            format!("{k:?}").to_lowercase(),
            args.model.display(),
            k.describe()
        );
    }
    let tokens = labels(tok.as_ref(), &ids, model)?;
    let target_tokens = target
        .as_deref()
        .map(|t| labels(tok.as_ref(), t, model))
        .transpose()?;
    let name = args
        .model
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| args.model.display().to_string());
    let doc = |sel: &Selection| -> Result<Maps> {
        let maps = Maps {
            model: name.clone(),
            architecture: model.info().architecture.clone(),
            family: model.info().family.clone(),
            tokens: tokens.clone(),
            target_tokens: target_tokens.clone(),
            layers: sel.take(&att)?,
        };
        if maps.weight_count() > MAX_WEIGHTS {
            bail!(
                "the output would hold {} weights; pick --kind, --layer or --head, or a shorter text",
                maps.weight_count()
            );
        }
        Ok(maps)
    };
    let all = Selection {
        kinds: args.kind.map_or(present.clone(), |k| vec![k]),
        layer: args.layer,
        heads: args.head.unwrap_or(Heads::All),
    };
    if let Some(json) = &args.json {
        let text = serde_json::to_string(&doc(&all)?)?;
        write_atomic(json, format!("{text}\n").as_bytes())?;
    }
    if let (Some(out), Some(format)) = (&args.out, format) {
        let bytes = match format {
            Format::Html => viewer::html(&doc(&all)?, args.hide_special)?.into_bytes(),
            Format::Svg | Format::Png => {
                let kind = args.kind.unwrap_or(match seq2seq {
                    true => Kind::Cross,
                    false => present[0],
                });
                let count = kind.of(&att).len();
                let one = Selection {
                    kinds: vec![kind],
                    layer: Some(args.layer.unwrap_or(count - 1)),
                    heads: match args.head {
                        None | Some(Heads::All) => Heads::Mean,
                        Some(h) => h,
                    },
                };
                let maps = doc(&one)?.heatmap(0, 0, args.hide_special);
                let svg = heatmap::svg(&maps, heatmap::Layout::for_tokens(&maps))?;
                match format {
                    Format::Svg => svg.into_bytes(),
                    _ => raster::png(&svg, args.font.as_deref())?,
                }
            }
        };
        write_atomic(out, &bytes)?;
        steps.step(&format!("wrote {}", out.display()));
    }
    Ok(())
}
