"""The contract between client and device: wire schema, ACL codes, errors, kernel ABI.

Both simnpu.client and simnpu.server import from here; this package imports neither,
and nothing here imports grpc.
"""
