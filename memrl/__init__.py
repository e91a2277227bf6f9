"""memrl: reinforcement learning for the memory models of long-horizon agents.

The design card's top-level folders install as one namespace: ``memrl.data``, ``memrl.rollout``, ``memrl.rewards``,
``memrl.train``, ``memrl.launch`` and the shipped recipes ``memrl.configs``. Imports flow one way,
data <- rollout <- rewards <- train <- launch (checked by import-linter in the test command).
"""

__version__ = "0.1.0"
