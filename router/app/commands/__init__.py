"""The CLI's commands that are more than a call: train and promote, eval, eval-labels."""
