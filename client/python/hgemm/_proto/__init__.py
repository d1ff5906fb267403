"""Generated from proto/hgemm.proto and proto/google/rpc by client/python/gen_stubs.py; do not
edit."""
