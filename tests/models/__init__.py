"""Loading models and pairs, presets, GGUF and MTP imports, drafter heads, prompt-cache files,
training heads, damaged and hostile inputs."""
