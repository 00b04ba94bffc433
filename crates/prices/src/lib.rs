//! Model prices for cost budgets (`--max-cost-usd`).
//!
//! A cost budget needs the price of every model call, so this crate ships a price table
//! (`prices.toml`, embedded in the binary) and reads users' files of the same format that
//! override it model by model. Its key types:
//!
//! * [`PriceTable`]: [`PriceTable::builtin`] is the shipped table, [`PriceTable::load_file`]
//!   and [`PriceTable::from_toml`] read a user's file, [`PriceTable::merged_over`] lays one over
//!   the other, [`PriceTable::price`] finds a model by the name an agent reports;
//! * [`Price`]: one model's prices in US dollars per million tokens, and [`Price::cost`] of a
//!   call;
//! * [`PriceError`]: what is wrong with a prices file, naming the file and the key.
//!
//! # The table ages
//!
//! Providers change prices and ship new models; the shipped table does not follow. Its
//! top-level `taken` date ([`PriceTable::taken`]) says when its prices were read, and each
//! model's `source` ([`Price::source`]) names the pricing page they came from. To correct a
//! price or add a model, write a file of the same format and merge it over the shipped table:
//!
//! ```toml
//! taken = "2026-01-20"
//!
//! [models."claude-sonnet-4-5"]
//! input_per_mtok = 3.0
//! output_per_mtok = 15.0
//! cached_input_per_mtok = 0.3           # optional: the price of cache reads
//! source = "https://docs.claude.com/en/docs/about-claude/pricing"   # optional
//! aliases = ["claude-sonnet-4.5"]       # optional: other spellings of the same model
//! ```
//!
//! A model in that file replaces the shipped model of the same name whole; one absent from it
//! keeps the shipped price.
//!
//! # What the prices mean
//!
//! List prices, standard tier: where a provider charges more past a prompt length (long
//! context), the table holds the base tier, so very long prompts cost more than it says.
//! Cache reads have their own price; cache writes are counted as input. Output includes
//! reasoning (thinking) tokens.
//!
//! # Example
//!
//! ```
//! use stepguard_prices::PriceTable;
//!
//! let mine = PriceTable::from_toml(
//!     "taken = \"2026-01-20\"\n[models.my-model]\ninput_per_mtok = 2\noutput_per_mtok = 8\n",
//!     "my-prices.toml",
//! )?;
//! let prices = mine.merged_over(PriceTable::builtin());
//!
//! // Provider prefixes and snapshot dates are stripped; a different model never matches.
//! let sonnet = prices.price("anthropic/claude-sonnet-4-5-20250929").expect("shipped");
//! assert_eq!(sonnet.cost(1_000_000, 0, 0), 3.0);
//! assert_eq!(prices.price("my-model").expect("mine").cost(0, 0, 1_000_000), 8.0);
//! assert!(prices.price("claude-sonnet-4-7").is_none());
//! # Ok::<(), stepguard_prices::PriceError>(())
//! ```
#![forbid(unsafe_code)]

mod error;
mod name;
mod parse;
mod price;
mod table;

pub use error::PriceError;
pub use price::Price;
pub use table::{BUILTIN_ORIGIN, BUILTIN_TOML, PriceTable};
