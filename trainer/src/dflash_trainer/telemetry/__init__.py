"""heartbeat, metrics/profile/NVML writers, W&B."""
