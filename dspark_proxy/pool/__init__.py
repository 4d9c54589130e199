"""A pool of draft workers behind one `DraftClient` (docs/deploy.md, "A pool of workers").

`addresses` reads the `--worker` list (several addresses, or a file of them re-read on SIGHUP);
`route` spreads slots over the workers by rendezvous hashing and keeps who owns each; `member` is one
worker's link, breaker and row cap with its state machine; `client.PoolClient` sends a round's STEPs to
the workers at once and merges what came back.
"""
