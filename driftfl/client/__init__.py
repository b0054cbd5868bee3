"""The ClientApp: local data, the one local-training loop and the pluggable objectives."""
