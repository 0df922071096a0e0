"""The web console at /console: server-rendered pages (Jinja2 + htmx, charts with Chart.js, both vendored
under static/vendor) for tenants and the operator, signed in with the same keys as the REST API.

`api/console/router.py` assembles the routes; the pages call the same registry functions and tenant checks
as the REST routes. See docs/console.md.
"""
