"""``python -m controller``: the same as ``fleetctl``."""

from controller.cli.app import main

main()
