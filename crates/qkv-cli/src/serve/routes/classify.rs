//! Sequence classification (`/v1/classify`) and cross-encoder reranking (`/v1/rerank`,
//! in the shape Cohere's and Jina's APIs use), run by the classifier thread.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::{json, Value};

use super::shared::{body, engine_failed, Reply, Shared};
use crate::serve::api::{
    parse, ApiError, ClassifyInput, ClassifyRequest, RerankRequest, CLASSIFY, RERANK,
};
use crate::serve::engine::{submit, OneShot};
use crate::serve::state::{AppState, Classifier};
use qkv::engine::classifier::ClassifyJob;

pub async fn rerank(State(s): Shared, b: Result<Bytes, BytesRejection>) -> Reply {
    let b = body(b)?;
    let req: RerankRequest = parse(&s.request_json("/v1/rerank", &b, &[RERANK], &[])?)?;
    let c = classifier(&s)?;
    s.check_model(&req.model)?;
    c.model
        .check_reranker()
        .map_err(|e| ApiError::status(StatusCode::NOT_FOUND, format!("{e}: POST /v1/classify")))?;
    if req.top_n == Some(0) {
        return Err(ApiError::invalid("top_n", "0: give at least 1"));
    }
    let inputs: Vec<(String, Option<String>)> = req
        .documents
        .iter()
        .map(|d| (req.query.clone(), Some(d.clone())))
        .collect();
    let (logits, tokens) = run(&s, c, inputs, "documents").await?;
    let scores = c.model.relevance(&logits);
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&i, &j| scores[j].total_cmp(&scores[i]));
    order.truncate(req.top_n.unwrap_or(order.len()));
    let results: Vec<Value> = order
        .iter()
        .map(|&i| match req.return_documents {
            true => json!({"index": i, "relevance_score": scores[i],
                           "document": {"text": req.documents[i]}}),
            false => json!({"index": i, "relevance_score": scores[i]}),
        })
        .collect();
    Ok(Json(json!({
        "model": s.name, "results": results,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response())
}

pub async fn classify(State(s): Shared, b: Result<Bytes, BytesRejection>) -> Reply {
    let b = body(b)?;
    let req: ClassifyRequest = parse(&s.request_json("/v1/classify", &b, &[CLASSIFY], &[])?)?;
    let c = classifier(&s)?;
    s.check_model(&req.model)?;
    let inputs: Vec<(String, Option<String>)> = match req.input {
        ClassifyInput::Text(t) => vec![(t, None)],
        ClassifyInput::Texts(v) => v.into_iter().map(|t| (t, None)).collect(),
        ClassifyInput::Pairs(v) => v.into_iter().map(|(a, b)| (a, Some(b))).collect(),
    };
    let (logits, tokens) = run(&s, c, inputs, "input").await?;
    let labels = c.model.labels();
    let data: Vec<Value> = logits
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let scores = c.model.scoring().apply(row);
            let each: Vec<Value> = labels
                .iter()
                .zip(scores.iter().zip(row))
                .map(|(l, (s, z))| json!({"label": l, "score": s, "logit": z}))
                .collect();
            json!({"index": i, "labels": each})
        })
        .collect();
    Ok(Json(json!({
        "object": "list", "data": data, "model": s.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response())
}

fn classifier(s: &AppState) -> Result<&Classifier, ApiError> {
    s.classifier.as_ref().ok_or_else(|| s.elsewhere())
}

/// Checks and tokenizes `inputs` (a bad one is the request's fault: 400 naming
/// `field`), then has the classifier thread run them; their logits and real tokens.
async fn run(
    s: &AppState,
    c: &Classifier,
    inputs: Vec<(String, Option<String>)>,
    field: &str,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    if inputs.is_empty() || inputs.len() > s.limits.max_inputs {
        return Err(ApiError::invalid(
            field,
            format!("{} inputs: give 1 to {}", inputs.len(), s.limits.max_inputs),
        ));
    }
    let refs: Vec<(&str, Option<&str>)> = inputs
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_deref()))
        .collect();
    let (batch, _) = c
        .model
        .tokenize(&refs)
        .map_err(|e| ApiError::invalid(field, e.to_string()))?;
    let tokens = batch.mask.iter().filter(|&&m| m).count();
    s.metrics.prompt(tokens);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job = ClassifyJob {
        inputs,
        reply: Box::new(OneShot(tx)),
    };
    submit(&c.queue, job, &s.metrics)?;
    let logits = rx
        .await
        .map_err(|_| engine_failed("the classifier stopped".into()))?
        .map_err(engine_failed)?;
    Ok((logits, tokens))
}
