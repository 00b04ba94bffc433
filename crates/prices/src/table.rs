//! The price table: genai-prices' data, user files laid over it, lookup and cost.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::SystemTime;

use crate::data::{Data, DataMatch};
use crate::name::{fold, strip_provider, strip_snapshot};
use crate::{Price, PriceError, Usage};

/// A template for a user's prices file (TOML), as `stepguard prices` prints it.
pub const TEMPLATE_TOML: &str = include_str!("../template.toml");

/// Model prices, looked up by the model name an agent reports: the models of user files
/// first, then genai-prices' data.
#[derive(Clone, Debug, PartialEq)]
pub struct PriceTable {
    /// The oldest `taken` date of the TOML files merged into the table, when they give one.
    pub(crate) taken: Option<String>,
    /// Folded (trimmed, lowercase) model name → price, from TOML files.
    pub(crate) models: BTreeMap<String, Price>,
    /// Folded alias → folded model name.
    pub(crate) index: BTreeMap<String, String>,
    /// genai-prices' data under the files' models, when the table has it.
    pub(crate) data: Option<Data>,
}

/// What prices a model: a user's file or genai-prices' data.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum PricedAs<'t> {
    /// A model of a TOML file.
    File(&'t Price),
    /// A model of genai-prices' data.
    Data(DataMatch),
}

impl PriceTable {
    /// Returns the table of genai-prices' bundled data (see [`PriceTable::taken`] for its age
    /// and [`PriceTable::source`] for its version).
    pub fn builtin() -> PriceTable {
        PriceTable {
            taken: None,
            models: BTreeMap::new(),
            index: BTreeMap::new(),
            data: Some(Data::Bundled),
        }
    }

    /// Parses a prices file's text in stepguard's TOML format. `origin` names the file in
    /// errors and in [`Price::origin`].
    ///
    /// Every problem is an error naming `origin` and the dotted key: invalid TOML (with line
    /// and column), a malformed `taken` (which may be left out), a model without
    /// `input_per_mtok` or `output_per_mtok`, a price that is negative, NaN or infinite, a
    /// value of the wrong type, an unknown key, and a name or alias used twice
    /// (case-insensitively).
    pub fn from_toml(text: &str, origin: &str) -> Result<PriceTable, PriceError> {
        crate::parse::parse(text, origin)
    }

    /// Parses genai-prices' provider data (its v2 JSON: an array of providers, as its
    /// `data.json` is published). Merged over another table, it replaces that table's data
    /// whole; TOML models stay on top.
    pub fn from_genai_json(text: &str, origin: &str) -> Result<PriceTable, PriceError> {
        Ok(PriceTable {
            taken: None,
            models: BTreeMap::new(),
            index: BTreeMap::new(),
            data: Some(Data::from_json(text, origin)?),
        })
    }

    /// Reads and parses a prices file; the crate's one I/O function. A file whose name ends
    /// in `.json`, or whose text starts as a JSON array does (`[{` or `[]`, spaces allowed), is
    /// genai-prices' JSON; any other is TOML (which may start with a `[table]` header).
    pub fn load_file(path: impl AsRef<Path>) -> Result<PriceTable, PriceError> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| PriceError::Read {
            path: shown.clone(),
            source,
        })?;
        let json = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"))
            || text
                .trim_start()
                .strip_prefix('[')
                .is_some_and(|rest| rest.trim_start().starts_with(['{', ']']));
        if json {
            PriceTable::from_genai_json(&text, &shown)
        } else {
            PriceTable::from_toml(&text, &shown)
        }
    }

    /// Returns this table laid over `base`, model by model: a model of this table replaces the
    /// model of the same name in `base` whole (its prices, cached price and source), keeping
    /// `base`'s aliases only when this table's entry gives no `aliases`. This table's
    /// genai-prices data, when it has some, replaces `base`'s.
    ///
    /// A name or alias of this table that `base` uses for another model now means this table's
    /// model: a base model so named is dropped, a base alias so spelled is removed. The result's
    /// [`PriceTable::taken`] is the oldest of the dates.
    pub fn merged_over(self, base: PriceTable) -> PriceTable {
        let mut base_models = base.models;
        let mut user = self.models;

        let explicit = folded_keys(&user);
        for (name, price) in &mut user {
            if let Some(replaced) = base_models.remove(name)
                && !price.aliases_given
            {
                price.aliases = replaced
                    .aliases
                    .into_iter()
                    .filter(|a| !explicit.contains(&fold(a)))
                    .collect();
            }
        }

        let claimed = folded_keys(&user);
        base_models.retain(|name, _| !claimed.contains(name));
        for price in base_models.values_mut() {
            price.aliases.retain(|a| !claimed.contains(&fold(a)));
        }
        base_models.extend(user);

        let index = base_models
            .iter()
            .flat_map(|(name, p)| p.aliases.iter().map(move |a| (fold(a), name.clone())))
            .collect();
        let taken = match (self.taken, base.taken) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        PriceTable {
            taken,
            models: base_models,
            index,
            data: self.data.or(base.data),
        }
    }

    /// Returns the price of `model` in the table's TOML files, or `None` when they have none
    /// (genai-prices' data may still price it: see [`PriceTable::priced_as`]).
    ///
    /// Names are compared case-insensitively. The lookup tries, in order and stopping at the
    /// first hit: the name as given (a model's name or an alias); the name without provider
    /// prefixes (`anthropic/`, `openai/`, `google/`, `gemini/`, `models/`); that name without a
    /// snapshot suffix (`-YYYYMMDD`, `-YYYY-MM-DD`, `@YYYYMMDD`, or a three-digit version such
    /// as `-001`). Nothing else is removed, so a name never matches a different model: neither
    /// `gpt-4o-mini` nor `ft:gpt-4o-2024-08-06:org::id` is priced as `gpt-4o`.
    pub fn price(&self, model: &str) -> Option<&Price> {
        let folded = fold(model);
        if let Some(price) = self.lookup(&folded) {
            return Some(price);
        }
        let unprefixed = strip_provider(&folded);
        if unprefixed.len() != folded.len()
            && let Some(price) = self.lookup(unprefixed)
        {
            return Some(price);
        }
        strip_snapshot(unprefixed).and_then(|base| self.lookup(base))
    }

    /// Returns what prices `model`: a TOML file's model ([`PriceTable::price`]) or else
    /// genai-prices' data (matched by its own rules, e.g. `claude-opus-4-8[1m]` as
    /// `claude-opus-4-8`), or `None` when nothing does.
    pub fn priced_as(&self, model: &str) -> Option<PricedAs<'_>> {
        if let Some(price) = self.price(model) {
            return Some(PricedAs::File(price));
        }
        let data = self.data.as_ref()?;
        data.cost(model, &Usage::default(), None)
            .map(|(_, found)| PricedAs::Data(found))
    }

    /// Returns the cost in US dollars of a call of `model` with `usage`, at today's prices,
    /// or `None` when nothing prices the model.
    ///
    /// A TOML file's model is priced by [`Price::cost_of`]. genai-prices' data prices the call
    /// with the model's prices in effect now, its context-length tier chosen by the call's
    /// input tokens (so give it one call's usage: a sum of several calls may reach a tier none
    /// of them did, which costs more, never less), cache reads and writes at their own prices.
    pub fn cost(&self, model: &str, usage: &Usage) -> Option<f64> {
        self.cost_at(model, usage, SystemTime::now())
    }

    /// Returns [`PriceTable::cost`] at the prices in effect at `at`.
    pub fn cost_at(&self, model: &str, usage: &Usage, at: SystemTime) -> Option<f64> {
        if let Some(price) = self.price(model) {
            return Some(price.cost_of(usage));
        }
        let (cost, _) = self.data.as_ref()?.cost(model, usage, Some(at))?;
        Some(cost)
    }

    /// Decodes genai-prices' bundled data now, if the table has it and it is not yet decoded
    /// (tens of milliseconds, once per process), so that the first call priced does not wait.
    pub fn prepare(&self) {
        if let Some(data) = &self.data {
            data.calculator();
        }
    }

    /// Returns the date (`YYYY-MM-DD`) of the prices: the oldest date of the TOML files and
    /// the data, or `None` when none gives one.
    pub fn taken(&self) -> Option<&str> {
        let data = self.data.as_ref().and_then(Data::taken);
        match (self.taken.as_deref(), data) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Returns where the table's data comes from, e.g. `genai-prices (…, MIT) 0.2.1, bundled
    /// data`, or `None` for a table of TOML models only.
    pub fn source(&self) -> Option<String> {
        self.data.as_ref().map(Data::source)
    }

    /// Returns the models of the table's TOML files, ordered by name.
    pub fn models(&self) -> impl ExactSizeIterator<Item = &Price> {
        self.models.values()
    }

    /// Returns what a million tokens of each kind cost as `model` now, in the base
    /// context-length tier: input, output, cache reads, cache writes; `None` when nothing
    /// prices the model.
    pub fn per_mtok(&self, model: &str) -> Option<[f64; 4]> {
        let n = crate::listing::SAMPLE;
        let kinds = [
            Usage {
                input: n,
                ..Usage::default()
            },
            Usage {
                output: n,
                ..Usage::default()
            },
            Usage {
                input: n,
                cache_read: n,
                ..Usage::default()
            },
            Usage {
                input: n,
                cache_write: n,
                ..Usage::default()
            },
        ];
        let mut out = [0.0; 4];
        for (usage, slot) in kinds.iter().zip(out.iter_mut()) {
            *slot = crate::listing::per_mtok(self.cost(model, usage)?);
        }
        Some(out)
    }

    /// Returns every model of genai-prices' data with its prices now, by provider.
    pub fn data_models(&self) -> Vec<crate::DataPrice> {
        self.data
            .as_ref()
            .map(crate::listing::data_prices)
            .unwrap_or_default()
    }

    fn lookup(&self, folded: &str) -> Option<&Price> {
        self.models.get(folded).or_else(|| {
            self.index
                .get(folded)
                .and_then(|name| self.models.get(name))
        })
    }
}

/// Returns every name and alias of `models`, folded.
fn folded_keys(models: &BTreeMap<String, Price>) -> BTreeSet<String> {
    models
        .iter()
        .flat_map(|(name, p)| {
            std::iter::once(name.clone()).chain(p.aliases.iter().map(|a| fold(a)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    fn table(models: &str) -> PriceTable {
        PriceTable::from_toml(&format!("taken = \"2025-10-15\"\n{models}"), "test.toml").unwrap()
    }

    fn entry(name: &str, input: f64) -> String {
        format!("[models.\"{name}\"]\ninput_per_mtok = {input:?}\noutput_per_mtok = 1.0\n")
    }

    /// Returns the name of the model `query` is priced as in a TOML file, if any.
    fn priced_as<'t>(t: &'t PriceTable, query: &str) -> Option<&'t str> {
        t.price(query).map(Price::name)
    }

    /// Returns the provider and model of genai-prices' data that price `query`.
    fn data_match(t: &PriceTable, query: &str) -> Option<(String, String)> {
        match t.priced_as(query)? {
            PricedAs::Data(m) => Some((m.provider, m.model)),
            PricedAs::File(p) => panic!("{query} priced by the file as {}", p.name()),
        }
    }

    /// 2026-11-20, a day the bundled data has prices for.
    fn day() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_795_132_800)
    }

    fn usage(input: u64, cache_read: u64, cache_write: u64, output: u64) -> Usage {
        Usage {
            input,
            cache_read,
            cache_write,
            output,
        }
    }

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-9)
    }

    #[test]
    fn the_bundled_data_prices_the_pinned_clis_default_models() {
        let t = PriceTable::builtin();
        let m = 1_000_000;
        // (what the CLI reports, provider, model, $ for 1M in + 1M out)
        for (reported, provider, model, both) in [
            // Claude Code 2.1.197's default, also as its 1M-context form.
            ("claude-opus-4-8", "anthropic", "claude-opus-4-8", 30.0),
            ("claude-opus-4-8[1m]", "anthropic", "claude-opus-4-8", 30.0),
            // Codex 0.169's default.
            ("gpt-5.5", "openai", "gpt-5.5", 55.0),
            // Gemini CLI 0.61's `auto` resolves to this one, and its router calls the lite one.
            ("gemini-3.8-flash", "google", "gemini-3.8-flash", 4.5),
            (
                "gemini-3.5-flash-lite",
                "google",
                "gemini-3.5-flash-lite",
                2.8,
            ),
        ] {
            assert_eq!(
                data_match(&t, reported),
                Some((provider.to_owned(), model.to_owned())),
                "{reported}"
            );
            let cost = t.cost_at(reported, &usage(m, 0, 0, m), day());
            assert!(close(cost, both), "{reported}: {cost:?}");
        }
    }

    #[test]
    fn routing_prefixes_and_snapshots_find_the_providers_model() {
        let t = PriceTable::builtin();
        for (reported, provider, model) in [
            (
                "anthropic/claude-sonnet-4-5",
                "anthropic",
                "claude-sonnet-4-5",
            ),
            (
                "claude-sonnet-4-5-20250929",
                "anthropic",
                "claude-sonnet-4-5",
            ),
            ("openai/gpt-5.5", "openai", "gpt-5.5"),
            ("gpt-4o-mini-2024-07-18", "openai", "gpt-4o-mini"),
            ("models/gemini-3.8-flash", "google", "gemini-3.8-flash"),
            (
                "gemini/gemini-3.5-flash-lite",
                "google",
                "gemini-3.5-flash-lite",
            ),
            ("GPT-5.5", "openai", "gpt-5.5"),
            ("  gpt-5.5\n", "openai", "gpt-5.5"),
        ] {
            assert_eq!(
                data_match(&t, reported),
                Some((provider.to_owned(), model.to_owned())),
                "{reported}"
            );
        }
        for unknown in ["sg-test-model", "no-such-model-9", "", "   "] {
            assert_eq!(t.priced_as(unknown), None, "{unknown}");
            assert_eq!(t.cost(unknown, &usage(1, 0, 0, 1)), None, "{unknown}");
        }
    }

    #[test]
    fn context_length_tiers_follow_the_calls_input() {
        let t = PriceTable::builtin();
        // Claude Sonnet 4.5: $3 in / $15 out up to 200K input tokens, $6 / $22.50 past them.
        let short = t.cost_at("claude-sonnet-4-5", &usage(100_000, 0, 0, 10_000), day());
        assert!(close(short, 0.3 + 0.15), "{short:?}");
        let long = t.cost_at("claude-sonnet-4-5", &usage(300_000, 0, 0, 10_000), day());
        assert!(close(long, 1.8 + 0.225), "{long:?}");
    }

    #[test]
    fn cache_reads_and_writes_have_their_own_prices() {
        let t = PriceTable::builtin();
        let m = 1_000_000;
        // Claude Opus 4.8: $5 in, $0.50 cache read, $6.25 cache write.
        let cost = |u: Usage| t.cost_at("claude-opus-4-8", &u, day());
        assert!(close(cost(usage(m, 0, 0, 0)), 5.0));
        assert!(close(cost(usage(m, m, 0, 0)), 0.5));
        assert!(close(cost(usage(m, 0, m, 0)), 6.25));
        assert!(close(
            cost(usage(2 * m, m / 2, m / 2, 0)),
            5.0 + 0.25 + 3.125
        ));
        // More cached than input: all input cached, never below the counts.
        assert!(close(cost(usage(0, m, 0, 0)), 0.5));
    }

    #[test]
    fn prices_are_those_in_effect_on_the_day() {
        // Gemini 3.8 Flash's introductory rates end with 2026: $0.75 → $1.50 per million in.
        let t = PriceTable::builtin();
        let m = 1_000_000;
        let next_year = UNIX_EPOCH + Duration::from_secs(1_798_848_000); // 2027-01-02
        let model = "gemini-3.8-flash";
        assert!(close(t.cost_at(model, &usage(m, 0, 0, 0), day()), 0.75));
        assert!(close(t.cost_at(model, &usage(m, 0, 0, 0), next_year), 1.5));
    }

    #[test]
    fn the_bundled_data_has_a_date_and_a_source() {
        let t = PriceTable::builtin();
        assert_eq!(t.taken(), Some(crate::BUNDLED_TAKEN));
        let source = t.source().unwrap();
        assert!(
            source.contains("genai-prices") && source.contains(crate::GENAI_PRICES_VERSION),
            "{source}"
        );
        assert_eq!(t.models().len(), 0);
        let listed = t.data_models();
        assert!(listed.len() > 500, "{}", listed.len());
        // A million tokens of GPT-5.5 cross its long-context tier; the listing shows the base.
        let gpt = listed
            .iter()
            .find(|p| p.provider == "openai" && p.model == "gpt-5.5")
            .unwrap();
        assert_eq!(
            (gpt.input_per_mtok, gpt.output_per_mtok),
            (5.0, 30.0),
            "{gpt:?}"
        );
        assert_eq!(t.per_mtok("gpt-5.5"), Some([5.0, 30.0, 0.5, 5.0]));
        assert_eq!(t.per_mtok("no-such-model-9"), None);
        let opus = listed
            .iter()
            .find(|p| p.provider == "anthropic" && p.model == "claude-opus-4-8")
            .unwrap();
        assert_eq!(
            (opus.input_per_mtok, opus.output_per_mtok),
            (5.0, 25.0),
            "{opus:?}"
        );
        assert!((opus.cached_input_per_mtok - 0.5).abs() < 1e-9, "{opus:?}");
        assert!((opus.cache_write_per_mtok - 6.25).abs() < 1e-9, "{opus:?}");
    }

    #[test]
    fn the_workspace_pins_the_genai_prices_version_the_date_belongs_to() {
        let manifest = include_str!("../../../Cargo.toml");
        let pin = format!("genai-prices = \"={}\"", crate::GENAI_PRICES_VERSION);
        assert!(
            manifest.lines().any(|l| l.trim() == pin),
            "the root Cargo.toml must pin `{pin}`: bump BUNDLED_TAKEN with it"
        );
    }

    #[test]
    fn a_toml_model_wins_over_the_data() {
        let user = table(&entry("claude-opus-4-8", 1.0));
        let merged = user.merged_over(PriceTable::builtin());
        let m = 1_000_000;
        assert!(matches!(
            merged.priced_as("claude-opus-4-8-20261101"),
            Some(PricedAs::File(p)) if p.origin() == "test.toml"
        ));
        assert!(close(
            merged.cost("claude-opus-4-8", &usage(m, 0, 0, m)),
            2.0
        ));
        // Everything else is still genai-prices'.
        assert!(close(
            merged.cost_at("gpt-5.5", &usage(m, 0, 0, m), day()),
            55.0
        ));
        // The older date stands for the whole table.
        assert_eq!(merged.taken(), Some("2025-10-15"));
        assert!(merged.source().is_some());
    }

    #[test]
    fn a_file_without_a_date_keeps_the_datas() {
        let user = PriceTable::from_toml(&entry("x", 1.0), "u.toml").unwrap();
        assert_eq!(user.taken(), None);
        let merged = user.merged_over(PriceTable::builtin());
        assert_eq!(merged.taken(), Some(crate::BUNDLED_TAKEN));
    }

    const MINI_DATA: &str = r#"[{"id":"acme","name":"Acme","api_pattern":"https://api\\.acme\\.test",
        "model_match":{"starts_with":"acme-"},
        "models":[{"id":"acme-1","match":{"starts_with":"acme-1"},
                   "prices":{"input_mtok":1,"output_mtok":2,"cache_read_mtok":0.1}}]}]"#;

    #[test]
    fn genai_prices_json_replaces_the_bundled_data() {
        let user = PriceTable::from_genai_json(MINI_DATA, "data.json").unwrap();
        let merged = user.merged_over(PriceTable::builtin());
        let m = 1_000_000;
        assert!(close(merged.cost("acme-1-mini", &usage(m, 0, 0, m)), 3.0));
        assert_eq!(
            data_match(&merged, "acme-1"),
            Some(("acme".to_owned(), "acme-1".to_owned()))
        );
        // The bundled data is replaced whole, and its date with it.
        assert_eq!(merged.cost("gpt-5.5", &usage(m, 0, 0, m)), None);
        assert_eq!(merged.taken(), None);
        assert_eq!(merged.source().unwrap(), "genai-prices data from data.json");
        // TOML models still go on top of it.
        let toml = table(&entry("gpt-5.5", 1.0));
        let all = toml.merged_over(merged);
        assert!(close(all.cost("gpt-5.5", &usage(m, 0, 0, m)), 2.0));
        assert!(close(all.cost("acme-1", &usage(m, 0, 0, 0)), 1.0));
    }

    #[test]
    fn bad_genai_prices_json_names_the_file_and_the_fix() {
        for text in [
            "[",
            "{}",
            "[]",
            r#"[{"id":"acme"}]"#,
            r#"[{"id":"acme","name":"Acme","api_pattern":"x","models":[{"id":"m","match":{"equals":"m"},"prices":{"input_mtok":-1}}]}]"#,
        ] {
            let e = PriceTable::from_genai_json(text, "data.json").expect_err(text);
            let shown = e.to_string();
            assert!(matches!(e, PriceError::Data { .. }), "{text}: {shown}");
            assert_eq!(e.origin(), "data.json");
            assert!(
                shown.starts_with("data.json: not genai-prices' provider data (")
                    && shown.contains("TOML prices file"),
                "{text}: {shown}"
            );
        }
    }

    #[test]
    fn load_file_tells_json_from_toml() {
        let dir = std::env::temp_dir().join(format!("stepguard-prices-t-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let json = dir.join("prices.json");
        std::fs::write(&json, MINI_DATA).unwrap();
        let t = PriceTable::load_file(&json).unwrap();
        assert!(t.priced_as("acme-1").is_some());
        let bare = dir.join("data");
        std::fs::write(&bare, MINI_DATA).unwrap();
        assert!(
            PriceTable::load_file(&bare)
                .unwrap()
                .priced_as("acme-1")
                .is_some()
        );
        let toml_table_first = dir.join("mine");
        std::fs::write(&toml_table_first, entry("x", 1.0)).unwrap();
        let t = PriceTable::load_file(&toml_table_first).unwrap();
        assert_eq!(priced_as(&t, "x"), Some("x"));
        let toml_named_json = dir.join("oops.json");
        std::fs::write(&toml_named_json, entry("x", 1.0)).unwrap();
        let e = PriceTable::load_file(&toml_named_json).unwrap_err();
        assert!(matches!(e, PriceError::Data { .. }), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn lookup_is_case_insensitive_at_every_step() {
        let mixed = table(&entry("My-Model", 1.0));
        assert_eq!(priced_as(&mixed, "my-model"), Some("My-Model"));
        assert_eq!(priced_as(&mixed, "MY-MODEL-20250101"), Some("My-Model"));
        assert_eq!(priced_as(&mixed, "OpenAI/my-model"), Some("My-Model"));
    }

    #[test]
    fn a_shorter_listed_name_never_prices_a_longer_one() {
        let only_4o = table(&entry("gpt-4o", 2.5));
        assert_eq!(priced_as(&only_4o, "gpt-4o-mini"), None);
        assert_eq!(priced_as(&only_4o, "gpt-4o-mini-2024-07-18"), None);
        assert_eq!(priced_as(&only_4o, "openai/gpt-4o-mini"), None);
        assert_eq!(priced_as(&only_4o, "gpt-4o-2024-08-06"), Some("gpt-4o"));

        let only_4 = table(&entry("claude-sonnet-4", 3.0));
        assert_eq!(priced_as(&only_4, "claude-sonnet-4-5"), None);
        assert_eq!(
            priced_as(&only_4, "claude-sonnet-4-20250514"),
            Some("claude-sonnet-4")
        );
    }

    #[test]
    fn exact_names_win_over_normalised_ones() {
        let t = table(&format!(
            "{}{}{}",
            entry("gpt-4o", 2.5),
            entry("gpt-4o-2024-05-13", 5.0),
            entry("openai/gpt-4o", 9.0)
        ));
        assert_eq!(t.price("gpt-4o-2024-05-13").unwrap().input_per_mtok(), 5.0);
        assert_eq!(t.price("gpt-4o-2024-08-06").unwrap().input_per_mtok(), 2.5);
        assert_eq!(t.price("openai/gpt-4o").unwrap().input_per_mtok(), 9.0);
    }

    #[test]
    fn aliases_resolve_after_normalisation() {
        let t = table(&format!(
            "{}aliases = [\"sonnet-latest\"]\n",
            entry("claude-sonnet-4-5", 3.0)
        ));
        assert_eq!(priced_as(&t, "sonnet-latest"), Some("claude-sonnet-4-5"));
        assert_eq!(
            priced_as(&t, "anthropic/SONNET-LATEST"),
            Some("claude-sonnet-4-5")
        );
        assert_eq!(
            priced_as(&t, "sonnet-latest-20250929"),
            Some("claude-sonnet-4-5")
        );
    }

    #[test]
    fn a_later_file_overrides_an_earlier_one_model_by_model() {
        let base = table(&format!(
            "{}aliases = [\"four\"]\n{}",
            entry("claude-sonnet-4-0", 3.0),
            entry("gpt-4o", 2.5)
        ));
        // Without aliases the base's are kept.
        let merged = table(&entry("claude-sonnet-4-0", 2.0)).merged_over(base.clone());
        let p = merged.price("four").unwrap();
        assert_eq!((p.name(), p.input_per_mtok()), ("claude-sonnet-4-0", 2.0));
        assert_eq!(merged.price("gpt-4o"), base.price("gpt-4o"));
        // With aliases they are replaced.
        let user = table(&format!(
            "{}aliases = [\"sonnet-four\"]\n",
            entry("claude-sonnet-4-0", 2.0)
        ));
        let merged = user.merged_over(base.clone());
        assert_eq!(priced_as(&merged, "sonnet-four"), Some("claude-sonnet-4-0"));
        assert_eq!(priced_as(&merged, "four"), None);
        // A user alias naming a base model takes it over.
        let user = table(&format!("{}aliases = [\"gpt-4o\"]\n", entry("my-4o", 1.0)));
        let merged = user.merged_over(base);
        assert_eq!(priced_as(&merged, "gpt-4o-2024-08-06"), Some("my-4o"));
        assert!(merged.models().all(|p| p.name() != "gpt-4o"));
    }

    #[test]
    fn merging_over_an_empty_file_changes_no_price() {
        let empty = PriceTable::from_toml("taken = \"2030-01-01\"\n", "empty.toml").unwrap();
        let merged = empty.merged_over(PriceTable::builtin());
        // The newer date does not make the data look younger.
        assert_eq!(merged.taken(), Some(crate::BUNDLED_TAKEN));
        assert_eq!(merged.models().len(), 0);
        assert_eq!(merged.data, PriceTable::builtin().data);
    }

    #[test]
    fn models_are_listed_by_name() {
        let t = table(&format!("{}{}", entry("b", 1.0), entry("A", 1.0)));
        let names: Vec<_> = t.models().map(Price::name).collect();
        assert_eq!(names, ["A", "b"]);
    }
}
