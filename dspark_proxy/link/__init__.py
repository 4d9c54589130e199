"""The link to the worker: what a round hands its rows to and gets drafts back from.

`draft_client.DraftClient` is the interface the round sees; `client.TcpDraftClient` is one worker over
TCP (connect, handshake, deadline-bounded steps), and `conn` frames the stream for both ends (the
worker's server reads and writes through it too). A pool of workers behind one `DraftClient` lives
beside this package, in `dspark_proxy/pool/`; the worker in the proxy's own process (`--worker inproc`,
`null`) is the worker's, `dspark_proxy/worker/inproc.py`. The bytes on the wire are
`dspark_proxy/wire/`'s (sans-IO).
"""
