"""The shared-memory segment between the engine's shim and the proxy, and its protocols.

One home for both sides of each: `layout` (the arithmetic), `segment` (create, open, map, remove),
`hostflag` (the round words over the C extension `_hostflag`, which nothing outside this package
imports), and one module per sub-protocol holding its writer and its reader: `stamped` (round t's
metadata and descriptor slots) and `resync` (the proxy's window request and the engine's staged
windows). shm_layout.md is the prose reference.
"""
