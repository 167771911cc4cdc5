//! `Model.generate`: one prompt or a batch of them (left-padded, as the library runs a
//! batch), whole or streamed. A stream runs the generation on a thread of its own and
//! hands its pieces over a channel, so the Python iterator waits without the GIL.

use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use qkv::engine::generator::{self, Limits};
use qkv::engine::{ChannelEvents, Event, Events, Job, Quiet};
use qkv::models::generate::grammar::{Constraint, Grammar, Vocabulary};
use qkv::models::generate::Sampling;
use qkv::models::generate::{gbnf, generate_constrained, generate_each};
use qkv::models::generation_config::GenerationConfig;
use qkv::models::request::{Plan, Request};
use qkv::models::{ModelKind, TokenBatch, Transformer};

use crate::errors::{to_py, OrPy};
use crate::ints::{self, Int};
use crate::model::Model;

/// The prompts of a call: their ids, whether they were text, whether a list of them.
struct Prompts {
    rows: Vec<Vec<usize>>,
    text: bool,
    batch: bool,
}

/// What `Model.generate` continues.
pub enum Prompt<'a, 'py> {
    /// `prompt=`: a text, a list of ids, or a list of either
    Given(&'a Bound<'py, PyAny>),
    /// `messages=`: a conversation, through the folder's chat template
    Chat(&'a Bound<'py, PyAny>),
}

/// The ids of a conversation's prompt (the template writes the special tokens), read
/// as a text prompt: its output is text.
fn chat(model: &Model, messages: &Bound<'_, PyAny>) -> PyResult<Prompts> {
    let text = model.chat_prompt(messages.py(), messages, true, None)?;
    Ok(Prompts {
        rows: vec![model.tokenizer()?.encode(&text, false).or_py()?],
        text: true,
        batch: false,
    })
}

/// Reads `prompt`: a text, a list of ids, or a list of either.
fn prompts(model: &Model, prompt: &Bound<'_, PyAny>) -> PyResult<Prompts> {
    let encode = |t: &str| model.tokenizer()?.encode(t, true).or_py();
    if prompt.len().is_ok_and(|n| n == 0) {
        return Err(PyValueError::new_err(
            "`prompt` is empty: give a text, token ids, or a list of either",
        ));
    }
    if let Ok(text) = prompt.extract::<String>() {
        return Ok(Prompts {
            rows: vec![encode(&text)?],
            text: true,
            batch: false,
        });
    }
    if let Ok(ids) = prompt.extract::<Vec<Int>>() {
        let rows = vec![ints::counts(ids, "prompt")?];
        return Ok(Prompts {
            rows,
            text: false,
            batch: false,
        });
    }
    if let Ok(texts) = prompt.extract::<Vec<String>>() {
        let rows = texts
            .iter()
            .map(|t| encode(t))
            .collect::<PyResult<Vec<_>>>()?;
        return Ok(Prompts {
            rows,
            text: true,
            batch: true,
        });
    }
    if let Ok(lists) = prompt.extract::<Vec<Vec<Int>>>() {
        let rows = lists
            .into_iter()
            .map(|ids| ints::counts(ids, "prompt"))
            .collect::<PyResult<Vec<_>>>()?;
        return Ok(Prompts {
            rows,
            text: false,
            batch: true,
        });
    }
    Err(PyTypeError::new_err(
        "`prompt` must be a str, a list of token ids, or a list of either",
    ))
}

/// The plan for `prompts` of `model` under `request`, warning when the length is cut.
fn plan(py: Python<'_>, model: &Model, request: &Request, longest: usize) -> PyResult<Plan> {
    let config = GenerationConfig::read(&model.dir).or_py()?;
    for w in &config.unapplied {
        py.import("warnings")?.call_method1("warn", (w.as_str(),))?;
    }
    let plan = request.plan(model.transformer(), config, longest).or_py()?;
    if let Some(c) = &plan.clamped {
        let warning = format!(
            "{} goes past the model's positions; generating at most {}",
            c.setting.replace('`', ""),
            c.allowed
        );
        py.import("warnings")?.call_method1("warn", (warning,))?;
    }
    Ok(plan)
}

/// The grammar of `json_schema=` (a dict, or its JSON text) or `grammar=` (GBNF or
/// Lark), if any.
pub fn grammar_of(
    json_schema: Option<&Bound<'_, PyAny>>,
    grammar: Option<String>,
) -> PyResult<Option<Grammar>> {
    match (json_schema, grammar) {
        (Some(_), Some(_)) => Err(PyValueError::new_err(
            "give `json_schema` or `grammar`, not both",
        )),
        (Some(s), None) => {
            let text: String = match s.extract::<String>() {
                Ok(t) => t,
                Err(_) => s
                    .py()
                    .import("json")?
                    .call_method1("dumps", (s,))?
                    .extract()?,
            };
            let schema = serde_json::from_str(&text)
                .map_err(|e| PyValueError::new_err(format!("`json_schema` is not JSON: {e}")))?;
            Ok(Some(Grammar::JsonSchema(schema)))
        }
        (None, Some(g)) if g.contains("::=") => Ok(Some(Grammar::Lark(gbnf::to_lark(&g).or_py()?))),
        (None, Some(g)) => Ok(Some(Grammar::Lark(g))),
        (None, None) => Ok(None),
    }
}

/// `grammar` compiled for `model`'s vocabulary (built once per model).
fn constraint(model: &Model, grammar: &Grammar) -> PyResult<Constraint> {
    let vocabulary = match model.vocabulary.get() {
        Some(v) => v,
        None => {
            let v = Vocabulary::of_model(model.transformer(), model.tokenizer()?).or_py()?;
            let _ = model.vocabulary.set(v);
            model.vocabulary.get().expect("just set")
        }
    };
    vocabulary.constraint(grammar).or_py()
}

/// Runs the generation: the library's batched loop, or one sequence under a grammar.
fn run(
    m: &qkv::models::Transformer,
    batch: &TokenBatch,
    plan: &Plan,
    constraint: Option<Constraint>,
    on_token: &mut dyn FnMut(usize, usize),
) -> qkv::Result<Vec<Vec<usize>>> {
    match constraint {
        Some(c) => generate_constrained(m, &batch.ids, &plan.options, c, &mut |id| on_token(0, id))
            .map(|new| vec![new]),
        None => generate_each(m, batch, &plan.options, on_token),
    }
}

/// A list of prompts through the server's engine (`qkv::engine::generator`): each
/// prompt joins in chunks packed into the others' decoding steps and leaves at its own
/// end, with no padding; prompt i samples with the seed plus i.
fn through_engine(
    m: &Transformer,
    rows: &[Vec<usize>],
    plan: &Plan,
) -> qkv::Result<Vec<Vec<usize>>> {
    let (tx, rx) = mpsc::channel();
    let events: Arc<dyn Events> = Arc::new(ChannelEvents::new(tx));
    let jobs = rows
        .iter()
        .enumerate()
        .map(|(i, ids)| {
            let mut options = plan.options.clone();
            if let Sampling::Sample { seed, .. } = &mut options.sampling {
                *seed = seed.wrapping_add(i as u64);
            }
            Job::new(ids.clone(), options, i, events.clone())
        })
        .collect();
    let limits = Limits {
        max_batch: rows.len(),
        max_queue: rows.len(),
        // no one waits on a next token here: long chunks, fewer steps
        prefill_chunk: 1024,
        cache_bytes: 0,
    };
    generator::run_jobs(m, None, limits, jobs, &Quiet);
    let mut out = vec![None; rows.len()];
    for e in rx.try_iter() {
        match e {
            Event::Done { index, tokens, .. } => out[index] = Some(tokens),
            Event::Failed(why) => {
                return Err(qkv::Error::Invalid {
                    field: "prompt".into(),
                    reason: why,
                })
            }
            Event::Prompt { .. } | Event::Piece { .. } => {}
        }
    }
    out.into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| qkv::Error::Invalid {
            field: "prompt".into(),
            reason: "a prompt's generation ended without an answer".into(),
        })
}

/// `Model.generate` (its docs are the method's).
pub fn generate<'py>(
    slf: &Bound<'py, Model>,
    prompt: Prompt<'_, 'py>,
    request: &Request,
    grammar: Option<Grammar>,
    stream: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let py = slf.py();
    let model = slf.get();
    let p = match prompt {
        Prompt::Given(p) => prompts(model, p)?,
        Prompt::Chat(m) => chat(model, m)?,
    };
    let longest = p.rows.iter().map(Vec::len).max().unwrap_or(0);
    let plan = plan(py, model, request, longest)?;
    let pad = model.transformer().special_tokens().pad.unwrap_or(0);
    let batch = TokenBatch::left_padded(&p.rows, pad).or_py()?;
    let constraint = match &grammar {
        Some(_) if p.batch => {
            return Err(PyValueError::new_err(
                "`json_schema` and `grammar` take one prompt, not a list",
            ))
        }
        Some(g) => Some(constraint(model, g)?),
        None => None,
    };
    if stream {
        if p.batch {
            return Err(PyValueError::new_err(
                "`stream` takes one prompt, not a list",
            ));
        }
        let stream = Stream::start(slf.clone().unbind(), batch, plan, constraint, p.text);
        return Ok(Bound::new(py, stream)?.into_any());
    }
    let m = model.transformer();
    let engine = p.batch && m.kind() == ModelKind::Decoder && plan.options.search.num_beams == 1;
    let new = py
        .detach(|| match engine {
            true => through_engine(m, &p.rows, &plan),
            false => run(m, &batch, &plan, constraint, &mut |_, _| {}),
        })
        .or_py()?;
    let outputs: Vec<Bound<'py, PyAny>> = new
        .into_iter()
        .map(|ids| match p.text {
            true => Ok(model
                .tokenizer()?
                .decode(&ids)
                .or_py()?
                .into_pyobject(py)?
                .into_any()),
            false => Ok(ids.into_pyobject(py)?.into_any()),
        })
        .collect::<PyResult<_>>()?;
    match p.batch {
        true => Ok(outputs.into_pyobject(py)?.into_any()),
        false => Ok(outputs.into_iter().next().expect("one prompt, one output")),
    }
}

/// One piece of a streamed output.
enum Piece {
    Text(String),
    Id(usize),
}

/// The output of `Model.generate(..., stream=True)` as it is made: text pieces for a
/// text prompt (as ``qkv generate`` prints them), else token ids.
#[pyclass(module = "qkv")]
pub struct Stream {
    pieces: Mutex<Receiver<qkv::Result<Piece>>>,
}

impl Stream {
    /// Starts generating `batch` (one row) with `model` on a thread of its own.
    fn start(
        model: Py<Model>,
        batch: TokenBatch,
        plan: Plan,
        constraint: Option<Constraint>,
        text: bool,
    ) -> Stream {
        let (send, pieces) = mpsc::channel();
        std::thread::spawn(move || {
            let m = model.get();
            let tokens = m.maybe_tokenizer().filter(|_| text);
            let mut decoder = tokens.map(|t| t.stream());
            let mut on_token = |_row: usize, id: usize| {
                let piece = match decoder.as_mut() {
                    None => Some(Ok(Piece::Id(id))),
                    Some(d) => d.push(id).map(|t| t.map(Piece::Text)).transpose(),
                };
                if let Some(piece) = piece {
                    // a closed channel: the iterator was dropped, nobody reads on
                    let _ = send.send(piece);
                }
            };
            let done = run(m.transformer(), &batch, &plan, constraint, &mut on_token);
            let rest = match (done, decoder) {
                (Err(e), _) => Some(Err(e)),
                (Ok(_), Some(d)) => d.finish().transpose().map(|r| r.map(Piece::Text)),
                (Ok(_), None) => None,
            };
            if let Some(rest) = rest {
                let _ = send.send(rest);
            }
        });
        Stream {
            pieces: Mutex::new(pieces),
        }
    }
}

#[pymethods]
impl Stream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let next = py.detach(|| match self.pieces.lock() {
            Ok(pieces) => pieces.recv().ok(),
            // another thread panicked while reading: the stream is over
            Err(_) => None,
        });
        match next.ok_or(()) {
            Err(_) => Ok(None),
            Ok(Err(e)) => Err(to_py(e)),
            Ok(Ok(Piece::Text(t))) => Ok(Some(t.into_pyobject(py)?.into_any().unbind())),
            Ok(Ok(Piece::Id(id))) => Ok(Some(id.into_pyobject(py)?.into_any().unbind())),
        }
    }
}
