"""Measurements on a rank: the peak memory of a training step, the largest micro-batch that
fits, and the gradient noise scale.

Import rule: torch, `app.core`, `training` and `contract`. Never `checks`, `rank` or
`service`, never the web stack.
"""
