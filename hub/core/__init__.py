"""The hub's pure core: placement, policy and the workload lifecycle, decisions as data.

No I/O, no clock, no random ids: time and ids are passed in, same input gives the same plan.
"""
