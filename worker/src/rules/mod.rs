//! Sync rules: the YAML front end, the SQL subset compiler and the row evaluator.
