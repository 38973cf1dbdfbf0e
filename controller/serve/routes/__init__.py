"""The HTTP API's routes, one module per area, each an ``APIRouter`` that
:func:`controller.serve.api.create_app` includes: :mod:`~controller.serve.routes.runs` (start, list, read,
report, link, cancel a run), :mod:`~controller.serve.routes.trend` (change points across releases),
:mod:`~controller.serve.routes.fleet` (modules, reservations, power) and :mod:`~controller.serve.routes.public`
(what needs no bearer token: a signed report link). What they share comes through FastAPI dependencies on the
app's state (:mod:`~controller.serve.routes.common`); each route declares its role among its own dependencies
(:mod:`controller.serve.access`)."""
