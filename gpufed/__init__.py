"""gpufed: one self-service GPU cloud out of many GPU clusters.

This package is the composition root: the `gpufed` command, the embedded federation
(`gpufed up`) and logging set-up. The services live in `hub`, `spoke` and `burst`.
"""

__version__ = "0.1.0"
