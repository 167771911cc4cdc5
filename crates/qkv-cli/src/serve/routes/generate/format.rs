//! The structured output a request asks for, in any of the shapes clients send it:
//! OpenAI's `response_format`, llama-server's `grammar` (GBNF), vLLM's `guided_json`,
//! `guided_regex` and `guided_grammar`. At most one.

use qkv::models::generate::gbnf;
use qkv::models::generate::grammar::{Constraint, Grammar, Vocabulary};

use crate::serve::api::{ApiError, ResponseFormat, Settings};
use crate::serve::routes::shared::off_thread;
use crate::serve::state::AppState;

/// A grammar's text as GBNF (llama.cpp's, rules written `name ::= …`) or Lark.
fn grammar_text(field: &str, text: &str) -> Result<Grammar, ApiError> {
    match text.contains("::=") {
        true => gbnf::to_lark(text)
            .map(Grammar::Lark)
            .map_err(|e| ApiError::invalid(field, e.to_string())),
        false => Ok(Grammar::Lark(text.to_string())),
    }
}

/// The grammar `st` asks for, if any, with the field that asked.
pub fn asked(st: &Settings) -> Result<Option<(&'static str, Grammar)>, ApiError> {
    let mut found: Vec<(&str, Grammar)> = Vec::new();
    match &st.response_format {
        None | Some(ResponseFormat::Text) => {}
        Some(ResponseFormat::JsonObject) => found.push(("response_format", Grammar::JsonObject)),
        Some(ResponseFormat::JsonSchema { json_schema }) => found.push((
            "response_format",
            match &json_schema.schema {
                Some(s) => Grammar::JsonSchema(s.clone()),
                None => Grammar::JsonObject,
            },
        )),
    }
    if let Some(g) = &st.grammar {
        found.push(("grammar", grammar_text("grammar", g)?));
    }
    if let Some(s) = &st.guided_json {
        found.push(("guided_json", Grammar::JsonSchema(s.clone())));
    }
    if let Some(r) = &st.guided_regex {
        found.push(("guided_regex", Grammar::Regex(r.clone())));
    }
    if let Some(g) = &st.guided_grammar {
        found.push(("guided_grammar", grammar_text("guided_grammar", g)?));
    }
    match found.len() {
        0 | 1 => Ok(found.pop()),
        _ => Err(ApiError::invalid(
            found[1].0,
            format!(
                "give one of `{}` and `{}`: a request has one structured output",
                found[0].0, found[1].0
            ),
        )),
    }
}

impl AppState {
    /// The grammar `st` asks for, compiled for the model's vocabulary off the HTTP
    /// thread (the vocabulary's trie is built at the first such request); errors name
    /// the field that asked.
    pub async fn constraint(&self, st: &Settings) -> Result<Option<Constraint>, ApiError> {
        match asked(st)? {
            Some((field, grammar)) => self.compile(field, grammar).await.map(Some),
            None => Ok(None),
        }
    }

    /// The grammar of a call `tool_choice` makes the model write (Lark), refused beside
    /// another structured output.
    pub async fn forced_call(
        &self,
        st: &Settings,
        lark: String,
    ) -> Result<Option<Constraint>, ApiError> {
        if let Some((field, _)) = asked(st)? {
            return Err(ApiError::invalid(
                field,
                "a request whose `tool_choice` forces a call has that call's structure: leave this out",
            ));
        }
        self.compile("tool_choice", Grammar::Lark(lark))
            .await
            .map(Some)
    }

    /// `grammar` compiled off the HTTP thread; errors name `field`.
    async fn compile(&self, field: &'static str, grammar: Grammar) -> Result<Constraint, ApiError> {
        let g = self.generator()?;
        let (model, tok, cell) = (g.model.clone(), g.tokenizer.clone(), g.vocabulary.clone());
        let tok = tok.ok_or_else(|| {
            ApiError::invalid(
                field,
                "the model folder has no tokenizer to spell the grammar with",
            )
        })?;
        off_thread(move || {
            let vocabulary = cell
                .get_or_init(|| Vocabulary::of_model(&model, &tok).map_err(|e| e.to_string()))
                .as_ref()
                .map_err(|e| ApiError::invalid(field, e.clone()))?;
            vocabulary
                .constraint(&grammar)
                .map_err(|e| ApiError::invalid(field, e.to_string()))
        })
        .await
    }
}
