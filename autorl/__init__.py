"""autorl: autonomous, commit-scoped hyperparameter and recipe search for GRPO.

Light on purpose: importing autorl loads neither torch nor optuna.
"""

__version__ = "0.1.0"
