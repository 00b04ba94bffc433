//! The price table: the shipped one, user files, merging and lookup.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::LazyLock;

use crate::name::{fold, strip_provider, strip_snapshot};
use crate::{Price, PriceError};

/// The text of the shipped price table, `prices.toml` (a template for a user's file).
pub const BUILTIN_TOML: &str = include_str!("../prices.toml");

/// The origin of the prices of the shipped table, as [`Price::origin`] reports it.
pub const BUILTIN_ORIGIN: &str = "<builtin prices.toml>";

static BUILTIN: LazyLock<PriceTable> = LazyLock::new(|| {
    PriceTable::from_toml(BUILTIN_TOML, BUILTIN_ORIGIN)
        .expect("the shipped prices.toml is valid (checked by its unit test)")
});

/// Model prices, looked up by the model name an agent reports.
#[derive(Clone, Debug, PartialEq)]
pub struct PriceTable {
    /// The oldest `taken` date of the files merged into the table.
    pub(crate) taken: String,
    /// Folded (trimmed, lowercase) model name → price.
    pub(crate) models: BTreeMap<String, Price>,
    /// Folded alias → folded model name.
    pub(crate) index: BTreeMap<String, String>,
}

impl PriceTable {
    /// Returns the shipped price table (see [`PriceTable::taken`] for its age).
    pub fn builtin() -> PriceTable {
        BUILTIN.clone()
    }

    /// Parses a prices file's text. `origin` names the file in errors and in
    /// [`Price::origin`].
    ///
    /// Every problem is an error naming `origin` and the dotted key: invalid TOML (with line
    /// and column), a missing or malformed `taken`, a model without `input_per_mtok` or
    /// `output_per_mtok`, a price that is negative, NaN or infinite, a value of the wrong type,
    /// an unknown key, and a name or alias used twice (case-insensitively).
    pub fn from_toml(text: &str, origin: &str) -> Result<PriceTable, PriceError> {
        crate::parse::parse(text, origin)
    }

    /// Reads and parses a prices file; the crate's one I/O function.
    pub fn load_file(path: impl AsRef<Path>) -> Result<PriceTable, PriceError> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| PriceError::Read {
            path: shown.clone(),
            source,
        })?;
        PriceTable::from_toml(&text, &shown)
    }

    /// Returns this table laid over `base`, model by model: a model of this table replaces the
    /// model of the same name in `base` whole (its prices, cached price and source), keeping
    /// `base`'s aliases only when this table's entry gives no `aliases`.
    ///
    /// A name or alias of this table that `base` uses for another model now means this table's
    /// model: a base model so named is dropped, a base alias so spelled is removed. The result's
    /// [`PriceTable::taken`] is the older of the two dates.
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
        PriceTable {
            taken: self.taken.min(base.taken),
            models: base_models,
            index,
        }
    }

    /// Returns the price of `model`, as an agent or API reports it, or `None` when the table
    /// has no price for that model.
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

    /// Returns the date (`YYYY-MM-DD`) the prices were taken; for a merged table, the oldest
    /// date of its files. Each [`Price::taken`] has its own file's date.
    pub fn taken(&self) -> &str {
        &self.taken
    }

    /// Returns the models of the table, ordered by name.
    pub fn models(&self) -> impl ExactSizeIterator<Item = &Price> {
        self.models.values()
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
    use super::*;

    fn table(models: &str) -> PriceTable {
        PriceTable::from_toml(&format!("taken = \"2025-10-15\"\n{models}"), "test.toml").unwrap()
    }

    fn entry(name: &str, input: f64) -> String {
        format!("[models.\"{name}\"]\ninput_per_mtok = {input:?}\noutput_per_mtok = 1.0\n")
    }

    /// Returns the name of the model `query` is priced as, if any.
    fn priced_as<'t>(t: &'t PriceTable, query: &str) -> Option<&'t str> {
        t.price(query).map(Price::name)
    }

    #[test]
    fn the_shipped_table_parses_and_every_model_has_a_source() {
        let t = PriceTable::builtin();
        assert!(t.models().len() >= 20);
        assert_eq!(t.taken(), "2025-10-15");
        for p in t.models() {
            let source = p
                .source()
                .unwrap_or_else(|| panic!("{} has no source", p.name()));
            assert!(source.starts_with("https://"), "{}: {source}", p.name());
            assert!(
                p.input_per_mtok() > 0.0 && p.output_per_mtok() > 0.0,
                "{}",
                p.name()
            );
            if let Some(cached) = p.cached_input_per_mtok() {
                assert!(cached < p.input_per_mtok(), "{}", p.name());
            }
            assert_eq!(p.origin(), BUILTIN_ORIGIN);
            assert_eq!(p.taken(), t.taken());
        }
    }

    #[test]
    fn the_shipped_table_has_the_main_models() {
        let t = PriceTable::builtin();
        for model in [
            "claude-opus-4-1",
            "claude-opus-4-0",
            "claude-sonnet-4-5",
            "claude-sonnet-4-0",
            "claude-haiku-4-5",
            "claude-3-5-haiku",
            "gpt-4o",
            "gpt-4o-mini",
            "gpt-4.1",
            "gpt-5",
            "gpt-5-mini",
            "gpt-5-codex",
            "codex-mini-latest",
            "o3",
            "o4-mini",
            "gemini-2.5-pro",
            "gemini-2.5-flash",
            "gemini-2.5-flash-lite",
        ] {
            assert_eq!(priced_as(&t, model), Some(model));
        }
    }

    #[test]
    fn the_shipped_table_prices_what_agents_report() {
        let t = PriceTable::builtin();
        for (reported, name) in [
            // Claude Code and the Anthropic API report dated snapshots.
            ("claude-opus-4-1-20250805", "claude-opus-4-1"),
            ("claude-opus-4-20250514", "claude-opus-4-0"),
            ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
            ("claude-sonnet-4-20250514", "claude-sonnet-4-0"),
            ("claude-haiku-4-5-20251001", "claude-haiku-4-5"),
            ("claude-3-5-haiku-20241022", "claude-3-5-haiku"),
            ("claude-3-5-haiku-latest", "claude-3-5-haiku"),
            ("claude-3-7-sonnet-20250219", "claude-3-7-sonnet"),
            ("claude-sonnet-4-5@20250929", "claude-sonnet-4-5"),
            ("anthropic/claude-sonnet-4.5", "claude-sonnet-4-5"),
            ("anthropic/claude-opus-4.1", "claude-opus-4-1"),
            // OpenAI reports dated snapshots too.
            ("gpt-4o-2024-08-06", "gpt-4o"),
            ("gpt-4o-2024-11-20", "gpt-4o"),
            ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
            ("gpt-4.1-2025-04-14", "gpt-4.1"),
            ("gpt-5-2025-08-07", "gpt-5"),
            ("gpt-5-mini-2025-08-07", "gpt-5-mini"),
            ("o3-2025-04-16", "o3"),
            ("o4-mini-2025-04-16", "o4-mini"),
            ("openai/gpt-5-codex", "gpt-5-codex"),
            // Gemini's API says models/…, routers say google/… or gemini/….
            ("models/gemini-2.5-pro", "gemini-2.5-pro"),
            ("google/gemini-2.5-flash", "gemini-2.5-flash"),
            ("gemini/gemini-2.5-flash-lite", "gemini-2.5-flash-lite"),
        ] {
            assert_eq!(priced_as(&t, reported), Some(name), "{reported}");
        }
    }

    #[test]
    fn the_shipped_table_keeps_similar_names_apart() {
        let t = PriceTable::builtin();
        // A snapshot listed on its own wins over its stripped name.
        assert_eq!(
            priced_as(&t, "gpt-4o-2024-05-13"),
            Some("gpt-4o-2024-05-13")
        );
        assert_eq!(t.price("gpt-4o-2024-05-13").unwrap().input_per_mtok(), 5.0);
        assert_eq!(t.price("gpt-4o-2024-08-06").unwrap().input_per_mtok(), 2.5);
        for (a, b) in [
            ("gpt-4o", "gpt-4o-mini"),
            ("gpt-5", "gpt-5-mini"),
            ("gpt-5", "gpt-5-codex"),
            ("gpt-4.1", "gpt-4.1-mini"),
            ("o3", "o3-mini"),
            ("claude-sonnet-4-0", "claude-sonnet-4-5"),
            ("claude-opus-4-0", "claude-opus-4-1"),
            ("gemini-2.5-flash", "gemini-2.5-flash-lite"),
        ] {
            assert_eq!(priced_as(&t, a), Some(a));
            assert_eq!(priced_as(&t, b), Some(b));
        }
        for unknown in [
            "claude-sonnet-4-6",
            "claude-sonnet",
            "claude",
            "gpt-5-pro",
            "gpt-4o-audio-preview",
            "chatgpt-4o-latest",
            "ft:gpt-4o-2024-08-06:acme::abc123",
            "azure/gpt-4o",
            "gemini-2.5-pro-preview-06-05",
            "gemini-2.5-flash-preview-09-2025",
            "o3-pro",
            "",
        ] {
            assert_eq!(priced_as(&t, unknown), None, "{unknown}");
        }
    }

    #[test]
    fn lookup_is_case_insensitive_at_every_step() {
        let t = PriceTable::builtin();
        assert_eq!(priced_as(&t, "GPT-4o"), Some("gpt-4o"));
        assert_eq!(
            priced_as(&t, "Claude-Sonnet-4-5"),
            Some("claude-sonnet-4-5")
        );
        assert_eq!(priced_as(&t, "OpenAI/GPT-4O-2024-08-06"), Some("gpt-4o"));
        assert_eq!(
            priced_as(&t, "Anthropic/Claude-Sonnet-4.5"),
            Some("claude-sonnet-4-5")
        );
        assert_eq!(priced_as(&t, "  gpt-4o\n"), Some("gpt-4o"));

        let mixed = table(&entry("My-Model", 1.0));
        assert_eq!(priced_as(&mixed, "my-model"), Some("My-Model"));
        assert_eq!(priced_as(&mixed, "MY-MODEL-20250101"), Some("My-Model"));
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
        assert_eq!(priced_as(&only_4, "claude-sonnet-4-5-20250929"), None);
        assert_eq!(
            priced_as(&only_4, "claude-sonnet-4-20250514"),
            Some("claude-sonnet-4")
        );

        let only_4_5 = table(&entry("claude-sonnet-4-5", 3.0));
        assert_eq!(priced_as(&only_4_5, "claude-sonnet-4"), None);
        assert_eq!(priced_as(&only_4_5, "claude-sonnet-4-20250514"), None);
        assert_eq!(
            priced_as(&only_4_5, "claude-sonnet-4-5-20250929"),
            Some("claude-sonnet-4-5")
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
        assert_eq!(
            t.price("openai/gpt-4o-2024-05-13")
                .unwrap()
                .input_per_mtok(),
            5.0
        );
    }

    #[test]
    fn versioned_suffixes_are_stripped() {
        let t = table(&entry("gemini-2.0-flash", 0.1));
        assert_eq!(
            priced_as(&t, "gemini-2.0-flash-001"),
            Some("gemini-2.0-flash")
        );
        assert_eq!(
            priced_as(&t, "models/gemini-2.0-flash-001"),
            Some("gemini-2.0-flash")
        );
        assert_eq!(priced_as(&t, "gemini-2.0-flash-lite-001"), None);
        assert_eq!(priced_as(&t, "gemini-2.0-flash-01"), None);
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
        assert_eq!(
            t.price("sonnet-latest").unwrap().aliases(),
            ["sonnet-latest"]
        );
    }

    #[test]
    fn a_user_file_overrides_model_by_model() {
        let user = PriceTable::from_toml(
            "taken = \"2026-01-20\"\n\
             [models.gpt-4o]\ninput_per_mtok = 2.0\noutput_per_mtok = 9.0\n\
             [models.my-model]\ninput_per_mtok = 1.0\noutput_per_mtok = 2.0\n",
            "user.toml",
        )
        .unwrap();
        let base = PriceTable::builtin();
        let merged = user.merged_over(base.clone());

        let gpt4o = merged.price("gpt-4o-2024-08-06").unwrap();
        assert_eq!(
            (gpt4o.input_per_mtok(), gpt4o.output_per_mtok()),
            (2.0, 9.0)
        );
        // Replaced whole: the shipped cached price and source are gone.
        assert_eq!(gpt4o.cached_input_per_mtok(), None);
        assert_eq!(gpt4o.source(), None);
        assert_eq!((gpt4o.origin(), gpt4o.taken()), ("user.toml", "2026-01-20"));

        assert_eq!(merged.price("my-model").unwrap().cost(1_000_000, 0, 0), 1.0);
        // Everything else is the shipped table's.
        assert_eq!(merged.price("gpt-4o-mini"), base.price("gpt-4o-mini"));
        assert_eq!(
            merged.price("claude-sonnet-4-5"),
            base.price("claude-sonnet-4-5")
        );
        assert_eq!(merged.models().len(), base.models().len() + 1);
        // The older date stands for the whole table.
        assert_eq!(merged.taken(), "2025-10-15");
    }

    #[test]
    fn the_merged_date_is_the_older_one() {
        let old = PriceTable::from_toml("taken = \"2024-01-01\"\n", "old.toml").unwrap();
        assert_eq!(old.merged_over(PriceTable::builtin()).taken(), "2024-01-01");
        let new = PriceTable::from_toml("taken = \"2030-01-01\"\n", "new.toml").unwrap();
        assert_eq!(new.merged_over(PriceTable::builtin()).taken(), "2025-10-15");
    }

    #[test]
    fn an_override_without_aliases_keeps_the_shipped_ones() {
        let user = table(&entry("claude-sonnet-4-0", 2.0));
        let merged = user.merged_over(PriceTable::builtin());
        let p = merged.price("claude-sonnet-4-20250514").unwrap();
        assert_eq!((p.name(), p.input_per_mtok()), ("claude-sonnet-4-0", 2.0));
        assert_eq!(p.aliases(), ["claude-sonnet-4"]);
    }

    #[test]
    fn an_override_with_aliases_replaces_them() {
        let user = table(&format!(
            "{}aliases = [\"sonnet-four\"]\n",
            entry("claude-sonnet-4-0", 2.0)
        ));
        let merged = user.merged_over(PriceTable::builtin());
        assert_eq!(priced_as(&merged, "sonnet-four"), Some("claude-sonnet-4-0"));
        assert_eq!(priced_as(&merged, "claude-sonnet-4"), None);
        assert_eq!(priced_as(&merged, "claude-sonnet-4-20250514"), None);
    }

    #[test]
    fn a_user_name_or_alias_takes_over_a_shipped_one() {
        // The user's alias names the shipped model `gpt-4o`: the name now means theirs.
        let user = table(&format!("{}aliases = [\"gpt-4o\"]\n", entry("my-4o", 1.0)));
        let merged = user.merged_over(PriceTable::builtin());
        assert_eq!(priced_as(&merged, "gpt-4o"), Some("my-4o"));
        assert_eq!(priced_as(&merged, "gpt-4o-2024-08-06"), Some("my-4o"));
        assert!(merged.models().all(|p| p.name() != "gpt-4o"));

        // The user's model is named like a shipped alias: the alias leaves the shipped model.
        let user = table(&entry("claude-sonnet-4.5", 4.0));
        let merged = user.merged_over(PriceTable::builtin());
        assert_eq!(
            priced_as(&merged, "claude-sonnet-4.5"),
            Some("claude-sonnet-4.5")
        );
        assert_eq!(
            priced_as(&merged, "claude-sonnet-4-5"),
            Some("claude-sonnet-4-5")
        );
        assert!(
            merged
                .price("claude-sonnet-4-5")
                .unwrap()
                .aliases()
                .is_empty()
        );

        // A kept shipped alias that the user's file uses elsewhere is not kept.
        let user = table(&format!(
            "{}{}",
            entry("claude-sonnet-4-0", 2.0),
            entry("claude-sonnet-4", 9.0)
        ));
        let merged = user.merged_over(PriceTable::builtin());
        assert_eq!(
            merged.price("claude-sonnet-4").unwrap().input_per_mtok(),
            9.0
        );
        assert_eq!(
            merged.price("claude-sonnet-4-0").unwrap().input_per_mtok(),
            2.0
        );
        assert!(
            merged
                .price("claude-sonnet-4-0")
                .unwrap()
                .aliases()
                .is_empty()
        );
    }

    #[test]
    fn merging_over_an_empty_file_changes_no_price() {
        let empty = PriceTable::from_toml("taken = \"2030-01-01\"\n", "empty.toml").unwrap();
        assert_eq!(
            empty.merged_over(PriceTable::builtin()),
            PriceTable::builtin()
        );
    }

    #[test]
    fn models_are_listed_by_name() {
        let t = table(&format!("{}{}", entry("b", 1.0), entry("A", 1.0)));
        let names: Vec<_> = t.models().map(Price::name).collect();
        assert_eq!(names, ["A", "b"]);
    }
}
