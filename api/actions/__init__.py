"""The action layer: what the API does, with typed arguments (the tenant row or ids, the pydantic bodies, the
Services, the DB session) and typed results (the API schemas), and no Request. The REST routes (api/routes/)
wrap an action in auth dependencies and HTTP concerns (status codes, headers, streaming); the web console
(api/console/) calls the same actions, so both apply the same validation, rate limits and cache invalidation.
"""
