"""`router eval`: offline evaluation of the learned policy on recorded coding-agent outcomes."""
