"""Decision -> reply: the one retry loop, the one place that calls providers, translation, accounting, timeouts."""
