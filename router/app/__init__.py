"""Assembly and process: settings, the factory that builds every collaborator, lifespan, ASGI entry, serve, CLI, demo."""
