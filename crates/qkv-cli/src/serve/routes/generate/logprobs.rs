//! Log-probabilities in OpenAI's two shapes: chat's `{"content": [{token, logprob,
//! bytes, top_logprobs}]}` and completions' parallel lists (`tokens`,
//! `token_logprobs`, `top_logprobs`, `text_offset`).

use qkv::models::generate::TokenLogprobs;
use serde_json::{json, Map, Value};

/// The floor a log-probability is reported at: JSON has no −∞ (vLLM's choice too).
const FLOOR: f32 = -9999.0;

/// Tokens as text and bytes: the tokenizer's table, or `token_id:N` without one.
#[derive(Clone, Copy)]
pub struct TokenText<'a>(pub Option<&'a [Vec<u8>]>);

impl TokenText<'_> {
    fn bytes(&self, id: usize) -> Vec<u8> {
        match self.0.and_then(|t| t.get(id)) {
            Some(b) => b.clone(),
            None => format!("token_id:{id}").into_bytes(),
        }
    }

    fn text(&self, id: usize) -> String {
        String::from_utf8_lossy(&self.bytes(id)).into_owned()
    }

    fn entry(&self, id: usize, logprob: f32) -> Value {
        json!({"token": self.text(id), "logprob": logprob.max(FLOOR), "bytes": self.bytes(id)})
    }

    /// Chat's `logprobs` for these tokens.
    pub fn chat(&self, tokens: &[TokenLogprobs]) -> Value {
        let content: Vec<Value> = tokens
            .iter()
            .map(|t| {
                let mut e = self.entry(t.token, t.logprob);
                e["top_logprobs"] = t.top.iter().map(|&(id, lp)| self.entry(id, lp)).collect();
                e
            })
            .collect();
        json!({"content": content, "refusal": null})
    }

    /// Completions' `logprobs` for `tokens` (a prompt's first token has no
    /// log-probability: `None`), their text starting `offset` characters into the
    /// choice's text; `offset` moves past them. Each `top_logprobs` entry holds the
    /// alternatives and the chosen token, as vLLM gives them.
    pub fn completion(
        &self,
        tokens: &[(usize, Option<&TokenLogprobs>)],
        offset: &mut usize,
    ) -> Value {
        let (mut texts, mut offsets, mut logprobs, mut tops) = (vec![], vec![], vec![], vec![]);
        for &(id, lp) in tokens {
            let text = self.text(id);
            offsets.push(*offset);
            *offset += text.chars().count();
            match lp {
                None => {
                    logprobs.push(Value::Null);
                    tops.push(Value::Null);
                }
                Some(t) => {
                    // best first; tokens that read the same (parts of characters, "�")
                    // keep the likeliest's value
                    let mut top = Map::new();
                    for &(id, lp) in t.top.iter().chain([(t.token, t.logprob)].iter()) {
                        top.entry(self.text(id)).or_insert(json!(lp.max(FLOOR)));
                    }
                    logprobs.push(json!(t.logprob.max(FLOOR)));
                    tops.push(Value::Object(top));
                }
            }
            texts.push(text);
        }
        json!({"tokens": texts, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets})
    }
}
