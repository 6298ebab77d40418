"""Pretrained folders and the Hub, offline: a local folder laid out as the Hugging Face cache, HF_HUB_OFFLINE=1.

Nothing here reaches a network: every Hub path resolves from ``models--owner--name/{refs,snapshots}`` folders the
tests write themselves, and a file missing there must be an error, not a download.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from procap.commands.cli import main
from procap.core.errors import ProCapError
from procap.core.hub_files import parse_hub_path
from procap.data import Vocabulary
from procap.loading.hub import load_pretrained
from procap.model.procap import ProCap
from tests.support import small_config

pytest.importorskip("huggingface_hub", reason="the [hub] extra (huggingface_hub) is not installed")

REPO = "someone/procap-tiny"
AUTHORS_FIXTURE = Path(__file__).parent / "convert" / "data" / "clevr_like"


def small_model(seed: int) -> tuple[ProCap, Vocabulary]:
    torch.manual_seed(seed)
    vocab = Vocabulary.build([f"w{i}" for i in range(12)], min_count=1)
    model = ProCap(small_config(vocab_size=len(vocab))).eval()
    return model, vocab


def put_in_hub_cache(cache: Path, repo_id: str, revision: str, files: Path | dict[str, Path]) -> Path:
    """Lay ``files`` (a folder, or repo path -> local file) out as the Hub cache does for ``repo_id`` at the ref
    ``revision``: ``models--owner--name/refs/<revision>`` holds a commit hash, ``snapshots/<hash>/`` the files."""
    commit = hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    sources = {p.name: p for p in files.iterdir()} if isinstance(files, Path) else files
    for name, source in sources.items():
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, snapshot / name)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    return snapshot


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """An empty Hub cache that every lookup reads, with downloads switched off."""
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


@pytest.fixture
def pretrained(tmp_path) -> tuple[ProCap, Vocabulary, Path]:
    model, vocab = small_model(0)
    folder = model.save_pretrained(tmp_path / "tiny", vocab, dataset="clevr-change", metrics={"CIDEr": 123.4})
    return model, vocab, folder


def images(n: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    return torch.rand(n, 3, 16, 16, generator=generator), torch.rand(n, 3, 16, 16, generator=generator)


def test_save_pretrained_writes_the_hub_files_and_loads_back(pretrained):
    model, vocab, folder = pretrained
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "model.safetensors", "vocab.json"]
    config = json.loads((folder / "config.json").read_text())
    assert config["library_name"] == "procap" and config["vocab_size"] == len(vocab)
    assert json.loads((folder / "vocab.json").read_text()) == vocab.to_dict()
    card = (folder / "README.md").read_text()
    assert card.startswith("---\nlicense: mit\nlibrary_name: procap")
    assert "CLEVR-Change (procap's loader `clevr-change`)" in card
    assert "| CIDEr | 123.4 |" in card and "Captioner.from_pretrained" in card

    loaded = ProCap.from_pretrained(folder)
    assert loaded.vocab == vocab
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    before, after = images()
    assert torch.equal(loaded.generate(before, after), model.generate(before, after))
    # The loaded model saves again without being handed its vocabulary, keeping the recorded scores.
    again = loaded.save_pretrained(folder.parent / "again")
    assert "| CIDEr | 123.4 |" in (again / "README.md").read_text()


def test_the_model_alone_loads_a_pretrained_folder(pretrained):
    """``ProCap.from_pretrained`` with only the model imported: the folder format sits below the model, and nothing
    of the levels above it (docs/architecture.md) is loaded on the way."""
    _, vocab, folder = pretrained
    above = (
        "procap.loading.hub",
        "procap.loading.checkpoint",
        "procap.procedure",
        "procap.convert",
        "procap.eval",
        "procap.train",
    )
    above += ("procap.fast", "procap.train.batch_memory", "procap.viz", "procap.commands", "procap.commands.cli")
    script = "\n".join(
        [
            "import sys",
            "from procap.model.procap import ProCap",
            f"model = ProCap.from_pretrained({str(folder)!r})",
            f"above = {above!r}",
            "loaded = sorted(m for m in sys.modules if any(m == a or m.startswith(a + '.') for a in above))",
            "print(len(model.vocab), loaded)",
        ]
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(len(vocab)), "[]"]


def test_a_hand_edited_config_copy_is_refused(pretrained):
    _, _, folder = pretrained
    config = json.loads((folder / "config.json").read_text())
    config["dec_layers"] += 1
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ProCapError, match="dec_layers"):
        ProCap.from_pretrained(folder)


def test_from_pretrained_reads_the_hub_cache_offline_by_repo_id_and_revision(pretrained, offline_hub, tmp_path):
    model, _, folder = pretrained
    other, other_vocab = small_model(1)
    put_in_hub_cache(offline_hub, REPO, "main", folder)
    put_in_hub_cache(offline_hub, REPO, "v1", other.save_pretrained(tmp_path / "v1", other_vocab))
    before, after = images()
    for name in (REPO, f"hf://{REPO}"):
        assert torch.equal(ProCap.from_pretrained(name).generate(before, after), model.generate(before, after))
    weight = "decoder.embed.weight"
    assert torch.equal(ProCap.from_pretrained(f"hf://{REPO}@v1").state_dict()[weight], other.state_dict()[weight])
    assert torch.equal(ProCap.from_pretrained(REPO, revision="v1").state_dict()[weight], other.state_dict()[weight])


def test_a_repo_missing_from_the_cache_is_one_sentence_not_a_download(offline_hub):
    with pytest.raises(ProCapError, match="not in the local Hugging Face cache"):
        ProCap.from_pretrained("nobody/nothing")
    with pytest.raises(ProCapError, match="neither an existing file or folder nor a Hugging Face repo id"):
        ProCap.from_pretrained("no/such/path")


def test_captioner_from_pretrained_matches_the_model(pretrained, offline_hub):
    from procap.fast import Captioner

    model, _, folder = pretrained
    put_in_hub_cache(offline_hub, REPO, "main", folder)
    # On the CPU, where the model is: this test is about loading, and fp32 CUDA kernels may round otherwise.
    captioner = Captioner.from_pretrained(f"hf://{REPO}", max_len=None, dtype="fp32", device="cpu")
    before, after = images(3)
    assert torch.equal(captioner.generate(before, after), model.generate(before, after))
    beams = Captioner.from_pretrained(folder, max_len=None, dtype="fp32", num_beams=3, device="cpu")
    assert torch.equal(beams.generate(before, after), model.generate(before, after, num_beams=3))


def test_cli_takes_a_folder_or_hf_path_wherever_it_takes_a_checkpoint(pretrained, offline_hub, tmp_path, capsys):
    _, _, folder = pretrained
    put_in_hub_cache(offline_hub, REPO, "main", folder)
    paths = []
    for name, image in zip(("before.png", "after.png"), images(1)):
        paths.append(tmp_path / name)
        Image.fromarray((image[0].permute(1, 2, 0) * 255).round().byte().numpy()).save(paths[-1])
    outputs = []
    for ckpt in (str(folder / "model.safetensors"), str(folder), f"hf://{REPO}", f"hf://{REPO}@main"):
        assert main(["caption", "--ckpt", ckpt, "--json", *map(str, paths)]) == 0
        outputs.append(json.loads(capsys.readouterr().out)[0]["caption"])
    assert len(set(outputs)) == 1
    assert main(["caption", "--ckpt", "hf://nobody/nothing", *map(str, paths)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "hf://nobody/nothing" in err[0] and "HF_HUB_OFFLINE" in err[0]


def test_convert_reads_the_authors_files_from_a_hub_path(offline_hub, tmp_path, capsys):
    put_in_hub_cache(
        offline_hub,
        "BlueberryOreo/ProCap",
        "main",
        {
            "clevr/model.chkpt": AUTHORS_FIXTURE / "model.chkpt",
            "cache/clevr_word2idx.json": AUTHORS_FIXTURE / "clevr_word2idx.json",
        },
    )
    out = tmp_path / "clevr_authors.safetensors"
    argv = ["convert", "--from", "authors", "hf://BlueberryOreo/ProCap/clevr/model.chkpt"]
    argv += ["--vocab", "hf://BlueberryOreo/ProCap/cache/clevr_word2idx.json", "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    direct = tmp_path / "direct.safetensors"
    argv = ["convert", "--from", "authors", str(AUTHORS_FIXTURE / "model.chkpt")]
    assert main([*argv, "--vocab", str(AUTHORS_FIXTURE / "clevr_word2idx.json"), "--out", str(direct)]) == 0
    a, b = load_pretrained(out)[0].state_dict(), load_pretrained(direct)[0].state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    capsys.readouterr()
    assert main(["convert", "--from", "authors", "hf://BlueberryOreo/ProCap", "--vocab", "x", "--out", str(out)]) == 2
    assert "names a repo, not a file" in capsys.readouterr().err


def test_push_to_hub_uploads_the_pretrained_files(pretrained, monkeypatch):
    import huggingface_hub

    model, vocab, _ = pretrained
    calls = {}

    class FakeApi:  # records what would be sent; nothing leaves the machine
        def __init__(self, token=None):
            calls["token"] = token

        def create_repo(self, repo_id, private=None, exist_ok=False):
            calls["create"] = (repo_id, private, exist_ok)

        def upload_folder(self, repo_id, folder_path, **options):
            calls["files"] = sorted(p.name for p in Path(folder_path).iterdir())
            calls["card"] = (Path(folder_path) / "README.md").read_text()
            calls["upload"] = (repo_id, options["revision"])
            return type("Commit", (), {"commit_url": f"https://hub.example/{repo_id}/commit/1"})()

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    url = model.push_to_hub(REPO, vocab, token="t0k", private=True, dataset="spot-the-diff")
    assert url.endswith("/commit/1")
    assert calls["create"] == (REPO, True, True) and calls["token"] == "t0k"
    assert calls["files"] == ["README.md", "config.json", "model.safetensors", "vocab.json"]
    assert f"procap caption --ckpt hf://{REPO}" in calls["card"] and "`spot-the-diff`" in calls["card"]
    calls.clear()
    with pytest.raises(ProCapError, match="not a Hugging Face repo id"):
        model.push_to_hub("no-owner", vocab)
    assert calls == {}  # refused before a folder is written or a client made


def test_without_huggingface_hub_the_message_names_the_hub_extra(pretrained, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # as if it were not installed
    with pytest.raises(ProCapError, match=r"\[hub\] extra: pip install 'procap-torch\[hub\]'"):
        ProCap.from_pretrained(REPO)
    _, _, folder = pretrained
    ProCap.from_pretrained(folder)  # local folders need no extra


def test_hub_paths_parse_and_malformed_ones_are_refused():
    parsed = parse_hub_path("hf://owner/repo@v1.0/sub/model.chkpt")
    assert (parsed.repo_id, parsed.revision, parsed.filename) == ("owner/repo", "v1.0", "sub/model.chkpt")
    assert str(parsed) == "hf://owner/repo@v1.0/sub/model.chkpt"
    assert parse_hub_path("runs/best.safetensors") is None
    with pytest.raises(ProCapError, match="hf://owner/repo"):
        parse_hub_path("hf://just-a-name", "--ckpt")


def test_the_card_reads_back_through_huggingface_hubs_model_card(pretrained, tmp_path):
    from huggingface_hub import ModelCard

    model, vocab, folder = pretrained
    card = ModelCard.load(folder / "README.md")
    assert (card.data.license, card.data.library_name, card.data.pipeline_tag) == ("mit", "procap", "image-to-text")
    # A procap loader name is no Hub dataset id, so the Hub's datasets field stays empty; an owner/name id fills it.
    assert card.data.datasets is None
    hub_dataset = model.save_pretrained(tmp_path / "hub-data", vocab, dataset="someone/levir-cc-copy")
    assert ModelCard.load(hub_dataset / "README.md").data.datasets == ["someone/levir-cc-copy"]
    assert "@inproceedings{" in card.text and "Imagine How To Change" in card.text
    assert "pypi.org" not in card.content and "pip install" not in card.content  # not known to be on PyPI


def run_card_snippet(card: str) -> Any:
    """Run the card's one ``python`` block as a reader pasting it would (in the current folder); return the value of
    its last line, an expression."""
    [block] = re.findall(r"^```python\n(.*?)^```$", card, flags=re.DOTALL | re.MULTILINE)
    module = ast.parse(block)
    last = module.body.pop()
    assert isinstance(last, ast.Expr), "the snippet ends with the call whose result a reader sees"
    namespace: dict[str, Any] = {}
    exec(compile(module, "<model card>", "exec"), namespace)  # noqa: S102 - the text procap wrote, under test
    return eval(compile(ast.Expression(last.value), "<model card>", "eval"), namespace)


@pytest.mark.parametrize("published", [False, True], ids=["folder", "hub-repo"])
def test_the_cards_python_snippet_runs_as_written(pretrained, offline_hub, tmp_path, monkeypatch, published):
    """The card's usage snippet, unedited: a folder's card names the folder ``path/to/this/folder`` (made here, under
    the folder the snippet runs in), a published card its repo id (read from the offline Hub cache)."""
    model, vocab, _ = pretrained
    if published:
        folder = model.save_pretrained(tmp_path / "upload", vocab, repo_id=REPO)
        put_in_hub_cache(offline_hub, REPO, "main", folder)
    else:
        folder = model.save_pretrained(tmp_path / "path" / "to" / "this" / "folder", vocab)
    for name, picture in zip(("before.png", "after.png"), images(1), strict=True):
        Image.fromarray((picture[0].permute(1, 2, 0) * 255).to(torch.uint8).numpy()).save(tmp_path / name)
    monkeypatch.chdir(tmp_path)
    caption = run_card_snippet((folder / "README.md").read_text())
    assert isinstance(caption, str) and caption.split()
    assert set(caption.split()) <= set(vocab.to_dict())  # words of the model's vocabulary


def test_the_card_names_the_latent_grid_not_the_token_grid(tmp_path):
    from procap.core.config import get_preset
    from procap.model.pretrained import model_card

    config = get_preset("tiny")
    with torch.device("meta"):  # the card reads sizes only
        model = ProCap(config)
    card = model_card(model, 100, {"license": "mit"})
    side, tokens = config.latent_size, config.grid_size
    assert side == 16 and f"64 px, 16 x 16 VQGAN latents, merged 4 x 4 into {tokens} x {tokens} encoder tokens" in card


def test_the_authors_converted_weights_keep_their_licence(tmp_path):
    from huggingface_hub import ModelCard

    from procap.convert import convert_authors_checkpoint

    model, vocab, info = convert_authors_checkpoint(
        AUTHORS_FIXTURE / "model.chkpt", AUTHORS_FIXTURE / "clevr_word2idx.json"
    )
    model.pretrained_info = info
    folder = model.save_pretrained(tmp_path / "authors", vocab)
    card = ModelCard.load(folder / "README.md")
    assert card.data.license == "other" and card.data.license_link == "https://huggingface.co/BlueberryOreo/ProCap"
    assert "remain\ntheirs and come under their terms" in card.text and "MIT" in card.text
    # Loaded again and saved once more, the weights are still the authors'.
    again = ProCap.from_pretrained(folder).save_pretrained(tmp_path / "again")
    assert ModelCard.load(again / "README.md").data.license == "other"


def test_token_and_force_download_reach_the_hub_client(pretrained, tmp_path, monkeypatch):
    import huggingface_hub

    from procap.fast import Captioner

    _, _, folder = pretrained
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    calls = []

    def fake_snapshot(repo_id, **options):  # stands in for the network: hands back the local folder
        calls.append((repo_id, options["token"], options["force_download"]))
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    ProCap.from_pretrained(REPO, token="secret", force_download=True)
    Captioner.from_pretrained(f"hf://{REPO}", token="secret", device="cpu", dtype="fp32")
    assert calls == [(REPO, "secret", True), (REPO, "secret", False)]


def test_force_download_while_offline_is_refused(offline_hub):
    with pytest.raises(ProCapError, match="force_download asks for a fresh download, but downloads are off"):
        ProCap.from_pretrained(REPO, force_download=True)


def test_cli_hub_flags_and_the_hf_prefix_hint(pretrained, tmp_path, monkeypatch, capsys):
    import huggingface_hub

    _, _, folder = pretrained
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    calls = []

    def fake_snapshot(repo_id, **options):
        calls.append((repo_id, options["token"], options["force_download"]))
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    paths = []
    for name, image in zip(("before.png", "after.png"), images(1)):
        paths.append(tmp_path / name)
        Image.fromarray((image[0].permute(1, 2, 0) * 255).round().byte().numpy()).save(paths[-1])
    argv = ["caption", "--ckpt", f"hf://{REPO}", "--hf-token", "secret", "--force-download", *map(str, paths)]
    assert main(argv) == 0, capsys.readouterr().err
    assert calls == [(REPO, "secret", True)]
    capsys.readouterr()
    # A bare owner/repo on the command line is a local path; when none exists, the message says how to reach the Hub.
    assert main(["caption", "--ckpt", REPO, *map(str, paths)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"write hf://{REPO}" in err[0]
    assert calls == [(REPO, "secret", True)]  # and nothing was fetched


def test_a_huggingface_hub_older_than_the_extra_asks_is_named(offline_hub, monkeypatch):
    import huggingface_hub

    from procap.core.hub_files import MIN_HUB_VERSION

    tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml without a package")

    extras = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    wanted = ".".join(map(str, MIN_HUB_VERSION))
    assert extras["optional-dependencies"]["hub"] == [f"huggingface_hub>={wanted}"]
    monkeypatch.setattr(huggingface_hub, "__version__", "0.24.7")
    with pytest.raises(ProCapError, match=r"needs huggingface_hub >= 0\.25 \(installed: 0\.24\.7\)"):
        ProCap.from_pretrained(REPO)
