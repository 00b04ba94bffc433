//! One model's price and the cost of a call.

use serde::Serialize;

/// The price of one model, in US dollars per million tokens.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Price {
    pub(crate) name: String,
    pub(crate) input_per_mtok: f64,
    pub(crate) output_per_mtok: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cached_input_per_mtok: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) source: Option<String>,
    pub(crate) aliases: Vec<String>,
    pub(crate) origin: String,
    pub(crate) taken: String,
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
        let uncached = input_tokens.saturating_sub(cached_input_tokens);
        let cached_price = self.cached_input_per_mtok.unwrap_or(self.input_per_mtok);
        // Dividing once, at the end, keeps round numbers exact: 1M tokens at $3 is 3.0.
        (uncached as f64 * self.input_per_mtok
            + cached_input_tokens as f64 * cached_price
            + output_tokens as f64 * self.output_per_mtok)
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

    /// Returns the URL of the pricing page the price came from, when the file gives one (every
    /// model of the shipped table has one).
    pub fn source(&self) -> Option<&str> {
        self.source.as_deref()
    }

    /// Returns the other names of the model.
    pub fn aliases(&self) -> &[String] {
        &self.aliases
    }

    /// Returns the file the price came from ([`crate::BUILTIN_ORIGIN`] for the shipped table).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Returns the date (`YYYY-MM-DD`) of the file the price came from.
    pub fn taken(&self) -> &str {
        &self.taken
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
        assert_eq!(sonnet.taken(), "2025-10-15");
    }
}
