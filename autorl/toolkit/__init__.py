"""The GRPO toolkit every engine shares: tasks (``task``), rewards (``reward``), policies (``model``), the per-item
eval metrics (``peritem``) and a live policy's evaluation (``policy_eval``), the built-in model's supervised warm-up
(``warmup``) and its Hugging Face twin (``hf_tiny``).

The embedded trainer (``autorl.engine``), the TRL runner, the checkpoint evaluator (``autorl.evaluate``) and the
OpenRLHF small model all import these; none of them imports another engine. Importing this package loads no torch.
"""
