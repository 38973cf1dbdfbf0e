"""The simulated release's own programs (server, benchmark, workflow steps).

Standard library only; copied into the release tarball as ``scripts/ci/musa/m1000_sim/``.
Nothing here may import ``agent``, ``controller`` or ``simulator`` (imports are relative).
"""
