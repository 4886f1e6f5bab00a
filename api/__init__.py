"""pdplan's REST API: FastAPI routers over ``calculator.service`` (``create_app`` builds the app)."""

from .app import app, create_app

__all__ = ["app", "create_app"]
