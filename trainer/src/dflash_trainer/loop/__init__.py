"""the training loop and its state."""
