"""tau evaluation and speculative decoding."""
