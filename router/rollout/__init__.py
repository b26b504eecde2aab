"""Putting a policy into service and watching it: promote (and publish), rollback, preview, arms,
guard (a policy change tried, compared, rolled back)."""
