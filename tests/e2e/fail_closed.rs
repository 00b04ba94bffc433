//! Fail closed and never hang: unrecognised streams, the pre-flight check, the prompt at the limit.
