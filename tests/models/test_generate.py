"""`python -m infinitrain.generate`: from a training checkpoint (the model it records rebuilt), a
transformers folder and an llm.c file, through the models' own sampler; greedy decoding equals
transformers' greedy generation from the same weights; bad input is one line."""
import dataclasses
import re

import pytest

import infinitrain as it
from infinitrain.checkpoint import save_checkpoint
from infinitrain.data.text import gpt2_tokenizer
from infinitrain.generate import main
from infinitrain.models import gpt2, llama3

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def tiny():
    it.manual_seed(3)
    return gpt2("tiny")


def _checkpoint(model, root):
    """A checkpoint as the training examples' --save writes it: the model recorded in extra."""
    return save_checkpoint(root, 1, model, extra={"model": {"class": type(model).__name__,
                                                            "config": dataclasses.asdict(model.config)}})


def _greedy(model, n: int) -> str:
    enc = gpt2_tokenizer()
    ids = [50256] + enc.encode(PROMPT)
    out = model.generate(it.tensor([ids]), n, temperature=0).numpy()[0]
    return PROMPT + enc.decode(out[len(ids):])


def test_generate_from_a_checkpoint_greedy_and_sampled(tiny, tmp_path, capsys):
    _checkpoint(tiny, tmp_path / "ck")
    assert main(["--load", str(tmp_path / "ck"), "--prompt", PROMPT, "--max_new_tokens", "6",
                 "--temperature", "0"]) == 0
    assert capsys.readouterr().out == _greedy(tiny, 6) + "\n"
    flags = ["--load", str(tmp_path / "ck"), "--prompt", PROMPT, "--max_new_tokens", "5", "--top_k", "20",
             "--temperature", "0.8", "--num_samples", "2"]
    main(flags + ["--seed", "7"])
    first = capsys.readouterr().out
    main(flags + ["--seed", "7"])
    assert capsys.readouterr().out == first  # the seed decides
    samples = re.split(r"---- sample \d ----\n", first)[1:]
    assert len(samples) == 2 and all(s.startswith(PROMPT) for s in samples)


def test_generate_from_a_llama_checkpoint(tmp_path, capsys):
    """The class the checkpoint records is the one rebuilt (LLaMA-3 tiny, GPT-2's vocabulary)."""
    it.manual_seed(4)
    model = llama3("tiny")
    _checkpoint(model, tmp_path / "ck")
    main(["--load", str(tmp_path / "ck" / "step_000001"), "--prompt", PROMPT, "--max_new_tokens", "4",
          "--temperature", "0"])
    assert capsys.readouterr().out == _greedy(model, 4) + "\n"


def test_generate_from_an_llmc_file(tiny, tmp_path, capsys):
    tiny.save_llmc(tmp_path / "m.bin")
    main(["--llmc_filepath", str(tmp_path / "m.bin"), "--prompt", PROMPT, "--max_new_tokens", "4",
          "--temperature", "0"])
    assert capsys.readouterr().out == _greedy(tiny, 4) + "\n"


@pytest.mark.slow
def test_greedy_generation_equals_transformers(tiny, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tiny.save_pretrained(tmp_path / "hf")
    main(["--from_pretrained", str(tmp_path / "hf"), "--prompt", PROMPT, "--max_new_tokens", "12",
          "--temperature", "0"])
    ours = capsys.readouterr().out
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    enc = gpt2_tokenizer()
    ids = [50256] + enc.encode(PROMPT)
    with torch.no_grad():
        theirs = hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, pad_token_id=50256,
                             attention_mask=torch.ones(1, len(ids), dtype=torch.long))[0].tolist()
    assert ours == PROMPT + enc.decode(theirs[len(ids):]) + "\n"


@pytest.mark.parametrize("flags,message", [
    ([], r"name the model: --load DIR, --from_pretrained DIR or --llmc_filepath FILE"),
    (["--load", "{tmp}/nowhere"], r"generate: .*nowhere holds no checkpoint"),
    (["--from_pretrained", "{tmp}/nowhere"], r"generate: transformers config .*nowhere/config\.json does not exist"),
    (["--load", "{tmp}/ck", "--max_new_tokens", "300"],
     r"generate: the prompt's 5 tokens \(with the delimiter\) and --max_new_tokens 300 exceed the model's block "
     r"size 256"),
    (["--load", "{tmp}/ck", "--temperature", "-1"], r"--temperature -1.0 must be a finite number >= 0"),
    (["--load", "{tmp}/ck", "--tokenizer", "llama3"], r"generate: LLaMA-3's tokenizer is not downloaded at run time"),
])
def test_bad_input_is_one_line(tiny, tmp_path, capsys, flags, message):
    _checkpoint(tiny, tmp_path / "ck")
    with pytest.raises(SystemExit) as e:
        main([f.format(tmp=tmp_path) for f in flags] + ["--prompt", PROMPT])
    said = str(e.value.code) if e.value.code != 2 else capsys.readouterr().err.strip().splitlines()[-1]
    assert "\n" not in said and re.search(message, said), said


def test_a_decode_only_llmc_tokenizer_takes_no_prompt(tiny, tmp_path, capsys):
    from infinitrain.data import write_tokenizer
    enc = gpt2_tokenizer()
    write_tokenizer(tmp_path / "tok.bin", enc.token_bytes(), 50256)
    _checkpoint(tiny, tmp_path / "ck")
    main(["--load", str(tmp_path / "ck"), "--tokenizer", str(tmp_path / "tok.bin"), "--max_new_tokens", "3"])
    assert capsys.readouterr().out.strip()  # three tokens' text (maybe whitespace alone)
    with pytest.raises(SystemExit, match="only decodes: give no --prompt"):
        main(["--load", str(tmp_path / "ck"), "--tokenizer", str(tmp_path / "tok.bin"), "--prompt", "hi"])
