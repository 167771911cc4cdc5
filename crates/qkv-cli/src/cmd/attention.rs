//! `qkv attention`: the attention weights of a checkpoint on one text, or what another
//! attribution method credits each token with (`--method`), as a heatmap (SVG, PNG), an
//! offline viewer (HTML, every method that applies) or numbers (JSON).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use qkv::attribution::MAX_FLOW_TOKENS;
use qkv::io::write_atomic;
use qkv::models::explain::{attribute_with_progress, Attribution, Method};
use qkv::models::generate::generate_seq2seq;
use qkv::models::generation_config::GenerationConfig;
use qkv::models::request::Request;
use qkv::models::sentence::SentenceEncoder;
use qkv::models::{Input, ModelKind, TokenBatch, Transformer};
use qkv::text::Tokenizer;

use crate::maps::document::{labels, Maps};
use crate::maps::select::{check_count, expected_shapes, Heads, Kind, Selection};
use crate::maps::target::{self, TargetDoc};
use crate::maps::viewer;
use crate::report::{heatmap, raster};

/// Most tokens a side of one heatmap may have: at the smallest cells (6 px, drawn at
/// twice that in a PNG) a 512-token map is a 6 700-pixel square of 180 MB; longer texts
/// go to the viewer (.html) or --json.
const MAX_HEATMAP_TOKENS: usize = 512;

/// Checkpoints from this size on get progress lines on stderr.
const BIG_MODEL_BYTES: u64 = 256 << 20;

#[derive(clap::Args)]
pub struct AttentionArgs {
    /// Hugging Face model folder
    #[arg(long)]
    model: PathBuf,
    #[command(flatten)]
    dtype: super::shared_flags::DTypeFlag,
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
    /// What to show: `weights` (the attention weights), `value-norm` (each weight times
    /// the size of what its key adds), `rollout` and `flow` (Abnar & Zuidema: through
    /// the layers, heads combined), `grad` (gradient × attention, Chefer et al.) or
    /// `ablation` (the target's change when a token is hidden from attention). A .html
    /// page holds every method that applies and opens on this one
    #[arg(long, value_parser = parse_method, default_value = "weights")]
    method: Method,
    /// Most tokens `--method ablation` takes: it runs a forward of the whole text for
    /// every 16 of its tokens, so its work grows as the length squared
    #[arg(long, default_value_t = 512)]
    max_ablation_tokens: usize,
    /// The token whose log-probability grad and ablation explain: the next token of a
    /// decoder or encoder-decoder, or the token at the first [MASK] of a masked-LM
    /// encoder (default: the most likely one there)
    #[arg(long)]
    target_token: Option<usize>,
    /// Sentence encoders: explain the cosine between the text's embedding and the
    /// embedding of this text (pooled as the folder's sentence-transformers modules say)
    #[arg(long)]
    compare: Option<String>,
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
    /// and more, and for texts of more than 512 tokens)
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

fn parse_method(s: &str) -> std::result::Result<Method, String> {
    Method::from_name(s).map_err(|e| e.to_string())
}

/// Most tokens of a text whose ablation a .html page runs by itself (one forward per
/// token); `--method ablation` runs it at any length.
const MAX_AUTO_ABLATION_TOKENS: usize = 64;

/// Texts longer than this show their steps' progress by themselves.
const LONG_TEXT: usize = 512;

/// How often a long ablation says how far it is.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// The checkpoint: a model folder, or a sentence-transformers folder read as one (for a
/// cosine target, which needs its pooling and tokenisation).
enum Loaded {
    Model(Box<qkv::models::Loaded>),
    Sentence(Box<SentenceEncoder>),
}

impl Loaded {
    fn model(&self) -> &Transformer {
        match self {
            Loaded::Model(l) => &l.model,
            Loaded::Sentence(s) => s.encoder(),
        }
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

/// Progress lines on stderr for big checkpoints, each with the time the last step took.
struct Steps {
    on: bool,
    since: Instant,
}

impl Steps {
    fn step(&mut self, what: &str) {
        if self.on {
            eprintln!(
                "qkv attention: {what} ({:.3} s)",
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
            // through the library's plan: the length cut to the positions, the cache
            // checked against memory
            let request = Request {
                max_new_tokens: Some(args.max_new_tokens),
                greedy: true,
                ..Default::default()
            };
            let plan = request.plan(model, GenerationConfig::default(), source.len)?;
            if let Some(c) = &plan.clamped {
                eprintln!(
                    "warning: --max-new-tokens {} goes past the model's positions; translating at most {}",
                    c.asked, c.allowed
                );
            }
            generate_seq2seq(model, source, &plan.options)?.remove(0)
        }
    };
    Ok(std::iter::once(start).chain(rest).collect())
}

pub fn run(args: &AttentionArgs) -> Result<()> {
    // ---- every option and output checked before any work ---------------------------
    super::shared_flags::set_threads(args.threads)?;
    let format = args.out.as_deref().map(format_of).transpose()?;
    if let Some(out) = &args.out {
        super::writable::check_writable("--out", out)?;
    }
    if let Some(json) = &args.json {
        super::writable::check_writable("--json", json)?;
    }
    if let Some(font) = &args.font {
        if format != Some(Format::Png) {
            bail!("--font {}: fonts are for a .png --out only", font.display());
        }
        raster::check_font(font)?;
    }
    let mut steps = Steps {
        on: args.progress || weight_bytes(&args.model) >= BIG_MODEL_BYTES,
        since: Instant::now(),
    };
    if format.is_some_and(|f| f != Format::Html) && args.method == Method::Ablation {
        bail!("--method ablation gives one score per token, not a map: write --json or a .html viewer");
    }
    if args.head.is_some() && !args.method.per_head() {
        bail!(
            "--head: --method {} combines the heads into one map per layer",
            args.method.name()
        );
    }
    steps.step(&format!("loading {}", args.model.display()));
    let loaded = match &args.compare {
        Some(_) => Loaded::Sentence(Box::new(
            SentenceEncoder::load_in(&args.model, args.dtype.dtype)
                .with_context(|| format!("loading sentence encoder {}", args.model.display()))?,
        )),
        None => Loaded::Model(Box::new(super::load::load_model(
            &args.model,
            args.dtype.dtype,
        )?)),
    };
    let model = loaded.model();
    if let Loaded::Sentence(s) = &loaded {
        super::load::show_load_warnings(s.encoder());
    }
    steps.step("loaded");
    let tok = super::load::tokenizer(&args.model, model, args.text.is_some())?;
    let ids = match (&args.text, &args.input_ids, &tok, &loaded) {
        // as the sentence encoder reads it: lower-cased if it says so, cut to its length
        (Some(text), _, _, Loaded::Sentence(se)) => se.tokenize(&[text])?.ids,
        (Some(text), _, Some(tok), _) => tok.encode(text, true)?,
        (_, Some(ids), _, _) => ids.clone(),
        _ => bail!("give --text or --input-ids"),
    };
    if let Some(t) = args.target_token.filter(|&t| t >= model.info().vocab) {
        bail!(
            "--target-token {t} is outside the vocabulary of {}",
            model.info().vocab
        );
    }
    let seq2seq = model.kind() == ModelKind::EncoderDecoder;
    if !seq2seq && (args.target.is_some() || args.target_ids.is_some()) {
        bail!(
            "--target and --target-ids are for encoder-decoders; {} is {}",
            args.model.display(),
            model.info().architecture
        );
    }
    check_ids("the input", &ids, model)?;
    // a long text's maps take a while to compute and write: say how far it is
    steps.on |= ids.len() > LONG_TEXT;
    if args.method == Method::Ablation && ids.len() > args.max_ablation_tokens {
        let n = ids.len();
        bail!(
            "--method ablation over {n} tokens runs {} forwards of {n} tokens × 16 rows (its work grows as the length squared), past --max-ablation-tokens {}: raise it to run anyway, or use --method grad (one forward and one backward)",
            n.div_ceil(16),
            args.max_ablation_tokens
        );
    }
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

    // ---- what the outputs will hold, from the sizes alone ----------------------------
    let t_len = target.as_ref().map_or(ids.len(), Vec::len);
    let shapes = expected_shapes(model, ids.len(), t_len, args.method);
    let present: Vec<Kind> = shapes.iter().map(|(k, _)| *k).collect();
    if args.method == Method::Flow && args.kind == Some(Kind::Cross) && seq2seq {
        bail!("--kind cross: flow runs over one stack's self-attention graph; an encoder-decoder's cross-attention has rollout and grad");
    }
    if let Some(k) = args.kind.filter(|k| !present.contains(k)) {
        bail!(
            "--kind {}: {} has no {}",
            format!("{k:?}").to_lowercase(),
            args.model.display(),
            k.describe()
        );
    }
    // every kind the method gives (flow: no cross-attention), or the one asked for
    let all = |method: Method| Selection {
        kinds: args.kind.map_or_else(
            || {
                let shapes = expected_shapes(model, ids.len(), t_len, method);
                shapes.iter().map(|(k, _)| *k).collect()
            },
            |k| vec![k],
        ),
        layer: args.layer,
        heads: match method.per_head() {
            true => args.head.unwrap_or(Heads::All),
            false => Heads::All,
        },
    };
    let counted = |method: Method| -> Result<()> {
        match method {
            Method::Ablation => Ok(()),
            _ => check_count(
                &all(method),
                &expected_shapes(model, ids.len(), t_len, method),
            ),
        }
    };
    if args.json.is_some() || format == Some(Format::Html) {
        counted(args.method)?;
    }
    // a heatmap: one layer (the last by default) of one kind, one head or their mean
    let one = match format {
        Some(Format::Svg | Format::Png) => {
            let kind = args.kind.unwrap_or(match seq2seq {
                true => Kind::Cross,
                false => present[0],
            });
            let (_, shape) = shapes.iter().find(|(k, _)| *k == kind).expect("present");
            if shape.queries.max(shape.keys) > MAX_HEATMAP_TOKENS {
                bail!(
                    "a heatmap shows at most {MAX_HEATMAP_TOKENS} tokens a side, and this one has {}: write .html (the viewer) or --json, or give a shorter text",
                    shape.queries.max(shape.keys)
                );
            }
            let sel = Selection {
                kinds: vec![kind],
                layer: Some(args.layer.unwrap_or(shape.layers - 1)),
                heads: match (args.head, args.method.per_head()) {
                    (_, false) => Heads::All,
                    (None | Some(Heads::All), true) => Heads::Mean,
                    (Some(h), true) => h,
                },
            };
            check_count(&sel, &shapes)?;
            Some(sel)
        }
        _ => None,
    };

    // ---- the target, then each method (a forward refused before it runs when larger
    // than free memory) --------------------------------------------------------------
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
    let compare = match (&args.compare, &loaded) {
        (Some(text), Loaded::Sentence(se)) => {
            let with = se.embed(&[text.as_str()])?.remove(0);
            Some((with, se.pooling().to_vec()))
        }
        _ => None,
    };
    let goal = target::choose(
        model,
        tok.as_ref(),
        &ids,
        args.target_token,
        compare,
        args.method,
    )?;
    // the page holds every method that applies, opening on the one asked for
    let methods: Vec<Method> = match format {
        Some(Format::Html) => std::iter::once(args.method)
            .chain(Method::ALL.into_iter().filter(|&m| m != args.method))
            .collect(),
        _ => vec![args.method],
    };
    let mut results = Vec::new();
    let mut skipped = Vec::new();
    for method in methods {
        let asked = method == args.method;
        let why = match method {
            _ if asked => None,
            _ if method.needs_target() && goal.is_none() => {
                Some("it explains a target, and this text gives none: give --compare TEXT (a sentence encoder: the cosine to that text's embedding) or a [MASK] in the text (a masked LM)".to_string())
            }
            Method::Flow if ids.len().max(t_len) > MAX_FLOW_TOKENS => Some(format!(
                "it takes at most {MAX_FLOW_TOKENS} tokens; rollout is its fast approximation"
            )),
            Method::Ablation if ids.len() > MAX_AUTO_ABLATION_TOKENS => Some(format!(
                "it runs a forward per token, which a page does by itself up to {MAX_AUTO_ABLATION_TOKENS} tokens: ask for it with --method ablation"
            )),
            _ => counted(method).err().map(|e| e.to_string()),
        };
        if let Some(why) = why {
            skipped.push((method, why));
            continue;
        }
        // ablation runs a forward per 16 tokens: past a page's worth its progress is shown
        let started = Instant::now();
        let mut shown = Instant::now();
        let show = steps.on || ids.len() > MAX_AUTO_ABLATION_TOKENS;
        let mut progress = |done: usize, total: usize| {
            if show && done < total && shown.elapsed() >= PROGRESS_EVERY {
                shown = Instant::now();
                let spent = started.elapsed().as_secs_f64();
                let left = spent / done as f64 * (total - done) as f64;
                eprintln!(
                    "qkv attention: {} hid {done} of {total} tokens, {spent:.0} s, about {left:.0} s left",
                    method.name()
                );
            }
        };
        match attribute_with_progress(model, &input, method, goal.as_ref(), &mut progress) {
            Ok(a) => results.push(a),
            Err(e) if !asked => skipped.push((method, e.to_string())),
            Err(e) => return Err(e).with_context(|| format!("--method {}", method.name())),
        }
        steps.step(&format!("{} over {} tokens", method.name(), ids.len()));
    }

    // ---- every output made, then written ----------------------------------------------
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
    let doc = |a: &Attribution, sel: &Selection| -> Result<Maps> {
        Ok(Maps {
            model: name.clone(),
            architecture: model.info().architecture.clone(),
            family: model.info().family.clone(),
            tokens: tokens.clone(),
            target_tokens: target_tokens.clone(),
            method: a.method,
            target: a
                .target
                .as_ref()
                .map(|t| TargetDoc::new(t, model, tok.as_ref(), args.compare.as_deref()))
                .transpose()?,
            scores: a.scores.clone(),
            layers: match a.method {
                Method::Ablation => Vec::new(),
                m => sel.take(&a.maps, !m.per_head())?,
            },
        })
    };
    let asked = &results[0];
    let json = match &args.json {
        Some(path) => {
            let text = serde_json::to_string(&doc(asked, &all(asked.method))?)?;
            Some((path, format!("{text}\n").into_bytes()))
        }
        None => None,
    };
    let out = match (&args.out, format) {
        (Some(path), Some(Format::Html)) => {
            let docs = results
                .iter()
                .map(|a| doc(a, &all(a.method)))
                .collect::<Result<Vec<_>>>()?;
            Some((
                path,
                viewer::html(&docs, &skipped, args.hide_special, args.text.as_deref())?
                    .into_bytes(),
            ))
        }
        (Some(path), Some(format)) => {
            let sel = one.as_ref().expect("a heatmap's selection");
            let maps = doc(asked, sel)?.heatmap(0, 0, args.hide_special);
            let svg = heatmap::svg(&maps, heatmap::Layout::for_tokens(&maps))?;
            let bytes = match format {
                Format::Svg => svg.into_bytes(),
                _ => raster::png(&svg, args.font.as_deref())?,
            };
            Some((path, bytes))
        }
        _ => None,
    };
    for (path, bytes) in json.into_iter().chain(out) {
        write_atomic(path, &bytes)?;
        // the one line a run prints without --progress: where its output is
        match steps.on {
            true => steps.step(&format!("wrote {}", path.display())),
            false => eprintln!("qkv attention: wrote {}", path.display()),
        }
    }
    Ok(())
}
