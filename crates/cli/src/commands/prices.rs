//! `stepguard prices`: where the model prices of a cost budget come from, and what a model
//! costs.

use std::io::Write as _;

use serde_json::{Value, json};
use stepguard_core::ExitCode;
use stepguard_prices::{PriceTable, PricedAs, TEMPLATE_TOML};

use crate::args::PricesArgs;
use crate::exit::UsageError;
use crate::output;

/// Runs `stepguard prices`: the data's source and date with a template for a `--prices` file,
/// the prices of the MODELs named, or with `--json` every model.
pub(crate) fn run(args: &PricesArgs) -> anyhow::Result<ExitCode> {
    let table = crate::settings::price_table(args.prices.as_deref())?;
    if !args.models.is_empty() {
        return quote(&table, &args.models, args.json);
    }
    if args.json {
        let files: Vec<_> = table.models().collect();
        output::json(&json!({
            "source": table.source(),
            "genai_prices_version": stepguard_prices::GENAI_PRICES_VERSION,
            "taken": table.taken(),
            "file_models": files,
            "models": table.data_models(),
        }))?;
        return Ok(ExitCode::Success);
    }
    let mut out = std::io::stdout().lock();
    for line in header(&table) {
        writeln!(out, "# {line}")?;
    }
    if args.prices.is_some() {
        for p in table.models() {
            writeln!(out, "# {}", file_line(p))?;
        }
    }
    out.write_all(TEMPLATE_TOML.as_bytes())?;
    out.flush()?;
    Ok(ExitCode::Success)
}

/// The lines that say where the prices come from and how old they are.
fn header(table: &PriceTable) -> Vec<String> {
    let data = table.data_models();
    vec![
        format!(
            "prices: {}",
            table
                .source()
                .unwrap_or_else(|| "the price files only".to_owned())
        ),
        format!(
            "taken: {}",
            table.taken().unwrap_or("unknown (the files give no date)")
        ),
        format!(
            "{} models of genai-prices' data, {} of --prices files; `stepguard prices MODEL` \
             shows what one costs",
            data.len(),
            table.models().len()
        ),
        "a --prices FILE lays TOML models over the data (or replaces it with genai-prices' JSON \
         data); a template:"
            .to_owned(),
    ]
}

/// One model of a TOML file, in words.
fn file_line(p: &stepguard_prices::Price) -> String {
    format!(
        "{}: ${}/Mtok in, ${}/Mtok out{}{} ({})",
        p.name(),
        p.input_per_mtok(),
        p.output_per_mtok(),
        p.cached_input_per_mtok()
            .map(|c| format!(", ${c}/Mtok cache read"))
            .unwrap_or_default(),
        p.cache_write_per_mtok()
            .map(|c| format!(", ${c}/Mtok cache write"))
            .unwrap_or_default(),
        p.origin()
    )
}

/// Prints what each of `models` costs; an unpriced one is a usage error naming the fix.
fn quote(table: &PriceTable, models: &[String], json: bool) -> anyhow::Result<ExitCode> {
    let quotes: Vec<Value> = models.iter().map(|m| model_quote(table, m)).collect();
    if json {
        output::json(&json!({
            "source": table.source(),
            "taken": table.taken(),
            "models": quotes,
        }))?;
    } else {
        for q in quotes.iter().filter(|q| q["priced"] == true) {
            output::line(quote_line(q))?;
        }
    }
    let unpriced: Vec<&str> = models
        .iter()
        .zip(&quotes)
        .filter(|(_, q)| q["priced"] == false)
        .map(|(m, _)| m.as_str())
        .collect();
    if unpriced.is_empty() {
        return Ok(ExitCode::Success);
    }
    Err(UsageError(format!(
        "no price for {}: add {} to a price file given with --prices FILE (`stepguard prices` \
         prints a template)",
        unpriced
            .iter()
            .map(|m| format!("`{m}`"))
            .collect::<Vec<_>>()
            .join(", "),
        if unpriced.len() == 1 { "it" } else { "them" }
    ))
    .into())
}

/// What `model` costs per million tokens of each kind now (the base context-length tier).
fn model_quote(table: &PriceTable, model: &str) -> Value {
    let Some(priced) = table.priced_as(model) else {
        return json!({"query": model, "priced": false});
    };
    let per = table.per_mtok(model).unwrap_or_default();
    let (name, origin) = match &priced {
        PricedAs::File(p) => (p.name().to_owned(), p.origin().to_owned()),
        PricedAs::Data(d) => (
            format!("{}/{}", d.provider, d.model),
            table.source().unwrap_or_default(),
        ),
        _ => (model.to_owned(), String::new()),
    };
    json!({
        "query": model,
        "priced": true,
        "priced_as": name,
        "origin": origin,
        "input_per_mtok": per[0],
        "output_per_mtok": per[1],
        "cached_input_per_mtok": per[2],
        "cache_write_per_mtok": per[3],
    })
}

/// One quote in words, e.g. `claude-opus-4-8: anthropic/claude-opus-4-8, $5/Mtok in, …`.
fn quote_line(q: &Value) -> String {
    let usd = |key: &str| {
        q[key]
            .as_f64()
            .map_or_else(|| "?".to_owned(), |v| format!("${v}"))
    };
    format!(
        "{}: {}, {}/Mtok in, {}/Mtok out, {}/Mtok cache read, {}/Mtok cache write ({})",
        q["query"].as_str().unwrap_or_default(),
        q["priced_as"].as_str().unwrap_or_default(),
        usd("input_per_mtok"),
        usd("output_per_mtok"),
        usd("cached_input_per_mtok"),
        usd("cache_write_per_mtok"),
        q["origin"].as_str().unwrap_or_default()
    )
}
