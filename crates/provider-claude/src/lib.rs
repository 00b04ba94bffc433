//! stepguard's step mapping for the claude CLI (filled in by the provider issue).
#![forbid(unsafe_code)]
