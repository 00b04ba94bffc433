//! The one error type of the crate.

/// A failure to read or validate a prices file.
///
/// Every variant past [`PriceError::Read`] names the file (its *origin*, as given to
/// [`PriceTable::from_toml`](crate::PriceTable::from_toml)) and, where the problem is at a key,
/// the dotted key, e.g. `models."gpt-4.1".input_per_mtok`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PriceError {
    /// The file could not be read.
    #[error("failed to read prices file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("{origin}:{line}:{column}: invalid TOML: {message}")]
    Parse {
        /// The file.
        origin: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// A required key is absent.
    #[error("{origin}: {key}: missing; it is required")]
    Missing {
        /// The file.
        origin: String,
        /// The dotted key that should be there.
        key: String,
    },
    /// A key holds a value of the wrong type.
    #[error("{origin}: {key}: expected {expected}, found {found}")]
    WrongType {
        /// The file.
        origin: String,
        /// The dotted key.
        key: String,
        /// What the key takes, in words.
        expected: &'static str,
        /// What it holds, in words.
        found: &'static str,
    },
    /// A price is negative, NaN or infinite.
    #[error("{origin}: {key}: {value} is not a price; it must be a finite number, zero or more")]
    BadPrice {
        /// The file.
        origin: String,
        /// The dotted key.
        key: String,
        /// The value found.
        value: f64,
    },
    /// `taken` is not a date of the form `YYYY-MM-DD`.
    #[error("{origin}: {key}: `{value}` is not a date of the form YYYY-MM-DD")]
    BadDate {
        /// The file.
        origin: String,
        /// The dotted key.
        key: String,
        /// The value found.
        value: String,
    },
    /// A key the format does not have (often a typo).
    #[error("{origin}: {key}: unknown key; expected one of: {expected}")]
    UnknownKey {
        /// The file.
        origin: String,
        /// The dotted key.
        key: String,
        /// The keys allowed there, comma-separated.
        expected: String,
    },
    /// A model name or alias is empty or blank.
    #[error("{origin}: {key}: a model name or alias must not be empty")]
    EmptyName {
        /// The file.
        origin: String,
        /// The dotted key.
        key: String,
    },
    /// A JSON prices file is not genai-prices' provider data.
    #[error(
        "{origin}: not genai-prices' provider data ({message}); give the v2 `data.json` of \
         https://github.com/pydantic/genai-prices whole, or write a TOML prices file \
         (`stepguard prices` prints a template)"
    )]
    Data {
        /// The file.
        origin: String,
        /// What genai-prices said.
        message: String,
    },
    /// A model name or alias is already used in the file (compared case-insensitively), so a
    /// lookup of it would be ambiguous.
    #[error(
        "{origin}: {key}: `{name}` already names model `{other}` (names and aliases are compared \
         case-insensitively)"
    )]
    Duplicate {
        /// The file.
        origin: String,
        /// The dotted key of the second use.
        key: String,
        /// The name or alias used twice.
        name: String,
        /// The model the first use belongs to.
        other: String,
    },
}

impl PriceError {
    /// Returns the file the error is about (the path for [`PriceError::Read`]).
    pub fn origin(&self) -> &str {
        match self {
            PriceError::Read { path, .. } => path,
            PriceError::Parse { origin, .. }
            | PriceError::Missing { origin, .. }
            | PriceError::WrongType { origin, .. }
            | PriceError::BadPrice { origin, .. }
            | PriceError::BadDate { origin, .. }
            | PriceError::UnknownKey { origin, .. }
            | PriceError::EmptyName { origin, .. }
            | PriceError::Data { origin, .. }
            | PriceError::Duplicate { origin, .. } => origin,
        }
    }

    /// Returns the dotted key the error is about, when it is about one.
    pub fn key(&self) -> Option<&str> {
        match self {
            PriceError::Read { .. } | PriceError::Parse { .. } | PriceError::Data { .. } => None,
            PriceError::Missing { key, .. }
            | PriceError::WrongType { key, .. }
            | PriceError::BadPrice { key, .. }
            | PriceError::BadDate { key, .. }
            | PriceError::UnknownKey { key, .. }
            | PriceError::EmptyName { key, .. }
            | PriceError::Duplicate { key, .. } => Some(key),
        }
    }
}
