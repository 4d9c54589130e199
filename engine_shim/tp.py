"""Tensor-parallel engines: rank 0 reads the reply, every rank needs it (docs/engine.md, "The calls").

The reply travels over the engine's own `torch.distributed` group, not through anything of ours: one
broadcast of one packed int32 tensor per round (a broadcast costs a latency per call, so per-field
calls would pay it five or eight times). The payload is the reply page's own layout
(shm.layout.ReplyPageLayout) behind a small header, sized for max_reqs so every rank knows its size
before it knows n:

    header[16] = [MAGIC, t_lo, t_hi, status, n, has_sample, reason_len, 0, reason bytes (32)]
    page       = [status, n, n_drafts[M], drafts[M*N], conf_bits[M*N]
                  (, sample_mask[M], support_ids[M*N*32], q_bits[M*N*32] when sampled)]

Only the first n entries of each field are written and read. The buffers are kept per (size,
device) and reused, so the arrays of a returned Reply are views, valid until the next call (the
same rule as Shim.read_reply). On an NCCL group the tensor goes through the current CUDA device.

Thread ownership: the engine thread that runs the rounds, on every rank.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from dspark_proxy.shm.layout import STATUS_NAMES, STATUS_ROUND_FAILED, SUPPORT_K, ReplyPageLayout

from .reply import Reply, ReplyReader

__all__ = ["broadcast_reply", "payload_words", "tp_round", "RoundReply"]

_MAGIC = 0x52505354  # "TSPR": a buffer that is not ours (a mismatched call on another rank) shows
_HDR = 16
_REASON_BYTES = 32  # header words 8..15
_buffers: dict[tuple[int, int, bool, str], _Buffers] = {}


def payload_words(max_reqs: int, num_spec: int, sampled: bool = False) -> int:
    """Size in int32 words of the tensor one broadcast moves."""
    return _HDR + ReplyPageLayout(max_reqs, num_spec, sampled).size


class _Buffers:
    """The packed tensor (on the group's device) and, for CUDA, its pinned host twin."""

    def __init__(self, M: int, N: int, sampled: bool, device: Any) -> None:
        import torch

        self.L = ReplyPageLayout(M, N, sampled)
        size = _HDR + self.L.size
        cuda = torch.device(device).type == "cuda"
        self.host = torch.zeros(size, dtype=torch.int32, pin_memory=cuda)
        self.dev = torch.zeros(size, dtype=torch.int32, device=device) if cuda else self.host
        self.a = self.host.numpy()
        self.hdr = self.a[:_HDR]
        self.page = self.a[_HDR:]
        self.ok = np.zeros(M, np.bool_)
        self.smask = np.zeros(M, np.bool_)
        self.failed = ReplyReader(self.L).failed  # a failed round reads exactly as the shim's


def _np(x: Any, dtype: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype)


def _pack(b: _Buffers, reply: Reply) -> str | None:
    """Write `reply` into b; returns why it is unusable (then a failed round is packed instead)."""
    L, M, N = b.L, b.L.M, b.L.N
    n = int(reply.n)
    why = None
    if not 0 <= n <= M:
        why = f"n={n} outside [0, max_reqs={M}]"
    elif int(reply.status) not in STATUS_NAMES:
        why = f"status={reply.status} is not a reply status"
    hdr, page = b.hdr, b.page
    hdr[:] = 0
    hdr[0] = _MAGIC
    hdr.view(np.uint32)[1:3] = (int(reply.t) & 0xFFFFFFFF, (int(reply.t) >> 32) & 0xFFFFFFFF)
    reason = (reply.reason or "").encode()[:_REASON_BYTES]
    hdr[6] = len(reason)
    hdr[8:] = np.frombuffer(reason.ljust(_REASON_BYTES, b"\0"), dtype="<i4")
    if why is None and int(reply.status) != STATUS_ROUND_FAILED:
        try:
            nd = getattr(reply, "n_drafts", None)  # a Reply always has it; a look-alike may not
            page[L.o_ok:L.o_ok + n] = (_np(reply.ok_mask, np.bool_).reshape(n) if nd is None
                                       else np.clip(_np(nd, np.int32).reshape(n), 0, N))
            page[L.o_ids:L.o_ids + n * N] = _np(reply.draft_ids, np.int32).reshape(n * N)
            page[L.o_conf:L.o_conf + n * N] = _np(reply.confidence, np.float32).reshape(n * N).view(np.int32)
            if L.sampled and reply.sample_mask is not None:
                K = SUPPORT_K
                page[L.o_sample_mask:L.o_sample_mask + n] = _np(reply.sample_mask, np.bool_).reshape(n)
                page[L.o_qids:L.o_qids + n * N * K] = _np(reply.support_ids, np.int32).reshape(n * N * K)
                page[L.o_q:L.o_q + n * N * K] = _np(reply.proposal_q, np.float32).reshape(n * N * K).view(np.int32)
                hdr[5] = 1
        except (ValueError, TypeError) as e:
            why = f"reply arrays do not match n={n}, num_spec={N}: {e}"
    if why is not None:
        hdr[5] = 0
        page[0], page[1] = STATUS_ROUND_FAILED, min(max(n, 0), M)
        return why
    page[0], page[1] = int(reply.status), n
    if int(reply.status) == STATUS_ROUND_FAILED:
        page[L.o_ok:L.o_ok + n] = 0
    return None


def _unpack(b: _Buffers) -> Reply:
    L, N = b.L, b.L.N
    hdr, page = b.hdr, b.page
    if int(hdr[0]) != _MAGIC:
        raise RuntimeError("broadcast_reply: the payload is not a reply (ranks called with different "
                           "max_reqs / num_spec / sampled, or out of step)")
    tw = hdr.view(np.uint32)
    t = int(tw[1]) | (int(tw[2]) << 32)
    reason = hdr[8:].tobytes()[:int(hdr[6])].decode(errors="replace")
    status, n = int(page[0]), int(page[1])
    nd = page[L.o_ok:L.o_ok + n]
    ok = b.ok[:n]
    np.not_equal(nd, 0, out=ok)
    ids = page[L.o_ids:L.o_ids + n * N].reshape(n, N)
    conf = page[L.o_conf:L.o_conf + n * N].view(np.float32).reshape(n, N)
    if status == STATUS_ROUND_FAILED:
        return b.failed(t, n, reason)
    if not hdr[5]:
        return Reply(t, status, n, ok, ids, conf, reason=reason, n_drafts=nd)
    K = SUPPORT_K
    sm = b.smask[:n]
    np.not_equal(page[L.o_sample_mask:L.o_sample_mask + n], 0, out=sm)
    qids = page[L.o_qids:L.o_qids + n * N * K].reshape(n, N, K)
    q = page[L.o_q:L.o_q + n * N * K].view(np.float32).reshape(n, N, K)
    return Reply(t, status, n, ok, ids, conf, sm, qids, q, reason=reason, n_drafts=nd)


def _device(group: Any) -> Any:
    import torch
    import torch.distributed as dist

    if str(dist.get_backend(group)).lower() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast_reply(reply: Reply | None, group: Any = None, src: int = 0, *, num_spec: int, max_reqs: int,
                    sampled: bool = False, device: Any = None) -> Reply:
    """Round t's reply on every rank of `group`: `src` passes the Reply it read, the others None.

    Every rank must call it with the same num_spec, max_reqs and sampled (the shim's). `src` is a
    global rank, as in torch.distributed.broadcast. On `src` the given reply is returned as is; the
    other ranks get an equal Reply whose arrays are views of a reused buffer. A reply that does not
    match the shapes is broadcast as a failed round (so no rank waits for a broadcast that never
    comes) and then raises ValueError on `src`.
    """
    import torch.distributed as dist

    dev = _device(group) if device is None else device
    key = (int(max_reqs), int(num_spec), bool(sampled), str(dev))
    b = _buffers.get(key)
    if b is None:
        b = _buffers[key] = _Buffers(int(max_reqs), int(num_spec), bool(sampled), dev)
    me = dist.get_rank()
    why = None
    if me == src:
        if reply is None:
            reply = Reply(0, STATUS_ROUND_FAILED, 0, b.ok[:0], b.page[:0].reshape(0, num_spec),
                          b.page[:0].view(np.float32).reshape(0, num_spec), reason="no_reply")
            _pack(b, reply)
            why = "broadcast_reply: the src rank must pass the reply it read"
        else:
            why = _pack(b, reply)
        if b.dev is not b.host:
            b.dev.copy_(b.host, non_blocking=False)
    dist.broadcast(b.dev, src=src, group=group)
    if me == src:
        if why is not None:
            raise ValueError(why)
        return reply
    if b.dev is not b.host:
        b.host.copy_(b.dev, non_blocking=False)
    return _unpack(b)


class RoundReply:
    """What `tp_round` yields: rank `src` sets `.reply`; after the block every rank's `.reply` is
    round t's reply."""

    def __init__(self, t: int) -> None:
        self.t = t
        self.reply: Reply | None = None


@contextmanager
def tp_round(t: int, n: int, group: Any = None, src: int = 0, *, num_spec: int, max_reqs: int,
             sampled: bool = False, device: Any = None) -> Iterator[RoundReply]:
    """Round t on every rank, with the broadcast guaranteed whatever rank `src`'s shim does::

        with tp_round(t, n, group, num_spec=N, max_reqs=M) as r:
            if rank == 0:
                shim.enqueue(t, ...)
                r.reply = shim.read_reply(t)
        reply = r.reply  # every rank

    Every rank enters it with the round's number and request count. If the block raises on any rank,
    or `src` sets no reply, that rank still takes part in the broadcast (rank `src` sends a failed
    round of n requests whose reason names the exception), so no rank waits in `dist.broadcast` for
    the process group's timeout; then the exception goes on. `src` setting no reply raises ValueError
    there after the broadcast, as `broadcast_reply(None)` does.
    """
    import torch.distributed as dist

    box = RoundReply(t)
    err: BaseException | None = None
    try:
        yield box
    except BaseException as e:
        err = e
        raise
    finally:
        mine = box.reply if dist.get_rank() == src else None
        missing = dist.get_rank() == src and mine is None
        if dist.get_rank() == src and (mine is None or err is not None):
            why = "no_reply" if err is None else f"rank{src}: {type(err).__name__}: {err}"
            mine = ReplyReader(ReplyPageLayout(int(max_reqs), int(num_spec), bool(sampled))).failed(t, n, why)
        box.reply = broadcast_reply(mine, group, src, num_spec=num_spec, max_reqs=max_reqs, sampled=sampled,
                                    device=device)
        if missing and err is None:
            raise ValueError(f"tp_round({t}): rank {src} set no reply; a failed round was broadcast")
