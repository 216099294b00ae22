"""Backends run one trial each, behind the small protocol in ``base`` (the ``Backend`` class, ``TrialSpec``,
``LaunchPlan``, ``RunHandle``; ``registry`` is the one list of them).

Only modules in this package import ray, trl or openrlhf, and only lazily. This package's face imports nothing:
``autorl.backends.openrlhf.jobprobe`` and ``autorl.backends.openrlhf.vllm_share`` run on a cluster's bare Python
and in every Ray worker of a packed job, where nothing but the standard library may be assumed.
"""
