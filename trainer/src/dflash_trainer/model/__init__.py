"""the drafter, the frozen target and the attention pieces."""
