"""specserve.workers.zoo."""
