//! One model's price from a user's file, and the usage of a call.

use serde::Serialize;

/// The usage of one model call (or of several, summed), as stepguard counts it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Input tokens, cache reads and cache writes included.
    pub input: u64,
    /// Input tokens read from the provider's cache.
    pub cache_read: u64,
    /// Input tokens written to the provider's cache (counted as input when the usage does not
    /// tell them apart, as most streams do not).
    pub cache_write: u64,
    /// Output tokens, reasoning included.
    pub output: u64,
}

/// The price of one model, in US dollars per million tokens.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Price {
    pub(crate) name: String,
    pub(crate) input_per_mtok: f64,
    pub(crate) output_per_mtok: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cached_input_per_mtok: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cache_write_per_mtok: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) source: Option<String>,
    pub(crate) aliases: Vec<String>,
    pub(crate) origin: String,
    pub(crate) taken: Option<String>,
    /// Whether the file gave `aliases`; an override without them keeps the shipped ones.
    #[serde(skip)]
    pub(crate) aliases_given: bool,
}

impl Price {
    /// Returns the cost in US dollars of a call that read `input_tokens` (cached ones included)
    /// and wrote `output_tokens` (reasoning included).
    ///
    /// The `cached_input_tokens` are priced at [`Price::cached_input_per_mtok`] when the table
    /// gives one, else at the input price; the rest of the input at the input price. When
    /// `cached_input_tokens` exceeds `input_tokens` the input is taken to be all cached, so the
    /// cost is never below what the counts say. Cache writes have no price of their own: count
    /// them as input.
    pub fn cost(&self, input_tokens: u64, cached_input_tokens: u64, output_tokens: u64) -> f64 {
        self.cost_of(&Usage {
            input: input_tokens,
            cache_read: cached_input_tokens,
            cache_write: 0,
            output: output_tokens,
        })
    }

    /// Returns the cost in US dollars of `usage`: cache reads at
    /// [`Price::cached_input_per_mtok`] and cache writes at [`Price::cache_write_per_mtok`]
    /// when the file gives them (else at the input price), the rest of the input at the input
    /// price. More cached than input is taken as all input cached.
    pub fn cost_of(&self, usage: &Usage) -> f64 {
        let cached = usage.cache_read.saturating_add(usage.cache_write);
        let uncached = usage.input.saturating_sub(cached);
        let read_price = self.cached_input_per_mtok.unwrap_or(self.input_per_mtok);
        let write_price = self.cache_write_per_mtok.unwrap_or(self.input_per_mtok);
        // Dividing once, at the end, keeps round numbers exact: 1M tokens at $3 is 3.0.
        (uncached as f64 * self.input_per_mtok
            + usage.cache_read as f64 * read_price
            + usage.cache_write as f64 * write_price
            + usage.output as f64 * self.output_per_mtok)
            / 1_000_000.0
    }

    /// Returns the model's name as the table spells it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Returns the price of a million input tokens.
    pub fn input_per_mtok(&self) -> f64 {
        self.input_per_mtok
    }

    /// Returns the price of a million output tokens.
    pub fn output_per_mtok(&self) -> f64 {
        self.output_per_mtok
    }

    /// Returns the price of a million input tokens read from the provider's cache, when the
    /// table gives one.
    pub fn cached_input_per_mtok(&self) -> Option<f64> {
        self.cached_input_per_mtok
    }

    /// Returns the price of a million input tokens written to the provider's cache, when the
    /// file gives one.
    pub fn cache_write_per_mtok(&self) -> Option<f64> {
        self.cache_write_per_mtok
    }

    /// Returns the URL of the pricing page the price came from, when the file gives one.
    pub fn source(&self) -> Option<&str> {
        self.source.as_deref()
    }

    /// Returns the other names of the model.
    pub fn aliases(&self) -> &[String] {
        &self.aliases
    }

    /// Returns the file the price came from.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Returns the date (`YYYY-MM-DD`) of the file the price came from, when it gives one.
    pub fn taken(&self) -> Option<&str> {
        self.taken.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use crate::PriceTable;

    fn table() -> PriceTable {
        PriceTable::from_toml(
            r#"
taken = "2025-10-15"
[models.sonnet]
input_per_mtok = 3
output_per_mtok = 15
cached_input_per_mtok = 0.3
[models.plain]
input_per_mtok = 2.5
output_per_mtok = 10.0
[models.free]
input_per_mtok = 0
output_per_mtok = 0
"#,
            "test.toml",
        )
        .unwrap()
    }

    #[test]
    fn cost_of_round_numbers_is_exact() {
        let t = table();
        let sonnet = t.price("sonnet").unwrap();
        assert_eq!(sonnet.cost(1_000_000, 0, 0), 3.0);
        assert_eq!(sonnet.cost(0, 0, 1_000_000), 15.0);
        assert_eq!(sonnet.cost(1_000_000, 0, 1_000_000), 18.0);
        assert_eq!(sonnet.cost(2_000_000, 0, 500_000), 13.5);
        assert_eq!(sonnet.cost(0, 0, 0), 0.0);
        let plain = t.price("plain").unwrap();
        assert_eq!(plain.cost(1_000_000, 0, 1_000_000), 12.5);
        assert_eq!(plain.cost(400_000, 0, 0), 1.0);
        assert_eq!(t.price("free").unwrap().cost(123_456, 7, 89), 0.0);
    }

    #[test]
    fn small_calls_cost_their_share() {
        let t = table();
        let sonnet = t.price("sonnet").unwrap();
        // 1,000 in and 500 out at $3 / $15: 0.003 + 0.0075.
        assert!((sonnet.cost(1_000, 0, 500) - 0.0105).abs() < 1e-12);
    }

    #[test]
    fn cached_input_has_its_own_price_when_given() {
        let t = table();
        let sonnet = t.price("sonnet").unwrap();
        // All 1M input tokens read from the cache, at $0.30.
        assert_eq!(sonnet.cost(1_000_000, 1_000_000, 0), 0.3);
        // 1M in of which 500K cached: 0.5 × 3 + 0.5 × 0.3.
        assert_eq!(sonnet.cost(1_000_000, 500_000, 0), 1.65);
        // 2M uncached at $3, 1M cached at $0.30, 1M out at $15.
        assert_eq!(sonnet.cost(3_000_000, 1_000_000, 1_000_000), 21.3);
    }

    #[test]
    fn cached_input_costs_as_input_without_a_cached_price() {
        let t = table();
        let plain = t.price("plain").unwrap();
        assert_eq!(plain.cached_input_per_mtok(), None);
        assert_eq!(plain.cost(1_000_000, 1_000_000, 0), 2.5);
        assert_eq!(plain.cost(1_000_000, 400_000, 0), 2.5);
    }

    #[test]
    fn more_cached_than_input_counts_all_as_cached() {
        let t = table();
        let sonnet = t.price("sonnet").unwrap();
        assert_eq!(sonnet.cost(0, 1_000_000, 0), 0.3);
        assert_eq!(sonnet.cost(500_000, 1_000_000, 0), 0.3);
    }

    #[test]
    fn accessors_report_the_file() {
        let t = table();
        let sonnet = t.price("sonnet").unwrap();
        assert_eq!(sonnet.name(), "sonnet");
        assert_eq!(sonnet.input_per_mtok(), 3.0);
        assert_eq!(sonnet.output_per_mtok(), 15.0);
        assert_eq!(sonnet.cached_input_per_mtok(), Some(0.3));
        assert_eq!(sonnet.source(), None);
        assert!(sonnet.aliases().is_empty());
        assert_eq!(sonnet.origin(), "test.toml");
        assert_eq!(sonnet.taken(), Some("2025-10-15"));
        assert_eq!(sonnet.cache_write_per_mtok(), None);
    }

    #[test]
    fn cache_writes_have_their_own_price_when_given() {
        let t = PriceTable::from_toml(
            "[models.w]\ninput_per_mtok = 4\noutput_per_mtok = 20\n\
             cached_input_per_mtok = 0.4\ncache_write_per_mtok = 5\n",
            "w.toml",
        )
        .unwrap();
        let w = t.price("w").unwrap();
        let usage = |input, cache_read, cache_write, output| crate::Usage {
            input,
            cache_read,
            cache_write,
            output,
        };
        // 1M in: 500K written to the cache at $5, 250K read at $0.40, 250K plain at $4.
        assert_eq!(w.cost_of(&usage(1_000_000, 250_000, 500_000, 0)), 3.6);
        assert_eq!(w.cost_of(&usage(0, 0, 1_000_000, 0)), 5.0);
        // Without a cache-write price, writes cost as input.
        let plain = table();
        let plain = plain.price("plain").unwrap();
        assert_eq!(plain.cost_of(&usage(1_000_000, 0, 1_000_000, 0)), 2.5);
    }
}
