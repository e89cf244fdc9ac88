"""Model integrations: transformers cache container, attention function, patching and loading."""
