//! Rough edges a new user hits: error messages, input checking, first run, completions, colour.
