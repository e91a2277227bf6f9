"""memrl: rollout."""
