"""Benchmarks: the proxy under load next to the upstream and LiteLLM's proxy, and the routing hot path.

``python -m benchmarks.run`` (``make bench``) prints the side-by-side table; ``python -m
benchmarks.routing`` times features + decision per stage; ``python -m benchmarks.profile``
samples the router under load with py-spy and names its hot spots.
"""
