"""``fleetctl``, the controller's command line: one module per verb group (entry point: :mod:`controller.cli.app`)."""
