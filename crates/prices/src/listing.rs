//! genai-prices' models listed with what a million tokens of each kind costs today.

use serde::Serialize;

use crate::Usage;
use crate::data::Data;

/// One model of genai-prices' data with its prices now, in US dollars per million tokens of the
/// base context-length tier (what a short call pays per token, times a million).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DataPrice {
    /// The provider's ID, e.g. `anthropic`.
    pub provider: String,
    /// The model's ID, e.g. `claude-opus-4-8`.
    pub model: String,
    /// A million input tokens.
    pub input_per_mtok: f64,
    /// A million output tokens.
    pub output_per_mtok: f64,
    /// A million input tokens read from the cache.
    pub cached_input_per_mtok: f64,
    /// A million input tokens written to the cache.
    pub cache_write_per_mtok: f64,
}

/// Prices every model of `data` that its own ID matches.
pub(crate) fn data_prices(data: &Data) -> Vec<DataPrice> {
    // A thousand tokens stay below every long-context tier; scaled to a million after.
    let mtok = SAMPLE;
    let kinds = [
        Usage {
            input: mtok,
            ..Usage::default()
        },
        Usage {
            output: mtok,
            ..Usage::default()
        },
        Usage {
            input: mtok,
            cache_read: mtok,
            ..Usage::default()
        },
        Usage {
            input: mtok,
            cache_write: mtok,
            ..Usage::default()
        },
    ];
    let mut out = Vec::new();
    for provider in data.calculator().providers() {
        for model in provider.models() {
            let mut costs = [0.0; 4];
            let priced = kinds.iter().zip(costs.iter_mut()).all(|(usage, cost)| {
                data.priced_in(provider.id(), model.id(), usage)
                    .map(|c| *cost = per_mtok(c))
                    .is_some()
            });
            if priced {
                out.push(DataPrice {
                    provider: provider.id().to_owned(),
                    model: model.id().to_owned(),
                    input_per_mtok: costs[0],
                    output_per_mtok: costs[1],
                    cached_input_per_mtok: costs[2],
                    cache_write_per_mtok: costs[3],
                });
            }
        }
    }
    out
}

/// The tokens a per-million price is sampled with: below every context-length tier.
pub(crate) const SAMPLE: u64 = 1_000;

/// Returns the cost of [`SAMPLE`] tokens as a price per million, without floating-point dust.
pub(crate) fn per_mtok(cost: f64) -> f64 {
    (cost * (1_000_000 / SAMPLE) as f64 * 1e9).round() / 1e9
}
