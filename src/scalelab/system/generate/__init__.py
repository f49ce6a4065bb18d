"""Token generation: a continuous-batching engine over a paged KV cache, prefix caching,
speculative decoding, and an OpenAI-compatible streaming API (docs/generate.md)."""
