"""specserve.router."""
