"""Promotion: the best confirmed recipe re-validated with fresh seeds (``promotion``), then its detached full run
(``fullrun``) with its checkpoints evaluated as they appear (``ckpt_evals``)."""
