"""The run stage as a service: an OpenAI-compatible HTTP server over one engine (docs/serve.md)."""
