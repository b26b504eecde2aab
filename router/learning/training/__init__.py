"""Training the learned policy from the log: dataset, fitting, off-policy evaluation, artifact."""
