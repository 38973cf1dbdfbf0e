"""The contract between agents and the controller, imported by name on both sides.

``records`` (typed, frozen, versioned wire and storage records), ``kv`` (the key layout on
the result backend: heartbeats, progress, rows, cancel flags), ``celery_app`` (the one
Celery app, JSON only) with its hardened ``safe_transport``, ``settings`` (the broker
settings both sides must agree on), and ``vocab`` (the names both sides use with one
meaning: the run id check, the probe's disagreements, clock-event reasons, the shape of a
metric). It imports neither ``agent`` nor ``controller``, and only the agent's own
dependencies: an agent installed on a module carries it.
"""
