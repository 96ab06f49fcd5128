"""The HTTP edge of the query service: the FastAPI app, its routes, request parsing, middleware,
response bodies, the OpenAPI schema and the search page."""
