"""Load testing of token streams: SSE to OpenAI-compatible endpoints, TTFT/ITL/TPOT objectives."""
