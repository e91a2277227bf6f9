"""memrl: train."""
