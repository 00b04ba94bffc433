//! `prices`: what pricing costs a run. The first use of genai-prices' bundled data decodes it
//! (once per process, before the agent starts); then each model call the gateway or the stream
//! prices is one lookup and calculation.

use std::time::Instant;

use stepguard_prices::{PriceTable, Usage};

/// The pinned CLIs' default models, as they report them, and a model nothing prices (the
/// slowest lookup: every rule is tried).
const MODELS: &[&str] = &[
    "claude-opus-4-8",
    "claude-opus-4-8[1m]",
    "gpt-5.5",
    "gemini-3.8-flash",
    "gemini-3.5-flash-lite",
    "no-such-model-9",
];

/// Measures the first decode of the bundled data, then `calls` prices of each model (p50/p99).
pub(crate) fn run(calls: usize) -> anyhow::Result<()> {
    let table = PriceTable::builtin();
    let start = Instant::now();
    table.prepare();
    println!(
        "decode of the bundled data ({}): {:.1} ms",
        table.source().unwrap_or_default(),
        start.elapsed().as_secs_f64() * 1e3
    );
    let usage = Usage {
        input: 42_000,
        cache_read: 30_000,
        cache_write: 2_000,
        output: 900,
    };
    for model in MODELS {
        let mut times: Vec<f64> = (0..calls)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(table.cost(std::hint::black_box(model), &usage));
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        times.sort_by(f64::total_cmp);
        let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
        println!(
            "{model:<24} cost {:>12}  p50 {:>7.1} µs  p99 {:>7.1} µs",
            table
                .cost(model, &usage)
                .map_or_else(|| "unpriced".to_owned(), |c| format!("${c:.6}")),
            at(0.5),
            at(0.99)
        );
    }
    Ok(())
}
