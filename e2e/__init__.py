"""sglang's own server with EAGLE speculative decoding on the CPU: float vs stock vs plugin."""
