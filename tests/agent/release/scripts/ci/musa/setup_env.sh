# Hand-made stand-in, sourced: exports what later steps need.
echo "setting up env"
export FAKE_SETUP=1
export TILELANG_EXTRA_FLAGS="--opt 3 --with spaces"
export FAKE_SECRET_TOKEN="do-not-log-me"
