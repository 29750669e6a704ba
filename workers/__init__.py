"""specserve.workers."""
