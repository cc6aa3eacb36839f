"""torchrun: world, transports, queue, ranks."""
