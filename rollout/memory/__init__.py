"""Memory systems: SAM, the proactive agent, Mage, MemMA, AMA-Agent and the baselines, behind one interface."""
