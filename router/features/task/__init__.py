"""Which task a request belongs to, what the router remembers of it, and its feature vector."""
