//! Structured output: a grammar (a JSON schema, any JSON object, a Lark grammar, a
//! regular expression) that, at each step, rules out the tokens that cannot continue
//! it. The parsing is the `llguidance` crate's (an Earley parser over a lexer, the
//! vocabulary walked as a trie of each token's bytes); qkv gives it the bytes of every
//! token ([`crate::text::Tokenizer::token_bytes`]) and applies its mask to the scores.
//!
//! Control tokens (the tokenizer's special ones, the end-of-sequence ids) are never text:
//! they are marked as such in the trie, and the end-of-sequence ids are allowed exactly
//! where the grammar may end (one stand-in token past the vocabulary carries that for
//! them all, so a model with several EOS ids, or none, is treated alike).

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::models::transformer::Transformer;
use crate::text::Tokenizer;

/// What a sequence must spell.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// JSON valid under this schema (OpenAI's `json_schema`).
    JsonSchema(Value),
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// A grammar in llguidance's Lark dialect.
    Lark(String),
    /// A regular expression the whole output matches.
    Regex(String),
}

/// JSON as Python's `json.dumps` writes it: `", "` and `": "` between items, no other
/// whitespace. The engine's default lets whitespace in anywhere, and a model can then
/// spend its whole length on newlines inside an object; a schema's own `x-guidance`
/// options are kept.
fn compact(mut schema: Value) -> Value {
    if let Some(o) = schema.as_object_mut() {
        if !o.contains_key("x-guidance") {
            let options = JsonCompileOptions {
                item_separator: ", ".into(),
                key_separator: ": ".into(),
                whitespace_flexible: false,
                ..JsonCompileOptions::default()
            };
            options.apply_to(&mut schema);
        }
    }
    schema
}

impl Grammar {
    fn top_level(&self) -> TopLevelGrammar {
        match self {
            Grammar::JsonSchema(s) => TopLevelGrammar::from_json_schema(compact(s.clone())),
            Grammar::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
            }
            Grammar::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            Grammar::Regex(r) => TopLevelGrammar::from_regex(r),
        }
    }

    /// The request field an error in this grammar is named by.
    fn field(&self) -> &'static str {
        match self {
            Grammar::JsonSchema(_) => "json_schema",
            Grammar::JsonObject => "json_object",
            Grammar::Lark(_) => "grammar",
            Grammar::Regex(_) => "regex",
        }
    }
}

/// A model's vocabulary as the grammar engine reads it; built once per model (a trie
/// of every token's bytes, and the engine's slices of it), shared by every sequence.
#[derive(Clone)]
pub struct Vocabulary {
    factory: Arc<ParserFactory>,
    eos: Vec<usize>,
    /// the stand-in for "the sequence may end here": one past the model's vocabulary
    end: u32,
}

impl std::fmt::Debug for Vocabulary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Vocabulary({} tokens)", self.end)
    }
}

impl Vocabulary {
    /// `bytes[id]`: the bytes of each token id of the model (`Tokenizer::token_bytes`);
    /// `special(id)`: whether it is a control token; `eos`: the ids that end a sequence.
    pub fn new(bytes: &[Vec<u8>], special: impl Fn(usize) -> bool, eos: &[usize]) -> Result<Self> {
        let end = u32::try_from(bytes.len())
            .map_err(|_| Error::invalid("vocabulary", "more than 2^32 tokens"))?;
        // a control token spells `\xFF<name>`, which no text can: the grammar never uses it
        let control = |id: usize, name: &[u8]| {
            let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
            match name.is_empty() {
                true => w.extend(format!("<[{id}]>").bytes()),
                false => w.extend_from_slice(name),
            }
            w
        };
        let mut words: Vec<Vec<u8>> = bytes
            .iter()
            .enumerate()
            .map(
                |(id, b)| match special(id) || eos.contains(&id) || b.is_empty() {
                    true => control(id, b),
                    false => b.clone(),
                },
            )
            .collect();
        words.push(control(end as usize, b"<|qkv_end|>"));
        let info = TokRxInfo::new(end + 1, end);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words)));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| Error::invalid("vocabulary", format!("the grammar engine: {e}")))?;
        factory.quiet();
        Ok(Vocabulary {
            factory: Arc::new(factory),
            eos: eos.to_vec(),
            end,
        })
    }

    /// The vocabulary of `model` as `tokenizer` spells it.
    pub fn of_model(model: &Transformer, tokenizer: &Tokenizer) -> Result<Self> {
        let bytes = tokenizer.token_bytes(model.arch.vocab);
        let special = tokenizer.special_ids();
        Vocabulary::new(
            &bytes,
            |id| special.contains(&id),
            &model.special_tokens().eos,
        )
    }

    /// The grammar compiled for this vocabulary; a grammar that does not compile (a bad
    /// schema, a Lark syntax error, one past the engine's size limits) is an error
    /// naming its kind.
    pub fn constraint(&self, grammar: &Grammar) -> Result<Constraint> {
        let parser = self
            .factory
            .create_parser(grammar.top_level())
            .map_err(|e| Error::invalid(grammar.field(), e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(Error::invalid(grammar.field(), e));
        }
        Ok(Constraint {
            matcher,
            eos: self.eos.clone(),
            end: self.end,
        })
    }
}

/// One sequence's place in its grammar.
pub struct Constraint {
    matcher: Matcher,
    eos: Vec<usize>,
    end: u32,
}

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Constraint {
            matcher: self.matcher.deep_clone(),
            eos: self.eos.clone(),
            end: self.end,
        }
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Constraint(stopped: {})", self.matcher.is_stopped())
    }
}

impl Constraint {
    /// Sets to −∞ the scores `[V]` of every token the grammar does not allow next; the
    /// end-of-sequence ids keep theirs where the grammar may end. An error when the
    /// engine fails (a limit of its work per step reached).
    pub fn mask(&mut self, scores: &mut [f32]) -> Result<()> {
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| Error::invalid("grammar", e.to_string()))?;
        let may_end = allowed.is_allowed(self.end);
        let kept: Vec<(usize, f32)> = match may_end {
            true => self
                .eos
                .iter()
                .filter_map(|&id| scores.get(id).map(|&s| (id, s)))
                .collect(),
            false => Vec::new(),
        };
        for (id, s) in scores.iter_mut().enumerate() {
            if !allowed.is_allowed(id as u32) {
                *s = f32::NEG_INFINITY;
            }
        }
        for (id, s) in kept {
            scores[id] = s;
        }
        Ok(())
    }

    /// Moves past `token`, chosen under the last mask; an end-of-sequence id ends the
    /// sequence and is not given to the grammar.
    pub fn commit(&mut self, token: usize) -> Result<()> {
        if self.eos.contains(&token) {
            return Ok(());
        }
        self.matcher
            .consume_token(token as u32)
            .map_err(|e| Error::invalid("grammar", e.to_string()))
    }

    /// Whether the grammar is complete: nothing but the end may follow.
    pub fn is_complete(&self) -> bool {
        self.matcher.is_stopped()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vocabulary of the 256 bytes, then `"{"`, `"}"` and `"ab"` as tokens, then EOS.
    fn bytes_and_words() -> (Vec<Vec<u8>>, usize) {
        let mut v: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        v.extend([
            b"{".to_vec(),
            b"}".to_vec(),
            b"ab".to_vec(),
            b"</s>".to_vec(),
        ]);
        (v, 259)
    }

    #[test]
    fn a_regex_allows_only_its_continuations_and_the_end_where_it_may_end() {
        let (bytes, eos) = bytes_and_words();
        let v = Vocabulary::new(&bytes, |_| false, &[eos]).unwrap();
        let mut c = v.constraint(&Grammar::Regex("(ab)+".into())).unwrap();
        let mut s = vec![0.0; bytes.len()];
        c.mask(&mut s).unwrap();
        let open: Vec<usize> = (0..s.len()).filter(|&i| s[i].is_finite()).collect();
        assert_eq!(open, [b'a' as usize, 258]);
        c.commit(258).unwrap();
        let mut s = vec![0.0; bytes.len()];
        c.mask(&mut s).unwrap();
        assert!(s[eos].is_finite() && s[b'a' as usize].is_finite());
        assert!(!s[b'b' as usize].is_finite());
    }

    #[test]
    fn bad_grammars_are_named() {
        let (bytes, eos) = bytes_and_words();
        let v = Vocabulary::new(&bytes, |_| false, &[eos]).unwrap();
        let e = v
            .constraint(&Grammar::JsonSchema(
                serde_json::json!({"type": "frobnicate"}),
            ))
            .unwrap_err()
            .to_string();
        assert!(e.contains("json_schema"), "{e}");
        let e = v
            .constraint(&Grammar::Lark("start: (".into()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("grammar"), "{e}");
    }
}
