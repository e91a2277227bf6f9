"""memrl: launch."""
