//! pydantic's genai-prices data: the bundled snapshot, or a newer one a user gave, and how a
//! model name and stepguard's usage are put to it.

use std::sync::Arc;
use std::time::SystemTime;

use genai_prices::{Calculator, PriceRequest, UsageKey};

use crate::name::{fold, strip_provider};
use crate::{PriceError, Usage};

/// The version of the `genai-prices` crate whose data is bundled; the workspace pins exactly
/// this version (a unit test checks), so its data and [`BUNDLED_TAKEN`] move together.
pub const GENAI_PRICES_VERSION: &str = "0.2.1";

/// The date of the bundled data: the newest day its price comments say rates were verified
/// on (the data itself carries no date). Updated with [`GENAI_PRICES_VERSION`].
pub const BUNDLED_TAKEN: &str = "2026-10-26";

/// Where the bundled data comes from, as `stepguard prices` shows it.
pub const BUNDLED_SOURCE: &str = "genai-prices (https://github.com/pydantic/genai-prices, MIT)";

/// Routing prefixes that name a provider of genai-prices' data: a name so prefixed is looked up
/// without the prefix in that provider.
const PREFIX_PROVIDERS: &[(&str, &str)] = &[
    ("anthropic/", "anthropic"),
    ("openai/", "openai"),
    ("google/", "google"),
    ("gemini/", "google"),
    ("models/", "google"),
];

/// One snapshot of genai-prices' provider data.
#[derive(Clone, Debug)]
pub(crate) enum Data {
    /// The data bundled with the `genai-prices` crate.
    Bundled,
    /// Data read from a user's file (genai-prices' v2 JSON), replacing the bundled one.
    Loaded {
        calculator: Arc<Calculator>,
        origin: String,
    },
}

/// A model of genai-prices' data that priced a call.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct DataMatch {
    /// The provider's ID in the data, e.g. `anthropic`.
    pub provider: String,
    /// The model's ID in the data, e.g. `claude-opus-4-8`.
    pub model: String,
}

impl Data {
    /// Parses genai-prices' v2 provider data (a JSON array of providers).
    pub(crate) fn from_json(text: &str, origin: &str) -> Result<Data, PriceError> {
        let calculator = Calculator::from_json(text).map_err(|e| PriceError::Data {
            origin: origin.to_owned(),
            message: e.to_string(),
        })?;
        if calculator.providers().next().is_none() {
            return Err(PriceError::Data {
                origin: origin.to_owned(),
                message: "the file lists no provider".to_owned(),
            });
        }
        Ok(Data::Loaded {
            calculator: Arc::new(calculator),
            origin: origin.to_owned(),
        })
    }

    pub(crate) fn calculator(&self) -> &Calculator {
        match self {
            Data::Bundled => Calculator::bundled(),
            Data::Loaded { calculator, .. } => calculator,
        }
    }

    /// Returns where the data comes from: genai-prices' bundled data or the user's file.
    pub(crate) fn source(&self) -> String {
        match self {
            Data::Bundled => format!("{BUNDLED_SOURCE} {GENAI_PRICES_VERSION}, bundled data"),
            Data::Loaded { origin, .. } => format!("genai-prices data from {origin}"),
        }
    }

    /// Returns the data's date, when known (a user's JSON file carries none).
    pub(crate) fn taken(&self) -> Option<&'static str> {
        match self {
            Data::Bundled => Some(BUNDLED_TAKEN),
            Data::Loaded { .. } => None,
        }
    }

    /// Returns the cost in US dollars of a call of `model` with `usage` at `at` (now when
    /// `None`), and the model of the data that priced it, or `None` when the data prices no
    /// such model.
    ///
    /// The name is tried as given (genai-prices matches it in the provider whose models it
    /// names), then without routing prefixes (`anthropic/`, `openai/`, `google/`, `gemini/`,
    /// `models/`) in the provider the first prefix names.
    pub(crate) fn cost(
        &self,
        model: &str,
        usage: &Usage,
        at: Option<SystemTime>,
    ) -> Option<(f64, DataMatch)> {
        let folded = fold(model);
        if folded.is_empty() {
            return None;
        }
        let provider = PREFIX_PROVIDERS
            .iter()
            .find_map(|(prefix, id)| folded.starts_with(prefix).then_some(*id));
        let unprefixed = strip_provider(&folded);
        self.calculate(&folded, None, usage, at).or_else(|| {
            (unprefixed.len() != folded.len())
                .then(|| self.calculate(unprefixed, provider, usage, at))
                .flatten()
        })
    }

    /// Returns the cost of `usage` as the model `model_id` of the provider `provider_id`, now,
    /// when the model's ID matches itself in the data.
    pub(crate) fn priced_in(
        &self,
        provider_id: &str,
        model_id: &str,
        usage: &Usage,
    ) -> Option<f64> {
        let (cost, found) = self.calculate(model_id, Some(provider_id), usage, None)?;
        (found.model == model_id && found.provider == provider_id).then_some(cost)
    }

    fn calculate(
        &self,
        model: &str,
        provider: Option<&str>,
        usage: &Usage,
        at: Option<SystemTime>,
    ) -> Option<(f64, DataMatch)> {
        let usage = genai_usage(usage);
        let mut request = PriceRequest::new(model, &usage);
        if let Some(id) = provider {
            request = request.with_provider_id(id);
        }
        if let Some(at) = at {
            request = request.with_timestamp(at);
        }
        let priced = self.calculator().calculate(&request).ok()?;
        let found = DataMatch {
            provider: priced.provider_id,
            model: priced.model_id,
        };
        priced
            .total_price
            .is_finite()
            .then_some((priced.total_price, found))
    }
}

/// stepguard's usage in genai-prices' keys. Both count cache reads and writes inside the input
/// tokens; more cached than input is taken as all input cached (never a cost below the counts).
fn genai_usage(usage: &Usage) -> genai_prices::Usage {
    let cached = usage.cache_read.saturating_add(usage.cache_write);
    let input = usage.input.max(cached);
    let mut out = genai_prices::Usage::new();
    out.insert(UsageKey::INPUT_TOKENS, input as f64);
    out.insert(UsageKey::OUTPUT_TOKENS, usage.output as f64);
    if usage.cache_read > 0 {
        out.insert(UsageKey::CACHE_READ_TOKENS, usage.cache_read as f64);
    }
    if usage.cache_write > 0 {
        out.insert(UsageKey::CACHE_WRITE_TOKENS, usage.cache_write as f64);
    }
    out
}

impl PartialEq for Data {
    fn eq(&self, other: &Data) -> bool {
        match (self, other) {
            (Data::Bundled, Data::Bundled) => true,
            (Data::Loaded { calculator: a, .. }, Data::Loaded { calculator: b, .. }) => {
                Arc::ptr_eq(a, b)
            }
            _ => false,
        }
    }
}
