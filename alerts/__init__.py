"""fastllm alerts package."""
