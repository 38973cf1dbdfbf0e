"""Programs of the real-engine release (copied into the tarball as ``scripts/ci/musa/m1000_engine``)."""
