"""Closes the loop from the log back to the policy: signals and labels, training, offline evaluation."""
