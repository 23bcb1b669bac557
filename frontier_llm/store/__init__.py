"""The results database: schema, trace ingestion, queries that return DataFrames."""
