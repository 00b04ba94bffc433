//! stepguard's step mapping for the codex CLI (filled in by the provider issue).
#![forbid(unsafe_code)]
