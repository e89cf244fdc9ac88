"""Model integrations: transformers cache container, attention function and patching."""
