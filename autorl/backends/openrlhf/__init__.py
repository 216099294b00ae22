"""The OpenRLHF backend: ``train_ppo_ray`` as a Ray job (``backend``), its flag dialects (``flags``), its metrics
(``metrics``), the patches autorl applies to it (``patches``) and the checks before a launch (``preflight``)."""
