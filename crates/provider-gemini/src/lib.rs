//! stepguard's step mapping for the gemini CLI (filled in by the provider issue).
#![forbid(unsafe_code)]
