"""data preparation and tiny/real proof targets."""
