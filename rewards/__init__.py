"""memrl: rewards."""
