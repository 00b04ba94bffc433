//! Provider options and configuration checks agree across `config`, `validate`, `run` and `count`.
