"""The edges and the gate: proxied endpoints, ops endpoints, outcomes, auth, keys, admission."""
