//! Encoder-decoders (translation): one job at a time, its tokens streamed as they come.
//! A job here has one choice and no log-probabilities (the route refuses them).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::Receiver;
use std::time::Instant;

use crate::models::generate::generate_seq2seq_each;
use crate::models::{TokenBatch, Transformer};
use crate::text::{TextStream, Tokenizer};

use super::events::Event;
use super::job::{panic_text, Job};
use super::observer::Observer;
use super::stop::StopFilter;

/// Encoder-decoders (translation): each job decoded alone, streaming its tokens.
pub(super) fn run_one_by_one(
    model: &Transformer,
    tok: Option<&Tokenizer>,
    rx: &Receiver<Job>,
    observer: &dyn Observer,
) {
    while let Ok(job) = rx.recv() {
        observer.dequeued();
        if job.events.is_closed() {
            continue;
        }
        let mut text = tok.map(Tokenizer::stream);
        let mut stop = StopFilter::new(job.stops.clone());
        let mut count = 0;
        let mut stopped = false;
        let mut failed = None;
        let started = Instant::now();
        let mut first = true;
        let r = catch_unwind(AssertUnwindSafe(|| {
            let src = TokenBatch::single(job.prompt.clone())?;
            generate_seq2seq_each(model, &src, &job.options, &mut |_, id| {
                if first {
                    observer.first_token(job.queued.elapsed());
                    first = false;
                }
                observer.tokens(1);
                if stopped || failed.is_some() {
                    return;
                }
                count += 1;
                match text.as_mut().map(|s| s.push(id)).transpose() {
                    Ok(Some(Some(p))) => {
                        let r = stop.push(&p);
                        if !r.text.is_empty() {
                            job.events.send(Event::Piece {
                                index: job.first_index,
                                text: r.text,
                                logprobs: Vec::new(),
                            });
                        }
                        stopped = r.stopped;
                    }
                    Ok(_) => {}
                    Err(e) => failed = Some(e.to_string()),
                }
            })
        }));
        observer.step(1, started.elapsed());
        let out = match r {
            Ok(Ok(out)) => out.into_iter().next().unwrap_or_default(),
            Ok(Err(e)) => {
                job.events.send(Event::Failed(e.to_string()));
                continue;
            }
            Err(p) => {
                job.events.send(Event::Failed(panic_text(&p)));
                continue;
            }
        };
        if let Some(e) = failed {
            job.events.send(Event::Failed(e));
            continue;
        }
        if !stopped {
            let rest = match text.map(TextStream::finish).transpose() {
                Ok(r) => r.flatten().unwrap_or_default(),
                Err(e) => {
                    job.events.send(Event::Failed(e.to_string()));
                    continue;
                }
            };
            let r = stop.last(&rest);
            stopped = r.stopped;
            if !r.text.is_empty() {
                job.events.send(Event::Piece {
                    index: job.first_index,
                    text: r.text,
                    logprobs: Vec::new(),
                });
            }
        }
        let eos = out.last().is_some_and(|t| job.options.eos.contains(t));
        job.events.send(Event::Done {
            index: job.first_index,
            finish: if stopped || eos { "stop" } else { "length" },
            tokens: out[..count.min(out.len())].to_vec(),
        });
    }
}
