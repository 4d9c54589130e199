"""`train-drafter --arch dspark` (docs/dspark.md): the prompt file formats, a small real run on the
shipped target whose output loads with speculators' own `from_pretrained` and passes vLLM 0.32's
speculators-config conversion for DSpark, the offline drafting loop held to the reference's own
training forward, and bad input refused in one line before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from dspark_proxy.cli import cli  # noqa: E402
from dspark_proxy.model.prompts import PromptError, encode_prompts, read_prompts, split_prompts  # noqa: E402

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "models" / "stdlib-llama"


def test_prompt_files_text_and_jsonl(tmp_path):
    t = tmp_path / "p.txt"
    t.write_text("def f(x):\n\n  import os\n")
    assert read_prompts(t) == ["def f(x):", "  import os"]
    j = tmp_path / "p.jsonl"
    j.write_text('{"prompt": "a"}\n"b"\n{"text": "c"}\n{"messages": [{"role": "user", "content": "d"}]}\n')
    assert read_prompts(j) == ["a", "b", "c", [{"role": "user", "content": "d"}]]
    j2 = tmp_path / "noext"
    j2.write_text('{"prompt": "x"}\n{"prompt": "y"}\n')
    assert read_prompts(j2) == ["x", "y"]
    for body, says in (('{"prompt": "a"}\n{"oops": 1}\n', ":2: a JSON string or an object"),
                       ('{"prompt": "a"}\n{not json\n', ":2: not JSON"), ("\n\n", "no prompts")):
        bad = tmp_path / "bad.jsonl"
        bad.write_text(body)
        with pytest.raises(PromptError) as e:
            read_prompts(bad)
        assert says in str(e.value) and str(bad) in str(e.value) and "\n" not in str(e.value)


def test_split_is_by_text_and_stable():
    ps = [f"prompt {i}" for i in range(200)]
    tr, held = split_prompts(ps, 0.1)
    assert sorted(tr + held) == list(range(200)) and 5 < len(held) < 40
    tr2, held2 = split_prompts(ps + ["more"], 0.1)  # a new line moves no old prompt
    assert set(held) <= set(held2) and set(tr) <= set(tr2)
    assert split_prompts(["a", "b"], 0.0)[1] and split_prompts(["a", "b"], 0.9)[0]


def test_chat_template_is_used_where_the_tokenizer_has_one():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TARGET, local_files_only=True)
    tok.chat_template = None  # the shipped tokenizer has one (for `vllm serve`'s chat API): plain first
    plain = encode_prompts(tok, ["x = 1"])[0]
    assert list(plain) == tok("x = 1", add_special_tokens=True)["input_ids"]
    tok.chat_template = "{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}{% if add_generation_prompt %}##{% endif %}"
    chat = encode_prompts(tok, ["x = 1"])[0]
    assert list(chat) == tok("<<x = 1>>##", add_special_tokens=False)["input_ids"]
    assert len(encode_prompts(tok, ["x = 1"], max_len=2)[0]) == 2


def _train(tmp_path, *extra):
    out = tmp_path / "head"
    args = ["train-drafter", "--arch", "dspark", "--target", str(TARGET), "--out", str(out), "--gen-len", "12",
            "--epochs", "1", "--batch", "4", "--anchors", "16", "--eval-sequences", "2", "--json", *extra]
    return out, CliRunner().invoke(cli, args, catch_exceptions=False)


def _stored(out: Path, prompt_file: Path, held_share: float) -> tuple[list[dict], list[dict]]:
    """The generations in the head's store, (train, held out), in the prompt file's order."""
    from transformers import AutoTokenizer

    (store,) = (out / ".work").glob("dspark-generations-*")
    seqs = {k: q for f in sorted(store.glob("*.pt")) for k, q in torch.load(f, weights_only=False).items()}
    prompts = read_prompts(prompt_file)
    enc = encode_prompts(AutoTokenizer.from_pretrained(str(TARGET)), prompts, 256)
    tr, held = split_prompts(prompts, held_share)
    get = [seqs.get(enc[i].tobytes()) for i in tr], [seqs.get(enc[i].tobytes()) for i in held]
    return [q for q in get[0] if q is not None], [q for q in get[1] if q is not None]


def test_more_prompts_generate_only_the_new_ones(tmp_path, monkeypatch):
    """A larger --n-prompts with --resume reuses every continuation made before (the store is keyed by the
    prompt, not by the run) and trains on the larger set from the checkpoint."""
    monkeypatch.chdir(ROOT)
    pf = tmp_path / "prompts.txt"
    pf.write_text("".join(f"def function_{i}(value):\n" for i in range(12)))
    args = ("--prompts", str(pf), "--held-share", "0.3", "--target", str(TARGET.relative_to(ROOT)))
    out, r = _train(tmp_path, *args, "--n-prompts", "3")
    assert r.exit_code == 0, r.output
    train, held = _stored(out, pf, 0.3)
    assert len(train) == 3 and len(held) >= 1
    first = {q["toks"][:q["start"]].numpy().tobytes(): q["toks"] for q in train + held}
    out, r = _train(tmp_path, *args, "--n-prompts", "5", "--epochs", "2", "--resume")
    assert r.exit_code == 0, r.output
    assert "generating 2 train sequences with the target (3 already generated)" in r.output, r.output
    assert "held_out sequences" not in r.output and "resumed after epoch 1" in r.output
    res = json.loads(r.output[r.output.rindex('{"mean_accepted"'):].splitlines()[0])
    assert res["train_sequences"] == 5 and len(res["loss_per_epoch"]) == 2
    train2, held2 = _stored(out, pf, 0.3)
    assert len(train2) == 5 and len(held2) == len(held)
    for q in train2 + held2:  # the continuations made before are kept as they were
        k = q["toks"][:q["start"]].numpy().tobytes()
        assert k not in first or torch.equal(first[k], q["toks"])
    out, r = _train(tmp_path, *args, "--n-prompts", "5", "--epochs", "2", "--resume")
    assert r.exit_code == 0 and "generating" not in r.output, r.output
    (store,) = (out / ".work").glob("dspark-generations-*")
    assert len(list(store.glob("*.pt"))) == 3  # a file a batch: train 3, held out, then the 2 new train prompts
    store = sorted(store.glob("*.pt"))[-1]
    store.write_bytes(b"not a store")
    out, r = _train(tmp_path, *args, "--n-prompts", "5", "--epochs", "2", "--resume")
    assert r.exit_code != 0 and f"{store}: not a store of generations" in r.output, r.output
    assert "Traceback" not in r.output


def test_the_store_keeps_each_batch_as_it_is_made(tmp_path):
    """A kill during a long generation loses only the batch in progress: each batch is a file of the
    store as soon as it is made, and a run after the kill finds them; the single file an earlier version
    kept is read too."""
    from dspark_proxy.model.dspark_train import DSparkTrainConfig, _GenStore

    cfg = DSparkTrainConfig(layers=(1, 2, 4))

    def seq(i: int) -> dict:
        return {"toks": torch.tensor([i, i + 1, 7, 8]), "rows": torch.zeros(4, 3), "last": torch.zeros(4, 2),
                "start": 2}

    def batches():
        yield [seq(0), seq(10)]
        yield [seq(20)]
        raise KeyboardInterrupt  # killed while the third batch was being made

    store = _GenStore(tmp_path, TARGET, cfg)
    with pytest.raises(KeyboardInterrupt):
        for chunk in batches():
            store.add(chunk)
    prompts = [np.array([i, i + 1]) for i in (0, 10, 20, 30)]
    again = _GenStore(tmp_path, TARGET, cfg)
    assert again.missing(prompts) == [3]
    assert torch.equal(again.take(prompts[2:3])[0]["toks"], seq(20)["toks"])
    torch.save({_GenStore.key(np.array([30, 31])): seq(30)}, again.dir.with_suffix(".pt"))  # an earlier version's
    third = _GenStore(tmp_path, TARGET, cfg)
    assert third.missing(prompts) == []
    third.add([seq(40)])  # numbered after the files there
    assert sorted(f.name for f in third.dir.glob("*")) == ["000000.pt", "000001.pt", "000002.pt"]


def test_train_from_a_prompt_file_loads_in_speculators_and_vllm(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the checkpoint names its verifier by the path given, relative to here
    pf = tmp_path / "prompts.txt"
    pf.write_text("".join(f"def function_{i}(value):\n" for i in range(10)))
    args = ("--prompts", str(pf), "--held-share", "0.3", "--target", str(TARGET.relative_to(ROOT)))
    out, r = _train(tmp_path, *args)
    assert r.exit_code == 0, r.output
    out, r = _train(tmp_path, *args, "--epochs", "2", "--resume")  # the generations come from the cache
    assert r.exit_code == 0 and "resumed after epoch 1" in r.output, r.output
    assert "generating" not in r.output
    res = json.loads(r.output[r.output.rindex('{"mean_accepted"'):].splitlines()[0])  # stderr's bars mix in
    assert len(res["loss_per_epoch"]) == 2
    assert res["num_spec"] == 5 and res["rounds"] > 0 and res["train_sequences"] + res["held_out_sequences"] == 10
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_model_type"] == "dspark" and cfg["markov_head_type"] == "vanilla"
    assert cfg["aux_hidden_state_layer_ids"] == [1, 2, 4] and cfg["block_size"] == 5 and cfg["sample_from_anchor"]
    assert cfg["transformer_layer_config"]["sliding_window"] == 16
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "models/stdlib-llama"
    assert sorted(f.name for f in out.iterdir()) == [".work", "config.json", "model.safetensors"]
    assert (out / ".work" / ".gitignore").is_file()

    from speculators.models.dspark import DSparkDraftModel

    m = DSparkDraftModel.from_pretrained(str(out))
    assert not m.embed_tokens.weight.isnan().any() and not m.lm_head.weight.isnan().any()

    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    raw = json.loads((out / "config.json").read_text())
    assert SpeculatorsConfig.extract_vllm_speculative_config(raw) == {"method": "dspark", "num_speculative_tokens": 5}
    v = SpeculatorsConfig.from_pretrained(str(out))
    assert v.target_layer_ids == [0, 1, 3] and v.eagle_aux_hidden_state_layer_ids == [1, 2, 4]
    assert v.sample_from_anchor and not v.dspark_bonus_anchor and v.markov_head_type == "vanilla"
    assert v.architectures == ["Qwen3DSparkModel"] and 0 <= v.mask_token_id < v.vocab_size


def test_the_reference_forward_flag_trains_the_same_head(tmp_path, monkeypatch):
    """`--reference-forward` (the reference's dense-mask backbone) and the default block-local forward
    (dspark_proxy/model/dspark_fast.py) train the same weights from the same seed."""
    from safetensors.torch import load_file

    monkeypatch.chdir(ROOT)
    pf = tmp_path / "prompts.txt"
    pf.write_text("".join(f"def function_{i}(value):\n" for i in range(8)))
    args = ("--prompts", str(pf), "--held-share", "0.3", "--target", str(TARGET.relative_to(ROOT)))
    got = []
    for extra in ((), ("--reference-forward",)):  # the second reuses the cached generations
        out, r = _train(tmp_path, *args, *extra)
        assert r.exit_code == 0, r.output
        got.append((json.loads(r.output[r.output.rindex('{"mean_accepted"'):].splitlines()[0]),
                    load_file(str(out / "model.safetensors"))))
    (fast, wf), (ref, wr) = got
    assert abs(fast["loss_per_epoch"][0] - ref["loss_per_epoch"][0]) <= 2e-4
    assert wf.keys() == wr.keys() and max(float((wf[k] - wr[k]).abs().max()) for k in wf) <= 1e-4


def test_offline_drafting_matches_the_references_training_forward(tmp_path, monkeypatch):
    """greedy_drafts runs the reference's modules with its own masks; its block hidden states equal
    those of DSparkDraftModel's training forward at the same anchors (short and long contexts)."""
    import speculators.models.dflash.core as core

    from dspark_proxy.model.dspark_head import build_dspark, greedy_drafts

    torch.manual_seed(0)
    from transformers import LlamaConfig

    tcfg = LlamaConfig(vocab_size=97, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                       intermediate_size=48, num_key_value_heads=2, architectures=["LlamaForCausalLM"])
    d = build_dspark(tcfg, verifier_path="unused", layers=[1, 3], num_spec=5, window=8, draft_layers=2,
                     markov_rank=8).eval()
    for p in d.parameters():
        p.data.normal_(0, 0.2)
    d.verifier_norm.weight.data.fill_(1.0)
    T = 40
    rows, toks = torch.randn(T, 64), torch.randint(0, 97, (T,))
    anchors = torch.tensor([2, 9, 20, 33])
    monkeypatch.setattr(core, "select_anchors", lambda lm, n, b: (anchors, torch.ones(4, dtype=torch.bool)))
    with torch.no_grad():
        hid, *_ = d._backbone_forward(rows[None], toks[None], torch.ones(1, T), torch.randn(1, T, 32),
                                      torch.zeros(1, T, dtype=torch.long), None, max_anchors=4)
    got = {}
    orig = d.lm_head.forward
    monkeypatch.setattr(d.lm_head, "forward", lambda x: (got.__setitem__("h", x), orig(x))[1])
    drafts = greedy_drafts(d, rows, toks, anchors)
    assert drafts.shape == (4, 5)
    assert (got["h"] - hid.view(4, 5, -1)).abs().max() < 1e-5


def test_bad_tap_layers_and_prompt_files_are_one_line_and_leave_nothing(tmp_path):
    out, r = _train(tmp_path, "--layers", "1,9")
    assert r.exit_code != 0 and "[9] outside 0..4" in r.output and len(r.output.strip().splitlines()) == 1
    assert not out.exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": 3}\n')
    out, r = _train(tmp_path, "--prompts", str(bad))
    assert r.exit_code != 0 and f"{bad}:1:" in r.output and len(r.output.strip().splitlines()) == 1
    assert not out.exists()
    out, r = _train(tmp_path, "--prompts", str(tmp_path / "missing.txt"))
    assert r.exit_code != 0 and "missing.txt: no such file" in r.output and not out.exists()


def test_every_valid_anchor_of_a_step_is_trained_by_default():
    """--anchors 0 (the default) gives the reference's select_anchors room for every position it may
    choose, so a step trains on all of its generated positions (the shipped head's old 384 of ~770 a step
    left half of each epoch's positions unseen); a positive --anchors is passed through."""
    from speculators.models.dflash.utils import select_anchors

    from dspark_proxy.model.dspark_train import DSparkTrainConfig, _pack, step_anchors

    assert DSparkTrainConfig().anchors == 0
    N = 5
    seqs = [{"toks": torch.arange(40 + 8 * d), "rows": torch.zeros(40 + 8 * d, 6), "last": torch.zeros(40 + 8 * d, 2),
             "start": 12} for d in range(3)]
    _, _, lm, _, doc, _ = _pack(seqs, N)
    A = step_anchors(lm, N, 0)
    anchors, ok = select_anchors(lm, A, N)
    allowed = torch.nonzero(lm[0].bool() & (torch.arange(lm.shape[1]) < lm.shape[1] - N)).squeeze(-1)
    assert ok.all() and torch.equal(anchors.sort().values, allowed)
    # each document from its last prompt token to its second last token, less the packed row's last block
    assert len(allowed) == sum(len(s["toks"]) - 12 for s in seqs) - (N - 1)
    assert step_anchors(lm, N, 7) == 7


def test_a_draft_vocabulary_of_the_most_frequent_ids(tmp_path, monkeypatch):
    """`--draft-vocab K`: the K ids most frequent in the training generations, by the reference's own
    rule; the target's lm_head rows for them; a checkpoint the reference, vLLM and our worker load;
    drafts come back as target ids; a resume with another K is one line."""
    from safetensors.torch import load_file
    from speculators.models.dspark import DSparkDraftModel
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    from dspark_proxy.model.dspark_ckpt import load_tensors, read_spec, resolve_target
    from dspark_proxy.model.dspark_head import greedy_drafts, load_dspark

    monkeypatch.chdir(ROOT)
    pf = tmp_path / "prompts.txt"
    pf.write_text("".join(f"def function_{i}(value):\n" for i in range(10)))
    args = ("--prompts", str(pf), "--held-share", "0.3", "--target", str(TARGET.relative_to(ROOT)),
            "--draft-vocab", "64")
    out, r = _train(tmp_path, *args)
    assert r.exit_code == 0, r.output
    res = json.loads(r.output[r.output.rindex('{"mean_accepted"'):].splitlines()[0])
    assert res["draft_vocab"] == 64 and 0 < res["draft_vocab_coverage"] <= 1
    assert "draft vocabulary: 64 of 4096 ids" in r.output
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 64 and cfg["transformer_layer_config"]["vocab_size"] == 4096

    train = _stored(out, pf, 0.3)[0]
    counts = torch.zeros(4096, dtype=torch.long)
    for s in train:
        counts += torch.bincount(s["toks"][s["start"]:], minlength=4096)
    nz = counts.nonzero().flatten()
    d2t, t2d = build_vocab_mappings_from_distribution(dict(zip(nz.tolist(), counts[nz].tolist(), strict=True)), 64, 4096)
    w = load_file(str(out / "model.safetensors"))
    assert torch.equal(w["d2t"], d2t) and torch.equal(w["t2d"], t2d)
    ids = torch.arange(64) + d2t
    target_head = load_file(str(TARGET / "model.safetensors"))["model.embed_tokens.weight"]  # tied
    assert torch.equal(w["lm_head.weight"], target_head[ids].float())  # frozen, as the reference keeps it

    m = DSparkDraftModel.from_pretrained(str(out))
    assert m.use_draft_vocab and torch.equal(m.d2t, d2t)
    m = load_dspark(out)  # the same, with eager attention
    spec = read_spec(out)
    got = load_tensors(spec, resolve_target(spec, None))
    assert torch.equal(got["draft_to_target"], ids)

    s = train[0]
    drafts = greedy_drafts(m, s["rows"].float(), s["toks"], torch.arange(s["start"], len(s["toks"]) - 5))
    assert bool(t2d[drafts].all())  # every draft a target id inside the draft vocabulary

    out, r = _train(tmp_path, *args[:-1], "0", "--epochs", "2", "--resume")
    assert r.exit_code != 0 and "a checkpoint of another head" in r.output, r.output
    assert "Traceback" not in r.output


def test_the_loss_options_reach_the_references_loss(tmp_path, monkeypatch):
    """--loss-fn, --per-position-loss-weight, --decay-gamma and --dpace-alpha are handed to the reference's
    own loss (`get_trainer_kwargs`), and D-PACE without ce is refused in one line, as its trainer refuses it."""
    import math

    from speculators.models.dspark import DSparkDraftModel

    monkeypatch.chdir(ROOT)
    pf = tmp_path / "prompts.txt"
    pf.write_text("".join(f"def function_{i}(value):\n" for i in range(6)))
    args = ("--prompts", str(pf), "--held-share", "0.3", "--target", str(TARGET.relative_to(ROOT)))
    out, r = _train(tmp_path, *args, "--per-position-loss-weight", "dpace")
    assert r.exit_code != 0 and "dpace needs --loss-fn ce" in r.output and "Traceback" not in r.output
    assert not out.exists()
    seen = []
    orig = DSparkDraftModel.get_trainer_kwargs

    def spy(**kw):
        seen.append(kw)
        return orig(**kw)

    monkeypatch.setattr(DSparkDraftModel, "get_trainer_kwargs", staticmethod(spy))
    out, r = _train(tmp_path, *args, "--loss-fn", "ce", "--per-position-loss-weight", "dpace", "--dpace-alpha", "0.25",
                    "--decay-gamma", "6")
    assert r.exit_code == 0, r.output
    assert seen and {k: seen[-1][k] for k in ("loss_fn", "per_position_loss_weight", "dpace_alpha",
                                              "dflash_decay_gamma")} == {
        "loss_fn": "ce", "per_position_loss_weight": "dpace", "dpace_alpha": 0.25, "dflash_decay_gamma": 6.0}
    res = json.loads(r.output[r.output.rindex('{"mean_accepted"'):].splitlines()[0])
    assert all(math.isfinite(x) and x > 0 for x in res["loss_per_epoch"])


def test_init_starts_from_a_dspark_checkpoint(tmp_path, monkeypatch):
    """`--init HEAD`: a head trained on from another DSpark checkpoint takes its shapes (tapped layers, W,
    draft vocabulary and its ids) and weights; a flag given that disagrees, or a directory that is no
    DSpark checkpoint, is one line and writes nothing."""
    from safetensors.torch import load_file

    monkeypatch.chdir(ROOT)
    pf = tmp_path / "prompts.txt"
    pf.write_text("".join(f"def function_{i}(value):\n" for i in range(8)))
    base = ("--prompts", str(pf), "--held-share", "0.3", "--target", str(TARGET.relative_to(ROOT)))
    a, r = _train(tmp_path / "a", *base, "--draft-vocab", "64", "--window", "8", "--layers", "1,2")
    assert r.exit_code == 0, r.output
    res_a = json.loads(r.output[r.output.rindex('{"mean_accepted"'):].splitlines()[0])
    wa = load_file(str(a / "model.safetensors"))

    b, r = _train(tmp_path / "b", *base, "--init", str(a), "--epochs", "0")  # nothing trained: A itself
    assert r.exit_code == 0 and f"starting from {a}" in r.output, r.output
    res_b = json.loads(r.output[r.output.rindex('{"mean_accepted"'):].splitlines()[0])
    wb = load_file(str(b / "model.safetensors"))
    assert wb.keys() == wa.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    cfg = json.loads((b / "config.json").read_text())
    assert cfg["aux_hidden_state_layer_ids"] == [1, 2] and cfg["draft_vocab_size"] == 64
    assert cfg["transformer_layer_config"]["sliding_window"] == 8
    assert res_b["mean_accepted"] == res_a["mean_accepted"] and res_b["draft_vocab"] == 64

    c, r = _train(tmp_path / "c", *base, "--init", str(a), "--window", "8", "--loss-fn", "ce")
    assert r.exit_code == 0, r.output  # a flag that agrees is fine
    wc = load_file(str(c / "model.safetensors"))
    assert torch.equal(wc["d2t"], wa["d2t"]) and torch.equal(wc["t2d"], wa["t2d"])  # its ids, not recounted
    assert not torch.equal(wc["fc.weight"], wa["fc.weight"])  # trained on from A

    d, r = _train(tmp_path / "d", *base, "--init", str(a), "--window", "16")
    assert r.exit_code != 0 and "--window" in r.output and f"--init {a} has 8" in r.output, r.output
    assert "Traceback" not in r.output and not d.exists()
    d, r = _train(tmp_path / "d", *base, "--init", str(ROOT / "models" / "stdlib-llama-head"))
    assert r.exit_code != 0 and "config.json" in r.output and "Traceback" not in r.output, r.output
    assert not d.exists()
    other = tmp_path / "other"  # a head made for a target with another vocabulary
    other.mkdir()
    cfg = json.loads((a / "config.json").read_text())
    cfg["transformer_layer_config"]["vocab_size"] = 5000
    (other / "config.json").write_text(json.dumps(cfg))
    (other / "model.safetensors").write_bytes((a / "model.safetensors").read_bytes())
    d, r = _train(tmp_path / "d", *base, "--init", str(other))
    assert r.exit_code != 0 and "field transformer_layer_config.vocab_size: 5000" in r.output, r.output
    assert "Traceback" not in r.output and not d.exists()
