"""Cloud burst: turns demand the hub cannot place into cloud instances, and releases them.

`burst.core` decides (pure); `burst.providers` act on clouds; `burst.catalog` says what can be
bought at what price.
"""
