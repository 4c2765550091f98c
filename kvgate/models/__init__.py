"""Model files: the registry of servable models and their verified fetch (`registry`), and the
converted-model cache that makes later starts skip the GGUF parse (`cache`)."""
