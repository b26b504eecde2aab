"""The operator's dashboard, served by the router itself at ``/ui``."""

from router.ui.routes import Dashboard

__all__ = ["Dashboard"]
