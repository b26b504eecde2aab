"""Putting a learned policy into service and watching it: arms, guard (and its rollback), preview."""
