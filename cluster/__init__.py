"""specserve.cluster."""
