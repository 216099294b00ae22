"""The embedded GRPO engine. Runs as a child process: ``python -m autorl.engine``.

Importing this package is cheap: torch is imported by ``autorl.engine.grpo`` only,
so the controller can read ``autorl.engine.config`` without loading torch.
"""
