//! genai-prices' models listed with what a million tokens of each kind costs today.

use serde::Serialize;

use crate::Usage;
use crate::data::Data;

/// One model of genai-prices' data with its prices now, in US dollars per million tokens (the
/// base context-length tier).
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
    let mtok = 1_000_000;
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
                    .map(|c| *cost = c)
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
