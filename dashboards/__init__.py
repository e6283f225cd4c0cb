"""fastllm dashboards package."""
