"""parquet shards to token-budget micro-batches."""
