//! Token and cost budgets (`--max-tokens`, `--max-cost-usd`): resolution, enforcement through
//! the model gateway and the stream, the record.
