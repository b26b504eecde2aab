"""The operator's dashboard, served by the router itself at ``/ui``."""

from router.ui.routes import register_ui

__all__ = ["register_ui"]
