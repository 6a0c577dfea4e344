"""lego-proxy's FastAPI service: adapters, pipeline, backend client, control API."""
