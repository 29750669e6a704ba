"""specserve.proto."""
