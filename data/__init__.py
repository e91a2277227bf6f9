"""memrl: data."""
