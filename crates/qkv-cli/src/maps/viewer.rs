//! The attention viewer: one self-contained HTML file (the maps' JSON document, the
//! script and the style inline; nothing fetched), which opens from `file://`.
//!
//! Views, all over the kind, layer and head picked at the top:
//! - model: a thumbnail per layer × head; a click opens that head;
//! - head: queries left, keys right, lines as thick as the weight; hovering a query
//!   keeps its row, hovering a key its column ("who attends to me");
//! - matrix: the heatmap, with the exact weight of the cell under the pointer.
//!
//! Beside them: each head's mean entropy (a sharp head has low entropy) and each
//! query's most attended key. A toggle hides special tokens and renormalises rows.
//!
//! A method picker switches between the documents of the methods computed (weights,
//! value norms, rollout, flow, gradient × attention, ablation): rollout, flow and grad
//! have one combined matrix per layer; bars under the stage give each token's credit
//! for the target (the `scores`), the whole of what ablation shows.

use anyhow::{Context, Result};
use qkv::models::explain::Method;

use super::document::Maps;

const PAGE: &str = include_str!("viewer.html");
const STYLE: &str = include_str!("viewer.css");
const SCRIPT: &str = include_str!("viewer.js");

/// JSON made safe inside `<script type="application/json">`: `<` only appears in
/// strings, where `\u003c` reads the same and `</script>` cannot close the element.
fn script_json(value: &impl serde::Serialize) -> Result<String> {
    Ok(serde_json::to_string(value)?.replace('<', "\\u003c"))
}

fn escape_html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The viewer of `docs`, one per method (the picker lists them; the page opens on the
/// first), with `skipped` the methods left out and why, and the special-token toggle on
/// when `hide_special`.
pub fn html(
    docs: &[Maps],
    skipped: &[(Method, String)],
    hide_special: bool,
    text: Option<&str>,
) -> Result<String> {
    let first = docs.first().context("the viewer needs one method's maps")?;
    let skipped: Vec<_> = skipped
        .iter()
        .map(|(m, why)| serde_json::json!({"method": m.name(), "reason": why}))
        .collect();
    let options =
        serde_json::json!({ "hide_special": hide_special, "skipped": skipped, "text": text });
    Ok(PAGE
        .replace("{{TITLE}}", &escape_html(&first.model))
        .replace("{{STYLE}}", STYLE)
        .replace("{{OPTIONS}}", &script_json(&options)?)
        .replace("{{SCRIPT}}", SCRIPT)
        // last: the data may hold any text, including the placeholders above
        .replace("{{DATA}}", &script_json(&docs)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_json_cannot_close_its_element() {
        let s = script_json(&"</script><b>").unwrap();
        assert!(!s.contains('<'));
        let back: String = serde_json::from_str(&s).unwrap();
        assert_eq!(back, "</script><b>");
    }
}
