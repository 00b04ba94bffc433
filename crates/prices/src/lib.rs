//! Model prices for cost budgets (`--max-cost-usd`): the one place stepguard decides what a
//! model call costs.
//!
//! Prices come from pydantic's [genai-prices](https://github.com/pydantic/genai-prices) (MIT),
//! the data Pydantic AI uses, bundled at build time (no network at run time): every provider's
//! models with their match rules, dated price changes, context-length tiers, cache reads and
//! cache writes. Users lay their own files over it. Its key types:
//!
//! * [`PriceTable`]: [`PriceTable::builtin`] is genai-prices' bundled data;
//!   [`PriceTable::load_file`] reads a user's file, either stepguard's TOML
//!   ([`PriceTable::from_toml`]) or genai-prices' own JSON ([`PriceTable::from_genai_json`],
//!   a newer `data.json` that replaces the bundled one); [`PriceTable::merged_over`] lays one
//!   table over another; [`PriceTable::cost`] prices a call of a model by the name an agent
//!   reports, [`PriceTable::priced_as`] says what priced it;
//! * [`Usage`]: a call's input (cache reads and writes included), cache reads, cache writes
//!   and output;
//! * [`Price`]: one model of a TOML file, in US dollars per million tokens;
//! * [`PriceError`]: what is wrong with a prices file, naming the file and the key.
//!
//! # The data ages
//!
//! The bundled data is that of `genai-prices` [`GENAI_PRICES_VERSION`], verified up to
//! [`BUNDLED_TAKEN`] ([`PriceTable::taken`], [`PriceTable::source`]). To correct a price or add
//! a model, write a TOML file and merge it over the built-in table (`taken` is optional):
//!
//! ```toml
//! taken = "2026-11-20"
//!
//! [models."claude-sonnet-4-5"]
//! input_per_mtok = 3.0
//! output_per_mtok = 15.0
//! cached_input_per_mtok = 0.3           # optional: the price of cache reads
//! cache_write_per_mtok = 3.75           # optional: the price of cache writes
//! source = "https://docs.claude.com/en/docs/about-claude/pricing"   # optional
//! aliases = ["claude-sonnet-4.5"]       # optional: other spellings of the same model
//! ```
//!
//! A model in that file is priced by the file (looked up as [`PriceTable::price`] says);
//! every other model by genai-prices' data. For all of its models at once, give genai-prices'
//! newest `data.json` as the file instead.
//!
//! # What the prices mean
//!
//! List prices, standard service tier, at the time of the call. genai-prices' data picks the
//! context-length tier from the call's input tokens and prices cache reads and writes at their
//! own rates; a TOML model has one tier. Output includes reasoning (thinking) tokens. A usage
//! that does not tell cache writes apart (most streams) prices them as input.
//!
//! # Example
//!
//! ```
//! use stepguard_prices::{PriceTable, Usage};
//!
//! let mine = PriceTable::from_toml(
//!     "[models.my-model]\ninput_per_mtok = 2\noutput_per_mtok = 8\n",
//!     "my-prices.toml",
//! )?;
//! let prices = mine.merged_over(PriceTable::builtin());
//!
//! let call = Usage { input: 1_000_000, output: 1_000_000, ..Usage::default() };
//! assert_eq!(prices.cost("my-model", &call), Some(10.0));
//! // Claude Code's default model, from genai-prices' data: $5 in, $25 out.
//! assert_eq!(prices.cost("claude-opus-4-8", &call), Some(30.0));
//! assert_eq!(prices.cost("no-such-model-9", &call), None);
//! # Ok::<(), stepguard_prices::PriceError>(())
//! ```
#![forbid(unsafe_code)]

mod data;
mod error;
mod listing;
mod name;
mod parse;
mod price;
mod table;

pub use data::{BUNDLED_SOURCE, BUNDLED_TAKEN, DataMatch, GENAI_PRICES_VERSION};
pub use error::PriceError;
pub use listing::DataPrice;
pub use price::{Price, Usage};
pub use table::{PriceTable, PricedAs, TEMPLATE_TOML};
