"""The CLI's commands that are more than a call: train, eval, eval-labels, report."""
