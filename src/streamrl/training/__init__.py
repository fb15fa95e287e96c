"""``streamrl.training``: learners, the loop, checkpoints, SFT, evaluation, comparisons.

The synchronous entry point is the function ``streamrl.train`` (``streamrl.api.train``).
"""
