"""SQL analysis and rewriting: pure functions over sqlglot expressions. Nothing here runs SQL,
draws noise or reads a budget."""
