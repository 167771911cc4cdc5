//! The first article's food-delivery example: a query "I'm hungry, I want something
//! spicy, my budget is 50 yuan" attends over three dishes whose keys say what they are
//! (light or spicy, cheap or expensive) and whose values say what you get.
//!
//! Query and keys are 4 hand-made features, chosen so that the dot product reads as
//! a sentence:
//!
//!   q·k = hunger·filling + wants_spicy·spiciness + budget·1 + (−1)·price
//!       = hunger·filling + wants_spicy·spiciness + (budget − price)
//!
//! with money in hundreds of yuan so every feature is of order 1 (the article's
//! prices 100, 20, 150 and budget 50 become 1.0, 0.2, 1.5 and 0.5). The two money
//! features make the match grow with how far a dish stays under budget; spiciness is
//! +1 spicy / −1 light, the article's labels. Every dish is a meal (filling = 1), so
//! hunger adds the same 1 to each score, and softmax, blind to a common shift,
//! ignores it: hunger says *that* we eat, not *what*.

use std::io::{self, Write};

use anyhow::Result;
use qkv::{attention, AttentionSpec, Kernel, Tensor};
use serde::Serialize;

use super::table::Table;

const QUERY_FEATURES: [&str; 4] = ["hunger", "wants_spicy", "budget_100_yuan", "minus_one"];
const KEY_FEATURES: [&str; 4] = ["filling", "spiciness", "one", "price_100_yuan"];
/// Values are "what you get": which dish (one-hot), how spicy, what it costs. The
/// fused output then reads directly as a mixture of dishes and an expected bill.
const VALUE_FEATURES: [&str; 5] = [
    "sea_bass",
    "mapo_tofu",
    "lobster",
    "spiciness",
    "price_yuan",
];

/// The query, in QUERY_FEATURES order: very hungry, wants spicy, 50 yuan to spend.
const QUERY: [f32; 4] = [1.0, 1.0, 0.5, -1.0];

struct DishSpec {
    label: &'static str,
    name: &'static str,
    tags: &'static str,
    spiciness: f32,
    price_yuan: f32,
}

/// The article's three dishes, in order A, B, C.
const DISHES: [DishSpec; 3] = [
    DishSpec {
        label: "A",
        name: "清蒸鲈鱼 steamed sea bass",
        tags: "light, expensive",
        spiciness: -1.0,
        price_yuan: 100.0,
    },
    DishSpec {
        label: "B",
        name: "麻婆豆腐 mapo tofu",
        tags: "spicy, cheap",
        spiciness: 1.0,
        price_yuan: 20.0,
    },
    DishSpec {
        label: "C",
        name: "麻辣龙虾 spicy lobster",
        tags: "spicy, expensive",
        spiciness: 1.0,
        price_yuan: 150.0,
    },
];

impl DishSpec {
    /// In KEY_FEATURES order.
    fn key(&self) -> [f32; 4] {
        [1.0, self.spiciness, 1.0, self.price_yuan / 100.0]
    }

    /// In VALUE_FEATURES order; `index` is the dish's place in DISHES (its one-hot slot).
    fn value(&self, index: usize) -> Vec<f32> {
        let mut v = vec![0.0; DISHES.len()];
        v[index] = 1.0;
        v.extend([self.spiciness, self.price_yuan]);
        v
    }
}

#[derive(Serialize)]
pub struct Dish {
    label: &'static str,
    name: &'static str,
    tags: &'static str,
    price_yuan: f32,
    key: [f32; 4],
    value: Vec<f32>,
}

#[derive(Serialize)]
pub struct Food {
    query_meaning: &'static str,
    query_features: [&'static str; 4],
    query: [f32; 4],
    key_features: [&'static str; 4],
    value_features: [&'static str; 5],
    score_formula: &'static str,
    dishes: Vec<Dish>,
    /// 1/√d_k with d_k = 4.
    scale: f32,
    /// q·k_j · scale for A, B, C.
    scores: Vec<f32>,
    /// softmax(scores), from the library, for A, B, C.
    weights: Vec<f32>,
    /// Σ_j weights_j · value_j, in VALUE_FEATURES order.
    output: Vec<f32>,
    /// Label of the dish with the largest weight.
    top: &'static str,
}

/// One batch, one head, one query (T = 1) against the three dishes (S = 3):
/// q [1,1,1,4], k [1,3,1,4], v [1,3,1,5], output [1,1,1,5], weights [1,1,1,3].
pub fn run() -> Result<Food> {
    let (d, dv, s) = (QUERY.len(), VALUE_FEATURES.len(), DISHES.len());
    let keys: Vec<[f32; 4]> = DISHES.iter().map(DishSpec::key).collect();
    let values: Vec<Vec<f32>> = DISHES.iter().enumerate().map(|(i, x)| x.value(i)).collect();
    let q = Tensor::new(&[1, 1, 1, d], QUERY.to_vec())?;
    let k = Tensor::new(&[1, s, 1, d], keys.concat())?;
    let v = Tensor::new(&[1, s, 1, dv], values.concat())?;
    // The reference kernel materialises the score row exactly as the article writes it.
    let spec = AttentionSpec {
        want_weights: true,
        kernel: Kernel::Reference,
        ..Default::default()
    };
    let a = attention(&q, &k, &v, &spec)?;
    let weights = a
        .weights
        .map(Tensor::into_data)
        .ok_or_else(|| anyhow::anyhow!("attention returned no weights though asked for them"))?;
    // The library keeps the scores internal; the same scaled dot products, for display.
    let scale = 1.0 / (d as f32).sqrt();
    let scores = keys
        .iter()
        .map(|key| scale * key.iter().zip(&QUERY).map(|(a, b)| a * b).sum::<f32>())
        .collect();
    let top = weights
        .iter()
        .zip(&DISHES)
        .max_by(|a, b| a.0.total_cmp(b.0))
        .map(|(_, dish)| dish.label)
        .expect("three dishes, three weights");
    let dishes = DISHES
        .iter()
        .zip(keys)
        .zip(values)
        .map(|((x, key), value)| Dish {
            label: x.label,
            name: x.name,
            tags: x.tags,
            price_yuan: x.price_yuan,
            key,
            value,
        })
        .collect();
    Ok(Food {
        query_meaning: "我很饿，想吃辣的，预算 50 元 (hungry, wants spicy, budget 50 yuan)",
        query_features: QUERY_FEATURES,
        query: QUERY,
        key_features: KEY_FEATURES,
        value_features: VALUE_FEATURES,
        score_formula: "q·k/√4 = (hunger·filling + wants_spicy·spiciness + budget_100_yuan − price_100_yuan) / 2",
        dishes,
        scale,
        scores,
        weights,
        output: a.out.into_data(),
        top,
    })
}

impl Food {
    pub fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "1. Food delivery: one query, three dishes (article 1)")?;
        writeln!(out, "  Query: {}", self.query_meaning)?;
        writeln!(
            out,
            "  q·k = hunger·filling + wants_spicy·spiciness + (budget − price) [money in 100 yuan]; score = q·k/√{}",
            self.query.len()
        )?;
        let mut t = Table::new(&["dish", "name", "key", "price", "score", "weight"]);
        for ((dish, score), weight) in self.dishes.iter().zip(&self.scores).zip(&self.weights) {
            t.row(vec![
                dish.label.into(),
                dish.name.into(),
                dish.tags.into(),
                format!("{}", dish.price_yuan),
                format!("{score:.3}"),
                format!("{weight:.3}"),
            ]);
        }
        t.write(out)?;
        let parts: Vec<String> = VALUE_FEATURES
            .iter()
            .zip(&self.output)
            .map(|(name, x)| format!("{name} {x:.2}"))
            .collect();
        writeln!(out, "  Output Σ weight·value: {}", parts.join(", "))?;
        writeln!(
            out,
            "  Dish {} gets the most attention, yet the output is a blend of all three, not a pick.",
            self.top
        )
    }
}
