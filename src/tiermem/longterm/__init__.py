"""Long-term user memory: typed records with retention, importance, provenance and
supersession; auto-detection from turns; hybrid recall; user context; forgetting."""
