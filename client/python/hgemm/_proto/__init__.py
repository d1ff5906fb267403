"""Generated from proto/hgemm.proto by client/python/gen_stubs.py; do not edit."""
