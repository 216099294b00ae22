"""One run, whatever asked for it: opened as a commit, launched on a backend, watched, closed (``lifecycle``,
``watch``), run side by side in slots (``slots``), or alone as ``autorl train`` (``train``)."""
