"""vLLM as people run it: `vllm serve` (the OpenAI API) with the proposer, a proxy and a worker, queried
with the `openai` client, against the same server without speculation (docs/serving.md).

Two servers for the module, one after the other (each start-up 30-90 s on 2 CPUs): no speculation, then
ours; each answers the same requests (greedy completions, a prompt list, chat, streaming, stop strings,
logprobs, concurrent requests, requests ending at max_tokens, one longer than the head's window), and
ours then answers them again while its worker is killed, is stopped with SIGTERM (its ring and every
process it started gone), and its proxy is stopped (the segment gone). Every process is stopped in a
`finally`, pass or fail. The offline path (vLLM's `LLM`) is tests/test_vllm_e2e.py.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/setup.sh installs it)")
openai = pytest.importorskip("openai")

from dspark_proxy.integrations.vllm_demo import DEFAULT_HEAD, DEFAULT_MODEL, PROMPTS, shapes_args  # noqa: E402
from dspark_proxy.integrations.vllm_serve import spawn_server  # noqa: E402
from dspark_proxy.model.manifest import HeadManifest, head_paths  # noqa: E402
from dspark_proxy.ops.launch import spawn_proxy, spawn_worker  # noqa: E402
from dspark_proxy.ops.status import read_status  # noqa: E402

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

MODEL = os.fspath(DEFAULT_MODEL)
MAN = HeadManifest.load(head_paths(DEFAULT_HEAD)[1])
MAX_REQS, MAX_TOKENS = 8, 40
LAYOUT = shapes_args(DEFAULT_HEAD, MAX_REQS)
# longer than the head's window (W = 16) on both sides: a prompt of a few hundred tokens, 120 out
LONG = "".join(PROMPTS) * 2
CHAT = [{"role": "system", "content": "You write Python."},
        {"role": "user", "content": "def parse_args(argv):"}]
READY_S = 400.0


def _placement() -> tuple[list[int] | None, list[int] | None]:
    """vLLM on all CPUs but the last, the proxy and worker on the last (docs/vllm.md, "CPU placement")."""
    cpus = sorted(os.sched_getaffinity(0))
    return (cpus[:-1], cpus[-1:]) if len(cpus) > 1 else (None, None)


def _queries(srv) -> dict[str, Any]:
    """Every request of the comparison, greedy, through the openai client."""
    c = openai.OpenAI(base_url=srv.base_url, api_key="none", timeout=120.0, max_retries=0)
    out: dict[str, Any] = {}
    # ignore_eos: every request of the list ends at max_tokens (vLLM's extra sampling parameter)
    r = c.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=MAX_TOKENS, temperature=0,
                             extra_body={"ignore_eos": True})
    by_index = sorted(r.choices, key=lambda ch: ch.index)
    out["batch"] = [ch.text for ch in by_index]
    out["batch_finish"] = [ch.finish_reason for ch in by_index]
    out["batch_tokens"] = r.usage.completion_tokens
    chat = c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0)
    out["chat"] = chat.choices[0].message.content
    stream = c.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=MAX_TOKENS, temperature=0, stream=True)
    out["stream"] = "".join(ch.choices[0].text for ch in stream if ch.choices)
    stop = c.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0, stop=["\n"])
    out["stop"] = (stop.choices[0].text, stop.choices[0].finish_reason)
    lp = c.completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=MAX_TOKENS, temperature=0, logprobs=2)
    lps = lp.choices[0].logprobs
    out["logprobs_tokens"] = list(lps.tokens)
    out["logprobs"] = [round(x, 3) for x in lps.token_logprobs]
    long = c.completions.create(model=MODEL, prompt=LONG, max_tokens=120, temperature=0,
                                extra_body={"ignore_eos": True})
    out["long"] = (long.choices[0].text, long.usage.prompt_tokens, long.usage.completion_tokens)
    out["concurrent"] = _concurrent(c, list(PROMPTS))
    # n > 1 (vLLM takes it only sampled): two sampled choices, each to max_tokens
    n2 = c.completions.create(model=MODEL, prompt=PROMPTS[3], max_tokens=MAX_TOKENS, temperature=0.8, seed=1, n=2,
                              extra_body={"ignore_eos": True})
    out["n2_tokens"] = n2.usage.completion_tokens
    out["regex"] = _outcome(lambda: c.completions.create(
        model=MODEL, prompt=PROMPTS[4], max_tokens=MAX_TOKENS, temperature=0,
        extra_body={"structured_outputs": {"regex": "    [a-z_]+ = [a-z_]+\\n"}}).choices[0].text)
    # logit_bias against the greedy first token: with speculation on vLLM refuses it ("The min_p and
    # logit_bias sampling parameters are not yet supported with speculative decoding")
    first = c.completions.create(model=MODEL, prompt=PROMPTS[5], max_tokens=8, temperature=0, logprobs=1,
                                 extra_body={"return_tokens_as_token_ids": True}).choices[0]
    out["plain"] = first.text
    tid = first.logprobs.tokens[0].split(":")[-1]
    out["biased"] = _outcome(lambda: c.completions.create(
        model=MODEL, prompt=PROMPTS[5], max_tokens=8, temperature=0, logit_bias={tid: -100}).choices[0].text)
    return out


def _outcome(call) -> str:
    """The text, or the error's type: what a request that one arm refuses gets."""
    try:
        return call()
    except openai.APIError as e:
        return f"error {type(e).__name__}"


def _concurrent(c, prompts: list[str], during=None) -> list[str]:
    """One request per prompt, all at once (threads); `during()` runs while they are in flight."""
    got: list[Any] = [None] * len(prompts)

    def one(i: int) -> None:
        try:
            r = c.completions.create(model=MODEL, prompt=prompts[i], max_tokens=MAX_TOKENS, temperature=0)
            got[i] = r.choices[0].text
        except Exception as e:  # noqa: BLE001 - reported by the comparison
            got[i] = e

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in ts:
        t.start()
    if during is not None:
        during()
    for t in ts:
        t.join(180)
    return got


def _rings(name: str, pids: list[int]) -> list[str]:
    """The engine's ring wherever it lives: a named ring in /dev/shm, or a memfd ring (the default,
    shm_layout.md §1) still mapped by one of `pids` (the server's processes and the proxy)."""
    out = sorted(p.name for p in Path("/dev/shm").glob(f"dspark-ring.{name}.*"))
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        out += sorted({f"{pid}: memfd" for ln in maps.splitlines() if f"memfd:dspark-ring.{name} " in ln + " "})
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> dict[str, Any]:
    """Both arms' answers, and what ours did when its worker died, at SIGTERM, and at the proxy's stop."""
    from tests.conftest import _unlink, new_segment_name

    logs = tmp_path_factory.mktemp("serve")
    vllm_cpus, our_cpus = _placement()
    res: dict[str, Any] = {}
    srv = spawn_server(MODEL, log_path=logs / "nospec.log", cpus=vllm_cpus, max_num_seqs=MAX_REQS,
                       ready_timeout_s=READY_S)
    try:
        res["nospec"] = _queries(srv)
    finally:
        srv.stop()
    name = new_segment_name("serve")
    mine = os.sched_getaffinity(0)
    worker = proxy = srv = None
    try:
        if our_cpus:
            os.sched_setaffinity(0, set(our_cpus))  # the worker and the proxy inherit it
        try:
            worker = spawn_worker(*LAYOUT, "--drafter", "torch", "--head", os.fspath(DEFAULT_HEAD))
            proxy = spawn_proxy(name, worker.address, *LAYOUT, "--deadline-ms", "30", "--log-every", "0")
        finally:
            os.sched_setaffinity(0, mine)
        srv = spawn_server(MODEL, log_path=logs / "ours.log", head=DEFAULT_HEAD, name=name, cpus=vllm_cpus,
                           max_num_seqs=MAX_REQS, ready_timeout_s=READY_S)
        res["ours"] = _queries(srv)
        res["status"] = read_status(name)
        res["rings_running"] = _rings(name, [*srv.group_pids(), proxy.pid])
        c = openai.OpenAI(base_url=srv.base_url, api_key="none", timeout=120.0, max_retries=0)

        def kill_worker() -> None:
            time.sleep(0.1)  # the requests admitted and drafting
            worker.kill()

        res["killed"] = _concurrent(c, list(PROMPTS), during=kill_worker)
        before = res["status"]["drafting"]["rounds_failed"]
        deadline = time.monotonic() + 5.0  # the proxy publishes its counters about once a second
        while True:
            res["status_killed"] = read_status(name)
            if res["status_killed"]["drafting"]["rounds_failed"] > before or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        # SIGTERM to the front end, as a service manager stops it
        t0 = time.monotonic()
        srv.terminate()
        srv.proc.wait(60)
        res["exit_s"] = time.monotonic() - t0
        deadline = time.monotonic() + 2.0
        while _rings(name, [proxy.pid]) and time.monotonic() < deadline:
            time.sleep(0.05)
        res["rings_after_term"] = _rings(name, [proxy.pid])
        deadline = time.monotonic() + 5.0
        while srv.group_pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        res["left_after_term"] = srv.group_pids()
        res["log"] = srv.log()
        proxy.stop()
        res["segment_after_stop"] = Path(f"/dev/shm/dspark-proxy.{name}").exists()
    finally:
        for ch in (srv, proxy, worker):
            if ch is not None:
                ch.stop()
        _unlink(name)
    return res


def test_greedy_completions_and_chat_are_identical_to_the_server_without_speculation(served):
    ours, nospec = served["ours"], served["nospec"]
    assert ours["batch"] == nospec["batch"]
    assert ours["chat"] == nospec["chat"] and ours["chat"]  # the shipped tokenizer's chat template
    assert ours["stream"] == nospec["stream"] and ours["stream"]
    assert ours["stop"] == nospec["stop"]
    assert ours["long"] == nospec["long"]
    assert ours["concurrent"] == nospec["concurrent"] and all(isinstance(t, str) for t in ours["concurrent"])


def test_sampled_n_2_and_structured_output_work_logit_bias_is_refused(served):
    """docs/serving.md, "What works": vLLM refuses logit_bias (and a sampled min_p) with speculation on."""
    ours, nospec = served["ours"], served["nospec"]
    assert ours["n2_tokens"] == nospec["n2_tokens"] == 2 * MAX_TOKENS  # two sampled choices (n > 1 is sampled only)
    assert ours["regex"] == nospec["regex"] and not ours["regex"].startswith("error"), ours["regex"]
    assert nospec["biased"] != nospec["plain"]  # without speculation the bias bans the greedy token ...
    assert ours["biased"] == "error BadRequestError"  # ... with it, vLLM refuses the request (400)


def test_requests_end_where_asked_and_logprobs_match(served):
    ours, nospec = served["ours"], served["nospec"]
    assert ours["batch_finish"] == ["length"] * len(PROMPTS) and ours["batch_tokens"] == MAX_TOKENS * len(PROMPTS)
    text, finish = ours["stop"]
    assert finish == "stop" and "\n" not in text, ours["stop"]
    _, prompt_tokens, out_tokens = ours["long"]
    assert prompt_tokens > MAN.window and out_tokens == 120 > MAN.window
    assert ours["logprobs_tokens"] == nospec["logprobs_tokens"]
    assert ours["logprobs"] == pytest.approx(nospec["logprobs"], abs=2e-3)


def test_the_server_drafted_through_the_proxy_for_its_target(served):
    st = served["status"]
    d = st["drafting"]
    assert d["num_accepted_tokens"] > 0 and d["mean_accepted"] > 1.0, d  # drafts were used, and good ones
    assert st["proxy"]["gauges"]["target_id"] == MAN.target_id  # the proposer named its target
    assert served["rings_running"], "the engine's ring exists while the server runs"
    log = served["log"]
    assert "[shim] vLLM proposer: attached" in log, log[-3000:]


def test_outputs_stay_identical_when_the_worker_is_killed_mid_traffic(served):
    assert served["killed"] == served["nospec"]["concurrent"]
    before, after = served["status"]["drafting"], served["status_killed"]["drafting"]
    assert after["rounds_failed"] > before["rounds_failed"], (before, after)  # target-only once it died


def test_sigterm_stops_every_process_and_the_proxy_stop_removes_the_segment(served):
    assert served["exit_s"] < 60
    assert served["left_after_term"] == []
    assert served["segment_after_stop"] is False


def test_sigterm_removes_the_engines_ring_within_2s(served):
    """The server's processes are gone by then; the proxy drops its mapping of a memfd ring (or removes
    a named one) once it sees the engine gone."""
    assert served["rings_after_term"] == []
