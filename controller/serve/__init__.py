"""``fleetctl serve``: the daemon (:mod:`.daemon`), its HTTP API (:mod:`.api`, :mod:`.guard`), /metrics."""
