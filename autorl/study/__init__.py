"""The study loop: propose, run, judge and record trials until the budget is spent (``controller``), and its parts.

A study is opened (``opening``), its trials planned into the budget (``plan``), prepared and closed as commits
(``attempts``), watched (``monitor``), judged (``judging``), their crashes acted on (``crash``), a reduced baseline
carried (``carry``), and what a stop leaves picked up again (``recovery``); ``clean`` removes a stopped study's refs.
"""
