"""The GPT's pieces in one process: sizes against the model, the activation estimate against what
autograd saves, the Markov source's exact entropy, the corpus checks and cache, the stream's
sharding, the schedule, the layout choice and generation with a KV cache."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from trainers.errors import UsageError
from trainers.gpt import size
from trainers.gpt.build import build_model
from trainers.gpt.config import GptConfig
from trainers.gpt.data import WindowStream, check_vocab, load_corpus, read_corpus, tokenise, windows
from trainers.gpt.markov import MarkovSource
from trainers.gpt.model import GPT, KVCache, count_parameters, flops_per_token, generate
from trainers.gpt.train import Schedule, plan_layout
from trainers.runtime.dist import DistContext
from trainers.runtime.rundir import single_process_context


# ---- sizes ---------------------------------------------------------------------------------------
def test_d64_is_12_9_billion_parameters_on_the_meta_device_within_1_percent_of_12_L_d2():
    cfg = GptConfig(depth=64)
    with torch.device("meta"):
        model = build_model(cfg)
    n = count_parameters(model)
    shape = size.Shape(64)
    assert (shape.dim, shape.heads) == (4096, 32)
    assert n == shape.parameters()  # the pure formula is exact
    assert abs(n - 12 * 64 * 4096 ** 2) / (12 * 64 * 4096 ** 2) < 0.01 and 12.8e9 < n < 13.0e9
    assert flops_per_token(model) == shape.flops_per_token()
    assert next(model.parameters()).device.type == "meta"  # nothing was allocated


@pytest.mark.parametrize("depth,head_dim,positions,tied", [(3, 32, "rotary", False), (2, 16, "learned", True),
                                                          (20, 128, "rotary", False)])
def test_the_pure_size_formulas_equal_the_model(depth, head_dim, positions, tied):
    with torch.device("meta"):
        model = GPT(67, depth, head_dim, 96, positions, tied)
    shape = size.Shape(depth, head_dim, 67, 96, positions, tied)
    assert count_parameters(model) == shape.parameters()
    assert flops_per_token(model) == shape.flops_per_token()
    assert (model.dim, model.heads) == (shape.dim, shape.heads)


def saved_bytes(model: GPT, batch: int, seq: int) -> int:
    """Bytes autograd saves for the backward (distinct storages, parameters and buffers left out)."""
    skip = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    idx = torch.randint(0, model.vocab_size, (batch, seq))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(idx, idx)
    loss.backward()
    return sum(seen.values())


@pytest.mark.parametrize("depth,head_dim,seq,batch,positions,checkpointing", [
    (2, 32, 64, 4, "rotary", False), (3, 16, 48, 2, "learned", False), (2, 32, 64, 4, "rotary", True),
    (4, 32, 32, 3, "rotary", False)])
def test_the_activation_estimate_is_within_10_percent_of_what_autograd_saves(depth, head_dim, seq, batch, positions,
                                                                            checkpointing):
    torch.manual_seed(0)
    model = GPT(61, depth, head_dim, seq, positions)
    model.checkpoint_blocks = checkpointing
    measured = saved_bytes(model, batch, seq)
    estimate = size.saved_activation_bytes(size.Shape(depth, head_dim, 61, seq, positions), batch * seq,
                                           checkpointing, act_bytes=4)
    assert abs(estimate - measured) / measured < 0.10, (estimate, measured)


class _GPU80:  # torch.cuda.get_device_properties of an 80 GiB GPU
    total_memory = 80 * size.GIB


def test_the_memory_estimate_says_d64_does_not_fit_80gb_with_ddp_and_what_does(monkeypatch):
    """What the training run picks (plan_layout) on 80 GiB GPUs, from the estimate."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _d: _GPU80())
    gpus = lambda world: DistContext(0, 0, world, world, torch.device("cuda", 0), "nccl")  # noqa: E731
    shape, gpu = size.Shape(64), 80 * size.GIB
    ddp = size.memory_per_gpu(shape, "ddp", 8, 4)
    assert ddp.weights + ddp.grads + ddp.optimizer == 16 * shape.parameters()  # ~206 GB before activations
    assert ddp.total > 200e9
    assert size.memory_per_gpu(shape, "fsdp", 8, 4).total > gpu  # activations at batch 4 x 2048 do not fit
    assert plan_layout(GptConfig(depth=64, device_batch_size=4), shape, gpus(8), 2)[:2] == ("fsdp", True)
    chosen = size.memory_per_gpu(shape, "fsdp+ac", 8, 4)
    assert chosen.total < gpu
    assert chosen.weights + chosen.grads + chosen.optimizer == pytest.approx(16 * shape.parameters() / 8, abs=8)
    assert size.largest_batch(shape, "fsdp", 8, gpu) >= 1  # without recomputation: a smaller batch fits
    with pytest.raises(UsageError, match="does not fit"):  # one GPU cannot train it at all
        plan_layout(GptConfig(depth=64, device_batch_size=1), shape, gpus(1), 2)
    # d12 (85M) needs nothing special
    assert plan_layout(GptConfig(depth=12, device_batch_size=8), size.Shape(12), gpus(8), 2)[:2] == ("ddp", False)


def test_auto_layout_follows_the_estimate_and_explicit_choices_are_checked(monkeypatch):
    cpu = single_process_context()
    cfg = GptConfig(depth=2, head_dim=16, seq_len=32, device_batch_size=2)
    assert plan_layout(cfg, size.Shape(2, 16, 8, 32), cpu, 4)[:2] == ("ddp", False)
    with pytest.raises(UsageError, match="--parallel fsdp needs a process group"):
        plan_layout(GptConfig(parallel="fsdp"), size.Shape(2), cpu, 4)

    class Props:  # an 80 GiB GPU
        total_memory = 80 * size.GIB

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _d: Props())
    gpus = DistContext(0, 0, 8, 8, torch.device("cuda", 0), "nccl")
    big = GptConfig(depth=64, device_batch_size=4)
    assert plan_layout(big, size.Shape(64), gpus, 2)[:2] == ("fsdp", True)
    with pytest.raises(UsageError, match="does not fit 80 GiB per GPU with ddp, ddp\\+ac"):
        plan_layout(GptConfig(depth=64, parallel="ddp"), size.Shape(64), gpus, 2)
    with pytest.raises(UsageError, match="does not fit"):
        plan_layout(GptConfig(depth=64, device_batch_size=4, activation_checkpointing="off"), size.Shape(64), gpus, 2)
    assert plan_layout(GptConfig(depth=12, tie_embeddings=True), size.Shape(12), gpus, 2)[0] == "ddp"
    with pytest.raises(UsageError, match="--tie-embeddings works with --parallel ddp only"):
        plan_layout(GptConfig(depth=12, tie_embeddings=True, parallel="fsdp"), size.Shape(12), gpus, 2)


# ---- the Markov source ---------------------------------------------------------------------------
def test_the_entropy_rate_is_exact_in_known_cases_and_matches_a_long_sample():
    iid = MarkovSource(5, 0, 1.0, 3)
    p = iid.transitions()[0]
    assert iid.entropy_rate() == pytest.approx(float(-(p * np.log(p)).sum()), abs=1e-12)
    src = MarkovSource(4, 2, 0.5, 1)
    text = src.generate(200_000)
    assert len(text) == 200_000 and set(text) <= set(src.symbols)
    assert text == src.generate(200_000)  # deterministic for the seed
    x = np.array([src.symbols.index(c) for c in text])
    ctx = x[:-2] * 4 + x[1:-1]
    counts = np.zeros((16, 4))
    np.add.at(counts, (ctx, x[2:]), 1)
    p = counts / counts.sum(1, keepdims=True)
    empirical = -(counts * np.log(np.where(p > 0, p, 1.0))).sum() / counts.sum()
    assert empirical == pytest.approx(src.entropy_rate(), abs=0.01)
    pi = src.stationary()
    assert pi.sum() == pytest.approx(1.0) and pi.min() > 0
    # the window floor lies between the entropy rate and the unconditional entropy, closer for long windows
    assert src.entropy_rate() < src.window_floor(512) < src.window_floor(8) < math.log(4)


# The floor is checked against what the trainer really scores, two ways. Both use the README's
# setting (the default source, --seq-len 64) on the evaluation windows `validation_loss` cuts from
# the validation split: window i is tokens i*64 .. i*64+64, inputs w[:-1], targets w[1:], so the
# first prediction of a window sees one character and the rest see two or more.
FLOOR_SEQ = 64
FLOOR_CHARS = 2_000_000
FLOOR_VAL_FRAC = 0.5  # 1M validation characters: 15,624 windows, a standard error near 0.0005 nats


@pytest.fixture(scope="module")
def floor_corpus(tmp_path_factory):
    src = MarkovSource()
    corpus = load_corpus("synthetic", str(tmp_path_factory.mktemp("cache")), FLOOR_SEQ, FLOOR_VAL_FRAC, src,
                         FLOOR_CHARS, log=lambda _m: None)
    _, val = corpus.split(FLOOR_VAL_FRAC)
    return src, corpus, np.asarray(val)


def symbols_of(src: MarkovSource, vocab: list[str], tokens: np.ndarray) -> np.ndarray:
    """Token ids (ranks among the characters seen) -> the chain's own symbol indices."""
    return np.array([src.symbols.index(c) for c in vocab])[tokens.astype(np.int64)]


def test_the_true_chain_on_the_trainers_evaluation_windows_scores_the_floor_within_its_standard_error(floor_corpus):
    """Monte Carlo, independent of window_floor's algebra: the chain's own transition table (and,
    for the first prediction, P(X2 | X1) from the stationary pair distribution) used as the
    predictor on the real evaluation windows. Its mean loss is the best any model can do there."""
    from trainers.gpt.evaluate import eval_window_count

    src, corpus, val = floor_corpus
    a = src.alphabet_size
    n = eval_window_count(len(val), FLOOR_SEQ, len(val))  # every window of the split
    w = symbols_of(src, corpus.vocab, val[np.arange(n)[:, None] * FLOOR_SEQ + np.arange(FLOOR_SEQ + 1)])
    p = src.transitions()
    pair = src.stationary(p).reshape(a, a)  # P(X1, X2) of the stationary text
    first = -np.log(pair[w[:, 0], w[:, 1]] / pair.sum(axis=1)[w[:, 0]])  # sees one character
    rest = -np.log(p[w[:, :-2] * a + w[:, 1:-1], w[:, 2:]])  # sees two or more (order 2)
    per_window = np.concatenate([first[:, None], rest], axis=1).mean(axis=1)
    mean, se = per_window.mean(), per_window.std(ddof=1) / math.sqrt(n)
    floor = src.window_floor(FLOOR_SEQ)
    assert n > 15_000 and se < 0.001, (n, se)
    assert abs(mean - floor) < 3 * se, (mean, floor, se)
    # the test can tell: the floor that counts a context-free first prediction, H(X1) (the figure once
    # published, 1.5713), lies more than twice the tolerance above what the chain really scores (9 SE)
    context_free = (src.context_entropy(0) + src.context_entropy(1) + (FLOOR_SEQ - 2) * src.entropy_rate()) / FLOOR_SEQ
    assert context_free - mean > 2 * 3 * se, (context_free, mean, se)


def test_the_window_floor_averages_over_the_contexts_the_predictions_have():
    src = MarkovSource(4, 3, 0.5, 1)  # order 3: two predictions see less than a full context
    h0, h1, h2 = src.prefix_entropies()
    rate = src.entropy_rate()
    assert src.window_floor(1) == pytest.approx(h1)  # one prediction, from one character: never H(X1) = h0
    assert src.window_floor(2) == pytest.approx((h1 + h2) / 2)
    assert src.window_floor(10) == pytest.approx((h1 + h2 + 8 * rate) / 10)
    assert MarkovSource(5, 0, 1.0, 3).window_floor(7) == pytest.approx(MarkovSource(5, 0, 1.0, 3).entropy_rate())
    # conditional(m) is the distribution behind each term: its entropy, averaged over the contexts'
    # stationary probabilities, is H(X_{m+1} | X_1..X_m)
    k_grams = src.stationary()
    for m, h in enumerate((h0, h1, h2, rate)):
        q = src.conditional(m)
        context_p = k_grams.reshape(4 ** min(m, 3), -1).sum(axis=1) if m < 3 else k_grams
        assert np.allclose(q.sum(axis=1), 1.0)
        assert float(context_p @ -(q * np.log(q)).sum(axis=1)) == pytest.approx(h)


class TrueChain(torch.nn.Module):
    """A perfect model: logits are the chain's true conditional log-probabilities given what each
    position sees (one character at the first position, the last two after; order 2)."""

    def __init__(self, src: MarkovSource, vocab: list[str]):
        super().__init__()
        assert src.order == 2
        symbol = torch.tensor([src.symbols.index(c) for c in vocab])
        self.register_buffer("symbol", symbol)
        # columns in vocabulary order: logit of token t = log P(symbol of t)
        self.register_buffer("first", torch.from_numpy(np.log(src.conditional(1)))[:, symbol])
        self.register_buffer("rest", torch.from_numpy(np.log(src.conditional(2)))[:, symbol])
        self.a = src.alphabet_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.symbol[x]
        return torch.cat([self.first[s[:, :1]], self.rest[s[:, :-1] * self.a + s[:, 1:]]], dim=1).float()


def test_a_perfect_model_has_no_gap_to_the_floor(floor_corpus):
    """The trainer's own evaluation (validation_loss, summarise) of a model that knows the chain:
    its gap to the floor is zero within the sample's noise, not positive."""
    from trainers.gpt.evaluate import summarise, validation_loss
    from trainers.runtime.precision import precision_for

    src, corpus, val = floor_corpus
    ctx = single_process_context()
    result = validation_loss(TrueChain(src, corpus.vocab), torch.from_numpy(val.astype(np.int64)), FLOOR_SEQ,
                             len(val), 1024, ctx, precision_for(ctx.device), torch.from_numpy(corpus.utf8_bytes))
    assert result["tokens"] == (len(val) - 1) // FLOOR_SEQ * FLOOR_SEQ
    gap = summarise(result, {}, corpus.floor, None)["gap_to_floor_nats"]
    # stated tolerance: 0.003 nats, 4 standard errors of this 1M-prediction sample (the test above
    # measures 0.0005-0.0008); the context-free floor would put this gap at -0.008
    assert abs(gap) < 0.003, (result["loss"], corpus.floor)


# ---- corpus --------------------------------------------------------------------------------------
def test_bad_corpora_are_refused_in_one_line_naming_the_problem(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(UsageError, match="is empty"):
        read_corpus(empty)
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\u00e9\nna\u00efve\n".encode("latin-1"))
    with pytest.raises(UsageError, match=r"not UTF-8 text: byte 0xe9 at offset 3 \(line 1, column 4\)"):
        read_corpus(latin)
    folder = tmp_path / "books"
    folder.mkdir()
    (folder / "a.txt").write_text("hello")
    (folder / "b.txt").write_bytes(b"")
    (folder / ".hidden").write_bytes(b"\xff")
    data, files, skipped = read_corpus(folder)
    assert data == b"hello" and skipped == [str(folder / "b.txt")]
    short = tmp_path / "short.txt"
    short.write_text("abc" * 20)
    with pytest.raises(UsageError, match="too short for two blocks of --seq-len 64"):
        load_corpus(str(short), str(tmp_path / "cache"), 64, 0.1, MarkovSource(), 10)
    assert not (tmp_path / "cache").exists()  # nothing written
    with pytest.raises(UsageError, match="another vocabulary .*new: 'z'.*gone: 'a'"):
        check_vocab(["a", "b"], ["b", "z"], tmp_path)


def test_tokenising_sorts_the_characters_seen_and_the_cache_is_reused(tmp_path):
    tokens, vocab = tokenise("héllo wörld\n".encode())
    assert vocab == sorted(set("héllo wörld\n")) and "".join(vocab[t] for t in tokens) == "héllo wörld\n"
    corpus_file = tmp_path / "c.txt"
    corpus_file.write_text("the quick brown fox jumps over the lazy dog\n" * 50)
    first = load_corpus(str(corpus_file), str(tmp_path / "cache"), 16, 0.1, MarkovSource(), 10)
    expected = np.array(first.tokens)
    folder = tmp_path / "cache" / first.fingerprint
    assert (folder / "tokens.bin").stat().st_size == len(first.tokens) and isinstance(first.tokens, np.memmap)
    stamp = (folder / "tokens.bin").stat().st_mtime_ns
    again = load_corpus(str(corpus_file), str(tmp_path / "cache"), 16, 0.1, MarkovSource(), 10)
    assert (folder / "tokens.bin").stat().st_mtime_ns == stamp and np.array_equal(again.tokens, first.tokens)
    (folder / "tokens.bin").write_bytes(b"\0" * len(first.tokens))  # damaged: rebuilt, not trusted
    (tmp_path / "cache" / f".{first.fingerprint}.x1.building").mkdir()  # left by a killed builder: removed
    rebuilt = load_corpus(str(corpus_file), str(tmp_path / "cache"), 16, 0.1, MarkovSource(), 10)
    assert np.array_equal(np.asarray(rebuilt.tokens), expected)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [f".{first.fingerprint}.lock", first.fingerprint]
    train, val = rebuilt.split(0.1)
    assert len(val) == round(len(expected) * 0.1) and np.array_equal(np.concatenate([train, val]), expected)


# ---- the stream ----------------------------------------------------------------------------------
@pytest.mark.parametrize("world,per_rank", [(1, 3), (2, 4), (3, 2)])
def test_no_window_is_read_twice_in_a_pass_across_ranks_and_each_rank_resumes_where_it_was(world, per_rank):
    n, seq = 5_000, 32
    for pass_index in (0, 1):
        streams = [WindowStream(n, seq, world, r, per_rank, seed=7, pass_index=pass_index) for r in range(world)]
        starts = torch.cat([s.starts.reshape(-1) for s in streams])
        assert len(starts) == len(set(starts.tolist())), "a window read twice in one pass"
        offsets = (starts - streams[0].offset) % seq
        assert (offsets == 0).all() and starts.min() >= 0 and (starts + seq + 1 <= n).all()
        assert len(starts) == streams[0].steps_per_pass * world * per_rank
        assert len(starts) > (n - seq) // seq - world * per_rank  # at most one step's worth left out
    a = WindowStream(n, seq, world, world - 1, per_rank, seed=7)
    seen = []
    for _ in range(a.steps_per_pass + 3):  # into the second pass
        seen.append(a.batch().clone())
        a.advance()
    b = WindowStream(n, seq, world, world - 1, per_rank, seed=7)
    for _ in range(5):
        b.advance()
    resumed = WindowStream(n, seq, world, world - 1, per_rank, seed=7,
                           **WindowStream.start(b.position(), None))
    assert torch.equal(resumed.batch(), seen[5])
    fresh = WindowStream(n, seq, world, 0, per_rank, seed=7, **WindowStream.start(None, {"pass": 3, "step_in_pass": 9}))
    assert (fresh.pass_index, fresh.step_in_pass) == (4, 0)  # a changed world size starts the next pass
    x, y = windows(torch.arange(n), a.batch(), seq)
    assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(y[:, -1] - x[:, 0], torch.full((per_rank,), seq))


# ---- schedule ------------------------------------------------------------------------------------
def test_the_schedule_warms_up_holds_and_decays_by_steps_or_by_the_budget():
    wsd = Schedule("wsd", 10, 110, 0.2, 0.0)
    assert wsd.factor(0) == pytest.approx(0.1) and wsd.factor(9) == 1.0 and wsd.factor(85) == 1.0
    assert wsd.factor(100) == pytest.approx(0.5) and wsd.factor(110) == 0.0
    cosine = Schedule("cosine", 0, 100, 0.2, 0.1)
    assert cosine.factor(0) == 1.0 and cosine.factor(50) == pytest.approx(0.55) and cosine.factor(100) == 0.1
    by_time = Schedule("wsd", 10, None, 0.2, 0.0)
    assert by_time.factor(5000) == 1.0
    by_time.budget_progress = 0.9
    assert by_time.factor(5000) == pytest.approx(0.5)
    resumed = Schedule("wsd", 10, None, 0.2, 0.0)
    resumed.load_state_dict(by_time.state_dict())
    assert resumed.factor(5000) == by_time.factor(5000)


# ---- generation ----------------------------------------------------------------------------------
@pytest.mark.parametrize("positions", ["rotary", "learned"])
def test_the_kv_cache_gives_the_logits_of_the_full_forward(positions):
    torch.manual_seed(0)
    model = GPT(11, 2, 16, 24, positions).eval()
    tokens = torch.randint(0, 11, (1, 24))
    with torch.no_grad():
        full = model(tokens)
        cache = KVCache(model.depth, model.seq_len)
        step = [model(tokens[:, :10], cache=cache)[0, -1]]
        for t in range(10, 24):
            step.append(model(tokens[:, t:t + 1], cache=cache)[0, -1])
    assert torch.allclose(step[0], full[0, 9], atol=1e-5)
    assert torch.allclose(torch.stack(step[1:]), full[0, 10:], atol=1e-5)
    # greedy generation with the cache equals argmax over full forwards while the context fits, and
    # goes on past the model's length (the cache restarts from the last half)
    prompt = [1, 2, 3]
    cached = list(generate(model, prompt, 40, temperature=0))
    context = list(prompt)
    for _ in range(21):
        with torch.no_grad():
            context.append(int(model(torch.tensor([context]))[0, -1].argmax()))
    assert cached[:21] == context[3:] and len(cached) == 40
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert list(generate(model, prompt, 30, 1.0, 4, g1)) == list(generate(model, prompt, 30, 1.0, 4, g2))


# ---- options that change the run -------------------------------------------------------------------
def test_tied_embeddings_learned_positions_cosine_and_recomputation_train_and_load_back(tmp_path, monkeypatch):
    """One process, a few steps: the other model and schedule options train, checkpoint and load for
    sampling (a tied embedding is one parameter in training and after loading)."""
    from conftest import GPT_TINY, read_results
    from trainers.cli import main
    from trainers.gpt.infer import load_for_inference

    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    assert main(["gpt", "train", *GPT_TINY, "--batch-tokens", "512", "--max-tokens", "3000", "--tie-embeddings",
                 "--positions", "learned", "--schedule", "cosine", "--activation-checkpointing", "on",
                 "--save-every-min", "30", "--eval-every", "3", "--run-dir", str(run_dir)]) == 0
    r = read_results(run_dir)
    assert r["training"]["steps"] == 6 and r["training"]["total_steps"] == 6  # ceil(3000 / 512)
    assert r["training"]["activation_checkpointing"] is True and r["config"]["ckpt_every_min"] == 30
    assert r["model"]["parameters"] == size.Shape(1, 16, 8, 32, "learned", True).parameters()
    loaded = load_for_inference(run_dir, "best", "cpu")
    assert loaded.model.lm_head.weight is loaded.model.wte.weight and loaded.model.wpe is not None


def test_compile_is_applied_per_block_and_an_end_is_required(tmp_path):
    from trainers.gpt.train import total_steps_of, wrap
    from trainers.runtime.precision import precision_for

    model = GPT(8, 2, 16, 32)
    wrap(model, "ddp", False, True, single_process_context(), precision_for(torch.device("cpu")))
    assert all(block._compiled_call_impl is not None for block in model.blocks)  # block.compile() took
    assert total_steps_of(GptConfig(max_steps=10, max_tokens=5 * 524_288)) == 5
    assert total_steps_of(GptConfig(max_hours=1.0)) is None
    with pytest.raises(UsageError, match="give the run an end"):
        GptConfig().check_end()
    with pytest.raises(UsageError, match="not a multiple of 2 rank"):
        GptConfig(batch_tokens=3000, device_batch_size=1, seq_len=1000).grad_accum(2)


def test_size_command_says_what_fits(capsys):
    from trainers.cli import main

    assert main(["gpt", "size", "--depth", "64", "--world-size", "8", "--device-batch-size", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert 12.8e9 < out["parameters"] < 13e9 and [r["fits"] for r in out["layouts"]] == [False, False, True]
    assert main(["gpt", "size", "--depth", "64", "--world-size", "1", "--require-fit"]) == 2
    assert "does not fit 80 GiB per GPU on 1 GPU(s)" in capsys.readouterr().err
