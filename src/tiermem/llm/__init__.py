"""Model protocols and adapters: embeddings (and, later, LLM engines). Optional extras."""
